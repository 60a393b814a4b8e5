//! The Python face of tenplan (`tenplan._tenplan`, wrapped by the `tenplan`
//! package): it adapts and converts, nothing else. One module per Python
//! class ([`model`], [`layout`], [`cluster`], [`problem`], [`plan`],
//! [`dataset`], [`copies`]), the functions ([`functions`]: each one call of the
//! application layer, with the GIL released while it works), the
//! conversions ([`conversion`]) and the exceptions ([`error`], carrying the
//! typed fields: an infeasible problem lists its missing boxes). Caches
//! and orchestration live in `tenplan_application`.
#![deny(missing_docs)]

pub mod cluster;
pub mod conversion;
pub mod copies;
pub mod dataset;
pub mod error;
pub mod functions;
pub mod layout;
pub mod model;
pub mod plan;
pub mod problem;

use pyo3::prelude::*;

/// The tenplan Python module.
#[pymodule]
fn _tenplan(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<model::PyModel>()?;
    m.add_class::<layout::PyLayout>()?;
    m.add_class::<cluster::PyCluster>()?;
    m.add_class::<problem::PyProblem>()?;
    m.add_class::<plan::PyPlan>()?;
    m.add_class::<dataset::PyDatasetState>()?;
    m.add_class::<copies::PyHostCopies>()?;
    for f in [
        wrap_pyfunction!(functions::plan, m)?,
        wrap_pyfunction!(functions::verify, m)?,
        wrap_pyfunction!(functions::lower_bound, m)?,
        wrap_pyfunction!(functions::simulate, m)?,
        wrap_pyfunction!(functions::evaluate, m)?,
        wrap_pyfunction!(functions::cost, m)?,
        wrap_pyfunction!(functions::switch_schedule, m)?,
        wrap_pyfunction!(functions::reshard, m)?,
        wrap_pyfunction!(functions::import_hf, m)?,
        wrap_pyfunction!(functions::check, m)?,
        wrap_pyfunction!(functions::export, m)?,
        wrap_pyfunction!(functions::diff, m)?,
        wrap_pyfunction!(functions::sync, m)?,
        wrap_pyfunction!(functions::program, m)?,
        wrap_pyfunction!(functions::planners, m)?,
        wrap_pyfunction!(cluster::default_cluster, m)?,
    ] {
        m.add_function(f)?;
    }
    error::register(m)
}
