//! `tenplan.Model`.

use std::sync::Arc;

use pyo3::prelude::*;
use tenplan_models::{resolve, to_hf_config, ModelSpec, ModelState, ParallelConfig, StateKind};
use tenplan_ptc::DType;

use crate::conversion::{json_value, state_kind};
use crate::error::layout_error;
use crate::layout::PyLayout;

/// A model: from the catalog by name, or from a Hugging Face `config.json`
/// (a file, or a model directory holding one).
#[pyclass(module = "tenplan._tenplan", name = "Model", frozen)]
pub struct PyModel {
    pub(crate) spec: ModelSpec,
}

#[pymethods]
impl PyModel {
    #[new]
    fn new(py: Python<'_>, model: &str) -> PyResult<Self> {
        let spec = resolve(model).map_err(|e| layout_error(py, e))?;
        Ok(PyModel { spec })
    }

    /// The model's name.
    #[getter]
    fn name(&self) -> String {
        self.spec.name.to_string()
    }

    /// Number of parameters.
    fn parameters(&self) -> u64 {
        ModelState::new(&self.spec, StateKind::Weights(DType::BF16)).parameter_count()
    }

    /// The layout of the model's state under a parallel configuration
    /// (`"tp=4,pp=2,dp=2,zero=1"`, keys tp, pp, dp, ep, zero,
    /// devices=A-B, split=A:B:..). `state` is `training` (bf16 weights, fp32
    /// master weights, Adam moments), `weights` (bf16), `weights:DTYPE` or
    /// `weights+grads`.
    #[pyo3(signature = (config, state = "training"))]
    fn layout(&self, py: Python<'_>, config: &str, state: &str) -> PyResult<PyLayout> {
        let kind = state_kind(py, state)?;
        let cfg: ParallelConfig = config.parse().map_err(|e| layout_error(py, e))?;
        let st = ModelState::new(&self.spec, kind);
        let layout = py.detach(|| st.layout(&cfg)).map_err(|e| layout_error(py, e))?;
        Ok(PyLayout {
            inner: Arc::new(layout),
        })
    }

    /// The weights as inference engines serve them (`"tp=4,dp=2,devices=8-15"`:
    /// tp ranks per engine, dp engine replicas): each rank's fused QKV as
    /// `[q; k; v]`, key/value heads replicated when tp exceeds them (see
    /// docs/serving-layouts.md). The target of a weight sync from a
    /// training layout of the same model and `state` (`weights` or
    /// `weights:DTYPE`).
    #[pyo3(signature = (config, state = "weights"))]
    fn serving_layout(&self, py: Python<'_>, config: &str, state: &str) -> PyResult<PyLayout> {
        let kind = state_kind(py, state)?;
        let cfg: ParallelConfig = config.parse().map_err(|e| layout_error(py, e))?;
        let st = ModelState::new(&self.spec, kind);
        let layout = py.detach(|| st.serving_layout(&cfg)).map_err(|e| layout_error(py, e))?;
        Ok(PyLayout {
            inner: Arc::new(layout),
        })
    }

    /// The model's Hugging Face `config.json`, as a dict.
    fn hf_config(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let v = to_hf_config(&self.spec).map_err(|e| layout_error(py, e))?;
        json_value(py, &v)
    }

    fn __repr__(&self) -> String {
        format!("Model('{}')", self.spec.name)
    }
}
