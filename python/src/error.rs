//! Python exceptions for tenplan's typed errors: one class per kind, with
//! the typed fields as attributes (an infeasible problem's missing boxes,
//! a rejected plan's verdict).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use tenplan_application::Error as AppError;

create_exception!(
    _tenplan,
    TenplanError,
    PyException,
    "Base class of every error tenplan raises."
);
create_exception!(
    _tenplan,
    LayoutError,
    TenplanError,
    "A model, layout, cluster or problem that is invalid or does not fit."
);
create_exception!(
    _tenplan,
    InfeasibleError,
    TenplanError,
    "No plan exists: some target state has no live source. `missing` lists each box \
     (tensor, box as [[lo, hi], ...], dead_holders)."
);
create_exception!(
    _tenplan,
    PlanRejected,
    TenplanError,
    "The independent checker rejected a plan; `verdict` says why. Nothing was performed."
);
create_exception!(
    _tenplan,
    SolverError,
    TenplanError,
    "The LP solver failed, or the problem is too large for this machine's memory."
);
create_exception!(
    _tenplan,
    CheckpointError,
    TenplanError,
    "A checkpoint that cannot be read, written or checked."
);

/// Add the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TenplanError", py.get_type::<TenplanError>())?;
    m.add("LayoutError", py.get_type::<LayoutError>())?;
    m.add("InfeasibleError", py.get_type::<InfeasibleError>())?;
    m.add("PlanRejected", py.get_type::<PlanRejected>())?;
    m.add("SolverError", py.get_type::<SolverError>())?;
    m.add("CheckpointError", py.get_type::<CheckpointError>())?;
    Ok(())
}

/// An exception of class `E` with attributes set on it.
fn raise<E: pyo3::PyTypeInfo>(py: Python<'_>, msg: String, attrs: &[(&str, Py<PyAny>)]) -> PyErr {
    let err = PyErr::from_type(py.get_type::<E>(), msg);
    for (k, v) in attrs {
        let _ = err.value(py).setattr(*k, v);
    }
    err
}

/// `PlanRejected` carrying the checker's verdict.
pub fn rejected(py: Python<'_>, msg: String, verdict: &str) -> PyErr {
    let v = verdict.into_pyobject(py).map(|v| v.into_any().unbind());
    raise::<PlanRejected>(py, msg, &v.map(|v| vec![("verdict", v)]).unwrap_or_default())
}

/// A `LayoutError` with this message.
pub fn layout_error(py: Python<'_>, e: impl std::fmt::Display) -> PyErr {
    raise::<LayoutError>(py, e.to_string(), &[])
}

/// A planner's error as its exception.
pub fn planner_error(py: Python<'_>, e: tenplan_planner::Error) -> PyErr {
    use tenplan_planner::Error as E;
    match e {
        E::Infeasible(inf) => {
            let missing: Vec<serde_json::Value> = inf
                .missing
                .iter()
                .map(|m| {
                    serde_json::json!({
                        "tensor": m.tensor,
                        "box": (0..m.region.ndim()).map(|d| [m.region.range(d).start, m.region.range(d).end]).collect::<Vec<_>>(),
                        "dead_holders": m.dead_holders,
                    })
                })
                .collect();
            let attrs = match crate::conversion::json_value(py, &serde_json::Value::Array(missing)) {
                Ok(v) => vec![("missing", v)],
                Err(_) => Vec::new(),
            };
            raise::<InfeasibleError>(py, inf.to_string(), &attrs)
        }
        E::Solver(_) | E::TooLarge { .. } | E::PlacementTooLarge { .. } => raise::<SolverError>(py, e.to_string(), &[]),
        _ => raise::<LayoutError>(py, e.to_string(), &[]),
    }
}

/// An operation's error as its exception.
pub fn app_error(py: Python<'_>, e: AppError) -> PyErr {
    match e {
        AppError::Planning(p) => planner_error(py, p),
        AppError::Rejected { ref verdict, .. } => rejected(py, e.to_string(), &verdict.clone()),
        AppError::PlanRejected { ref verdict } => rejected(py, e.to_string(), &verdict.clone()),
        AppError::Format(_) | AppError::Execution(_) | AppError::Request { .. } => {
            raise::<CheckpointError>(py, e.to_string(), &[])
        }
        _ => raise::<LayoutError>(py, e.to_string(), &[]),
    }
}
