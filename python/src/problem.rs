//! `tenplan.Problem`.

use std::sync::Arc;

use pyo3::prelude::*;
use tenplan_ptc::{Forwarding, Problem};

use crate::cluster::PyCluster;
use crate::error::layout_error;
use crate::layout::PyLayout;

/// A reconfiguration problem: a source layout, a target layout, a cluster.
#[pyclass(module = "tenplan._tenplan", name = "Problem", frozen)]
pub struct PyProblem {
    pub(crate) inner: Arc<Problem>,
}

#[pymethods]
impl PyProblem {
    /// `forwarding`: where a multicast's destination may forward what it
    /// receives, `"node"` (its own node) or `"cluster"` (anywhere: broadcast
    /// trees among the receivers; docs/problem-format.md).
    #[new]
    #[pyo3(signature = (source, target, cluster, forwarding = "node"))]
    fn new(
        py: Python<'_>,
        source: &PyLayout,
        target: &PyLayout,
        cluster: &PyCluster,
        forwarding: &str,
    ) -> PyResult<Self> {
        let forwarding = match forwarding {
            "node" => Forwarding::Node,
            "cluster" => Forwarding::Cluster,
            other => {
                return Err(layout_error(
                    py,
                    format!("forwarding `{other}` is neither `node` nor `cluster`"),
                ))
            }
        };
        let p = Problem::new((*source.inner).clone(), (*target.inner).clone(), cluster.inner.clone())
            .map_err(|e| layout_error(py, e))?
            .with_forwarding(forwarding);
        Ok(PyProblem { inner: Arc::new(p) })
    }

    /// Where a multicast's destination may forward: `"node"` or `"cluster"`.
    #[getter]
    fn forwarding(&self) -> &'static str {
        match self.inner.forwarding() {
            Forwarding::Node => "node",
            Forwarding::Cluster => "cluster",
        }
    }

    /// A problem file (docs/problem-format.md).
    #[staticmethod]
    fn from_json(py: Python<'_>, text: &str) -> PyResult<Self> {
        let p = Problem::from_json(text).map_err(|e| layout_error(py, e))?;
        Ok(PyProblem { inner: Arc::new(p) })
    }

    /// The problem file.
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    /// The source layout.
    #[getter]
    fn source(&self) -> PyLayout {
        PyLayout {
            inner: Arc::new(self.inner.source().clone()),
        }
    }

    /// The target layout.
    #[getter]
    fn target(&self) -> PyLayout {
        PyLayout {
            inner: Arc::new(self.inner.target().clone()),
        }
    }

    /// The cluster.
    #[getter]
    fn cluster(&self) -> PyCluster {
        PyCluster {
            inner: self.inner.cluster().clone(),
        }
    }
}
