//! `tenplan.Cluster`.

use pyo3::prelude::*;
use tenplan_ptc::{Cluster, DeviceId};

use crate::error::layout_error;

/// A cluster: `NODESxGPUS`, a preset (`dgx-h100:4`, `dgx-h100-rail:64`,
/// `gb200-nvl72:2`, ...) or a topology file (`FILE.json`).
#[pyclass(module = "tenplan._tenplan", name = "Cluster", frozen)]
#[derive(Clone)]
pub struct PyCluster {
    pub(crate) inner: Cluster,
}

#[pymethods]
impl PyCluster {
    #[new]
    fn new(py: Python<'_>, spec: &str) -> PyResult<Self> {
        let inner = Cluster::open(spec).map_err(|e| layout_error(py, e))?;
        Ok(PyCluster { inner })
    }

    /// Its name.
    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_string()
    }

    /// Nodes.
    #[getter]
    fn nodes(&self) -> u32 {
        self.inner.nodes()
    }

    /// Devices per node.
    #[getter]
    fn gpus_per_node(&self) -> u32 {
        self.inner.gpus_per_node()
    }

    /// Devices in all.
    #[getter]
    fn num_devices(&self) -> u32 {
        self.inner.num_devices()
    }

    /// The same cluster with these devices dead.
    fn with_dead(&self, py: Python<'_>, dead: Vec<DeviceId>) -> PyResult<Self> {
        let inner = self.inner.with_dead(dead).map_err(|e| layout_error(py, e))?;
        Ok(PyCluster { inner })
    }

    /// Its shape and fabric in a few lines.
    fn summary(&self) -> String {
        tenplan_application::fabric_summary(&self.inner)
    }

    fn __repr__(&self) -> String {
        format!("Cluster('{}', {} devices)", self.inner.name(), self.inner.num_devices())
    }
}

/// The cluster a layout of `devices` devices runs on when none is named:
/// enough DGX-H100 nodes (the default of every operation).
#[pyfunction]
pub fn default_cluster(py: Python<'_>, devices: u32) -> PyResult<PyCluster> {
    let inner = tenplan_application::default_cluster(devices).map_err(|e| layout_error(py, e))?;
    Ok(PyCluster { inner })
}
