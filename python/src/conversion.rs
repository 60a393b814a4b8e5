//! Conversions between Python values and tenplan's: JSON-shaped values to
//! dicts and lists, and the strings a Python call passes to parsed values.

use pyo3::prelude::*;
use serde::Serialize;
use tenplan_application::Config;
use tenplan_models::StateKind;
use tenplan_planner::PlannerSpec;
use tenplan_ptc::DType;

use crate::error::{layout_error, planner_error};

/// A JSON value as the Python object `json.loads` makes of it.
pub fn json_value(py: Python<'_>, v: &serde_json::Value) -> PyResult<Py<PyAny>> {
    let text = serde_json::to_string(v).expect("values serialise");
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

/// A serializable value (an outcome, a report) as a Python dict or list.
pub fn to_py<T: Serialize + ?Sized>(py: Python<'_>, v: &T) -> PyResult<Py<PyAny>> {
    json_value(py, &serde_json::to_value(v).expect("values serialise"))
}

/// The state a Python call names: `training`, `weights` (bf16),
/// `weights:DTYPE` or `weights+grads`.
pub fn state_kind(py: Python<'_>, state: &str) -> PyResult<StateKind> {
    match state {
        "weights" => Ok(StateKind::Weights(DType::BF16)),
        s => s.parse::<StateKind>().map_err(|e| layout_error(py, e)),
    }
}

/// A parallel configuration (`"tp=4,pp=2,dp=2"`).
pub fn config(py: Python<'_>, text: &str) -> PyResult<Config> {
    text.parse().map_err(|e| layout_error(py, e))
}

/// An element type (`"bf16"`, `"f32"`, ...).
pub fn dtype(py: Python<'_>, text: &str) -> PyResult<DType> {
    text.parse().map_err(|e| layout_error(py, e))
}

/// The planner a Python call describes.
pub fn planner_spec(
    py: Python<'_>,
    name: &str,
    threads: u32,
    time_limit: Option<f64>,
    placement: &str,
    multicast: bool,
) -> PyResult<PlannerSpec> {
    let spec = || -> Result<PlannerSpec, tenplan_planner::Error> {
        let mut spec = PlannerSpec::named(name)?
            .with_placement(placement.parse()?)?
            .with_threads(threads)?
            .with_multicast(multicast)?;
        if let Some(t) = time_limit {
            spec = spec.with_time_limit_s(t)?;
        }
        Ok(spec)
    };
    spec().map_err(|e| planner_error(py, e))
}

/// A planner by name, with its defaults.
pub fn planner_named(py: Python<'_>, name: &str) -> PyResult<PlannerSpec> {
    PlannerSpec::named(name).map_err(|e| planner_error(py, e))
}
