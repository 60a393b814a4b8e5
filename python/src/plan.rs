//! `tenplan.Plan`.

use std::sync::Arc;

use pyo3::prelude::*;
use tenplan_ptc::Plan;

use crate::conversion::to_py;
use crate::error::layout_error;
use crate::problem::PyProblem;

/// A plan: the copies and zero-fills that turn the source state into the
/// target state, with its problem. It proves nothing until `verify` accepts it.
#[pyclass(module = "tenplan._tenplan", name = "Plan", frozen)]
pub struct PyPlan {
    pub(crate) inner: Arc<Plan>,
}

#[pymethods]
impl PyPlan {
    /// A plan file (docs/plan-format.md).
    #[staticmethod]
    fn from_json(py: Python<'_>, text: &str) -> PyResult<Self> {
        let p = Plan::from_json(text).map_err(|e| layout_error(py, e))?;
        Ok(PyPlan { inner: Arc::new(p) })
    }

    /// The plan file.
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    /// The planner that made it.
    #[getter]
    fn planner(&self) -> String {
        self.inner.planner.clone()
    }

    /// Its problem.
    #[getter]
    fn problem(&self) -> PyProblem {
        PyProblem {
            inner: Arc::new(self.inner.problem.clone()),
        }
    }

    /// The copies, as dicts (src, dst, via, tensor, box, buffer, offset, ...).
    fn copies(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &self.inner.copies)
    }

    fn __len__(&self) -> usize {
        self.inner.copies.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "Plan(planner='{}', {} copies, {} fills)",
            self.inner.planner,
            self.inner.copies.len(),
            self.inner.fills.len()
        )
    }
}
