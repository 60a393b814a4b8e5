//! `tenplan.Layout`.

use std::sync::Arc;

use pyo3::prelude::*;
use serde::{Deserialize, Serialize};
use tenplan_ptc::{DeviceId, Layout, Shard, TensorSpec};

use crate::conversion::to_py;
use crate::error::layout_error;

#[derive(Serialize)]
struct LayoutRef<'a> {
    tensors: &'a [TensorSpec],
    shards: &'a [Shard],
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LayoutDoc {
    tensors: Vec<TensorSpec>,
    shards: Vec<Shard>,
}

/// Where every sub-tensor of every tensor lives: tensors, and shards (each
/// on one or more devices) of buffers holding pieces. A `Layout` that
/// exists is valid (its pieces tile every tensor exactly).
#[pyclass(module = "tenplan._tenplan", name = "Layout", frozen)]
pub struct PyLayout {
    pub(crate) inner: Arc<Layout>,
}

#[pymethods]
impl PyLayout {
    /// A layout from JSON: `{"tensors": [{"name", "dtype", "shape"}...],
    /// "shards": [{"name", "devices", "buffers": [{"name", "dtype", "len",
    /// "pieces": [{"tensor", "box": [[lo, hi]...], "offset"}]}]}]}`.
    #[staticmethod]
    fn from_json(py: Python<'_>, text: &str) -> PyResult<Self> {
        let doc: LayoutDoc = serde_json::from_str(text).map_err(|e| layout_error(py, format!("not a layout: {e}")))?;
        let layout = Layout::new(doc.tensors.into(), doc.shards).map_err(|e| layout_error(py, e))?;
        Ok(PyLayout {
            inner: Arc::new(layout),
        })
    }

    /// The layout as JSON (what `from_json` reads).
    fn to_json(&self) -> String {
        serde_json::to_string(&LayoutRef {
            tensors: self.inner.tensors(),
            shards: self.inner.shards(),
        })
        .expect("layouts serialise")
    }

    /// The devices holding state, in order.
    fn devices(&self) -> Vec<DeviceId> {
        self.inner.devices().collect()
    }

    /// The tensors: dicts of name, dtype and shape.
    fn tensors(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &**self.inner.tensors())
    }

    /// The shard a device holds (name, devices, buffers with their
    /// pieces), or None.
    fn shard(&self, py: Python<'_>, device: DeviceId) -> PyResult<Py<PyAny>> {
        match self.inner.shard_of(device) {
            Some(s) => to_py(py, s),
            None => Ok(py.None()),
        }
    }

    /// Bytes a device holds.
    fn device_bytes(&self, device: DeviceId) -> u64 {
        self.inner.device_bytes(device)
    }

    fn __eq__(&self, other: &PyLayout) -> bool {
        self.inner == other.inner
    }

    fn __repr__(&self) -> String {
        format!(
            "Layout({} tensors, {} shards, {} devices)",
            self.inner.tensors().len(),
            self.inner.shards().len(),
            self.inner.devices().count()
        )
    }
}
