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
    loads(py, serde_json::to_string(v).expect("values serialise"))
}

/// A serializable value (an outcome, a report) as a Python dict or list.
pub fn to_py<T: Serialize + ?Sized>(py: Python<'_>, v: &T) -> PyResult<Py<PyAny>> {
    loads(py, serde_json::to_string(v).expect("values serialise"))
}

/// `json.loads(text)`, with Python's cyclic collector paused meanwhile:
/// it walks every container made so far, again and again while a large
/// result is built, and took two thirds of the time of loading the
/// program of 32,000 tensors (2.7 s, 0.8 s paused). Nothing it builds is
/// garbage until the caller drops it.
fn loads(py: Python<'_>, text: String) -> PyResult<Py<PyAny>> {
    let gc = py.import("gc")?;
    let enabled: bool = gc.call_method0("isenabled")?.extract()?;
    if enabled {
        gc.call_method0("disable")?;
    }
    let value = py.import("json")?.call_method1("loads", (text,));
    if enabled {
        gc.call_method0("enable")?;
    }
    Ok(value?.unbind())
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
