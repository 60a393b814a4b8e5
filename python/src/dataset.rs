//! `tenplan.DatasetState`.

use pyo3::prelude::*;
use tenplan_ptc::{DatasetFields, DatasetState};

use crate::error::layout_error;

/// Where a job is in its dataset: the seed of the global sample order,
/// the samples consumed, and the global batch. The sequence of global
/// batches is the same whatever the data-parallel degree, so a job that
/// changes it neither skips nor repeats a sample.
#[pyclass(module = "tenplan._tenplan", name = "DatasetState", frozen)]
pub struct PyDatasetState {
    pub(crate) inner: DatasetState,
}

#[pymethods]
impl PyDatasetState {
    #[new]
    #[pyo3(signature = (dataset_size, global_batch, *, seed = 0, consumed = 0))]
    fn new(py: Python<'_>, dataset_size: u64, global_batch: u64, seed: u64, consumed: u64) -> PyResult<Self> {
        let inner = DatasetState::new(DatasetFields {
            dataset_size,
            seed,
            consumed,
            global_batch,
        })
        .map_err(|e| layout_error(py, e))?;
        Ok(PyDatasetState { inner })
    }

    /// Samples consumed so far.
    #[getter]
    fn consumed(&self) -> u64 {
        self.inner.fields().consumed
    }

    /// Samples per step over all data-parallel ranks.
    #[getter]
    fn global_batch(&self) -> u64 {
        self.inner.fields().global_batch
    }

    /// The sample indices data-parallel rank `rank` of `dp` reads in the
    /// next step (its contiguous share of the global batch).
    fn samples(&self, py: Python<'_>, dp: u64, rank: u64) -> PyResult<Vec<u64>> {
        let (a, b) = self.inner.share(dp, rank).map_err(|e| layout_error(py, e))?;
        let base = self.inner.fields().consumed;
        Ok((base + a..base + b).map(|p| self.inner.sample_at(p)).collect())
    }

    /// The samples of the next `steps` global batches.
    fn global_batches(&self, py: Python<'_>, steps: u64) -> PyResult<Vec<Vec<u64>>> {
        self.inner.global_batches(steps).map_err(|e| layout_error(py, e))
    }

    /// The state after `steps` steps.
    #[pyo3(signature = (steps = 1))]
    fn advance(&self, py: Python<'_>, steps: u64) -> PyResult<Self> {
        let inner = self.inner.advance(steps).map_err(|e| layout_error(py, e))?;
        Ok(PyDatasetState { inner })
    }

    /// The state as JSON (what a checkpoint manifest keeps).
    fn to_json(&self) -> String {
        serde_json::to_string(&self.inner).expect("states serialise")
    }

    /// A state from JSON.
    #[staticmethod]
    fn from_json(py: Python<'_>, text: &str) -> PyResult<Self> {
        let inner = serde_json::from_str(text).map_err(|e| layout_error(py, format!("not a dataset state: {e}")))?;
        Ok(PyDatasetState { inner })
    }

    fn __eq__(&self, other: &PyDatasetState) -> bool {
        self.inner == other.inner
    }

    fn __repr__(&self) -> String {
        let f = self.inner.fields();
        format!(
            "DatasetState(dataset_size={}, global_batch={}, seed={}, consumed={})",
            f.dataset_size, f.global_batch, f.seed, f.consumed
        )
    }
}
