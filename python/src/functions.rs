//! The package's functions: each one call of the application layer (or of
//! a library crate), with the GIL released while it works.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tenplan_application::{
    self as app, Bound, CostRequest, ExportRequest, ImportRequest, ModelArg, ModelMove, Planned, ReshardRequest,
    Session, SwitchRequest, SwitchState, SyncRequest, Target,
};
use tenplan_executor::DeviceProgram;
use tenplan_models::{MeshConfig, TpPlacement};
use tenplan_ptc::DeviceId;

use crate::cluster::PyCluster;
use crate::conversion::{config, planner_named, planner_spec, state_kind, to_py};
use crate::error::{app_error, layout_error, planner_error, rejected, PlanRejected};
use crate::model::PyModel;
use crate::plan::PyPlan;
use crate::problem::PyProblem;

/// Plan a problem. `planner` is `lp` (optimal, HiGHS, certified bound),
/// `lp-placed`, `tenplex`, `central`, `least-loaded` or `hotspa`;
/// `staging_budget` (bytes) splits the plan into rounds so that no device
/// stages more at once.
#[pyfunction]
#[pyo3(signature = (problem, planner = "lp", *, threads = 1, time_limit = None, placement = "fixed", multicast = true, staging_budget = None))]
#[allow(clippy::too_many_arguments)]
pub fn plan(
    py: Python<'_>,
    problem: &PyProblem,
    planner: &str,
    threads: u32,
    time_limit: Option<f64>,
    placement: &str,
    multicast: bool,
    staging_budget: Option<u64>,
) -> PyResult<PyPlan> {
    let spec = planner_spec(py, planner, threads, time_limit, placement, multicast)?;
    let problem = problem.inner.clone();
    let planned = py
        .detach(|| -> app::Result<Planned> {
            let planned = app::assess::plan(&problem, &spec)?;
            match staging_budget {
                Some(b) => planned.staged(b),
                None => Ok(planned),
            }
        })
        .map_err(|e| app_error(py, e))?;
    Ok(PyPlan {
        inner: planned.plan.into(),
    })
}

/// Check a plan with the independent checker: returns its certificate, or
/// raises `PlanRejected`.
#[pyfunction]
pub fn verify(py: Python<'_>, plan: &PyPlan) -> PyResult<String> {
    let p = plan.inner.clone();
    match py.detach(|| {
        tenplan_proofs::check(&p)
            .map(|c| c.to_string())
            .map_err(|v| v.to_string())
    }) {
        Ok(c) => Ok(c),
        Err(v) => Err(rejected(py, format!("plan rejected: {v}"), &v)),
    }
}

/// A certified lower bound on any plan's makespan: (seconds, reason).
#[pyfunction]
pub fn lower_bound(py: Python<'_>, problem: &PyProblem) -> PyResult<(f64, String)> {
    let p = problem.inner.clone();
    let b = py
        .detach(|| tenplan_planner::lower_bound(&p))
        .map_err(|e| planner_error(py, e))?;
    Ok((b.seconds, b.reason))
}

/// Simulate a plan (flow-level, max-min fair, per-message latency):
/// its makespan in seconds.
#[pyfunction]
pub fn simulate(py: Python<'_>, plan: &PyPlan) -> f64 {
    let p = plan.inner.clone();
    py.detach(|| tenplan_planner::simulate(&p).makespan_s)
}

/// Check, cost, bound and simulate a plan: a dict with makespan_s,
/// lower_bound_s, gap, bytes_moved, bytes_cross_node, verified, verdict, ...
#[pyfunction]
pub fn evaluate(py: Python<'_>, plan: &PyPlan) -> PyResult<Py<PyAny>> {
    let p = (*plan.inner).clone();
    let a = py.detach(|| {
        let problem = p.problem.clone();
        app::evaluate(&problem, vec![Planned::given(p)], Bound::Shared).remove(0)
    });
    to_py(py, &a.report)
}

/// What moving a job costs: the model `model` from layout `source` to
/// layout `target` (parallel configurations, with `devices=A-B` naming the
/// devices) on `cluster`, with `dead` devices. Plans, checks, simulates and
/// bounds once; the answer (makespan_s, lower_bound_s, bytes_cross_node,
/// ... as `evaluate` gives) is cached by the question. With
/// `bound_only=True`, no plan: the certified lower bound alone
/// (lower_bound_s, lower_bound_reason, bytes_to_move), in about a
/// millisecond. Layouts are built once per (model, state, configuration)
/// and reused by every later question.
#[pyfunction]
#[pyo3(signature = (model, source, target, cluster, *, state = "training", planner = "lp", dead = None, bound_only = false))]
#[allow(clippy::too_many_arguments)]
pub fn cost(
    py: Python<'_>,
    model: &PyModel,
    source: &str,
    target: &str,
    cluster: &PyCluster,
    state: &str,
    planner: &str,
    dead: Option<Vec<DeviceId>>,
    bound_only: bool,
) -> PyResult<Py<PyAny>> {
    let cluster = match dead {
        Some(d) if !d.is_empty() => cluster.inner.with_dead(d).map_err(|e| layout_error(py, e))?,
        _ => cluster.inner.clone(),
    };
    let movement = ModelMove {
        model: model.spec.clone(),
        state: state_kind(py, state)?,
        from: config(py, source)?,
        to: config(py, target)?,
        cluster,
    };
    if bound_only {
        let bound = py
            .detach(|| Session::global().cost_bound(&movement))
            .map_err(|e| app_error(py, e))?;
        return to_py(py, &*bound);
    }
    let req = CostRequest {
        movement,
        planner: planner_named(py, planner)?,
    };
    let cost = py
        .detach(|| Session::global().cost(&req))
        .map_err(|e| app_error(py, e))?;
    to_py(py, &*cost)
}

/// Weight sync (RL post-training): the weights of `model` (element type
/// `dtype` at the engines) from the trainer's layout `trainer` to the
/// inference engines' serving layout `engines` ("tp=4,dp=2,devices=8-15") on
/// `cluster`. `trainer_dtype` ("f32" for fp32 master weights) asks for a
/// conversion: each trainer rank converts its pieces to `dtype` before
/// sending (`tenplan.torch.prepare(..., convert=True)` does it), the plan
/// moves `dtype` bytes, and the dict's `conversion` says what is converted.
/// Planned, checked, bounded and simulated once per question; every later
/// call with the same question returns the same plan from a cache. A dict:
/// the report (makespan_s, lower_bound_s, bytes_cross_node, ...), the
/// `broadcast_floor` (the least time checkpoint-engine's bucketed
/// broadcast could take) and the `plan` to perform.
#[pyfunction]
#[pyo3(signature = (model, trainer, engines, cluster, *, dtype = "bf16", trainer_dtype = None, planner = "lp"))]
#[allow(clippy::too_many_arguments)]
pub fn sync(
    py: Python<'_>,
    model: &PyModel,
    trainer: &str,
    engines: &str,
    cluster: &PyCluster,
    dtype: &str,
    trainer_dtype: Option<&str>,
    planner: &str,
) -> PyResult<Py<PyAny>> {
    let req = SyncRequest {
        model: model.spec.clone(),
        trainer: config(py, trainer)?,
        engines: config(py, engines)?,
        cluster: cluster.inner.clone(),
        dtype: crate::conversion::dtype(py, dtype)?,
        trainer_dtype: trainer_dtype.map(|d| crate::conversion::dtype(py, d)).transpose()?,
        planner: planner_named(py, planner)?,
    };
    let session = Session::global();
    let s = match session.cached_sync(&req) {
        Some(s) => s,
        None => py.detach(|| session.sync(&req)).map_err(|e| app_error(py, e))?,
    };
    let d = to_py(py, &*s)?;
    d.bind(py)
        .cast::<pyo3::types::PyDict>()?
        .set_item("plan", PyPlan { inner: s.plan.clone() })?;
    Ok(d)
}

/// Hot switching (HotSPa): plan every ordered pair of `strategies` on
/// `cluster` (cached across calls) and the best order of a step, starting
/// and ending at the first. `state` is `params` or `params+grads`.
#[pyfunction]
#[pyo3(signature = (model, cluster, strategies, *, state = "params", planner = "lp", memory_budget = None))]
pub fn switch_schedule(
    py: Python<'_>,
    model: &PyModel,
    cluster: &PyCluster,
    strategies: Vec<String>,
    state: &str,
    planner: &str,
    memory_budget: Option<u64>,
) -> PyResult<Py<PyAny>> {
    let state = SwitchState::parse(state)
        .ok_or_else(|| layout_error(py, format!("unknown state `{state}` (expected params or params+grads)")))?;
    let req = SwitchRequest {
        model: model.spec.clone(),
        cluster: cluster.inner.clone(),
        configs: strategies.iter().map(|s| config(py, s)).collect::<PyResult<_>>()?,
        state,
        planner: planner_named(py, planner)?,
        memory_budget,
    };
    let s = py
        .detach(|| Session::global().switch(&req))
        .map_err(|e| app_error(py, e))?;
    to_py(py, &s)
}

/// A model argument (a name, a config.json or a model directory).
fn model_arg(py: Python<'_>, model: Option<&str>) -> PyResult<Option<ModelArg>> {
    model.map(ModelArg::resolve).transpose().map_err(|e| app_error(py, e))
}

/// Reshard a checkpoint (tenplan's, PyTorch DCP, or Megatron-Core
/// `torch_dist`) into a new one under the layout `to`: a DTensor mesh
/// with torchtitan's dimensions (`"dp_shard=2"`, `"dp_replicate=2,
/// dp_shard=2"`, with `tp`, `cp`, `ep`, `pp` and `pp_schedule`: the state
/// as the source holds it, every entry carried, in the source's format) or
/// a Megatron
/// configuration (`"tp=4"`: the model's state, `model` naming a DCP
/// checkpoint's model; a Megatron-Core checkpoint's whole state, written
/// as `torch_dist`, unless `format="tenplan"`). Plan, verify, write
/// atomically; returns what it did. Entries a Megatron target has no place
/// for are refused unless `weights_only` or `exclude` leaves them out.
#[pyfunction]
#[pyo3(signature = (src, out, to, *, planner = "lp", model = None, cluster = None, format = None, weights_only = false, exclude = None, place = None, fsdp_place = None, transformer_impl = None, overwrite = false))]
#[allow(clippy::too_many_arguments)] // Python keyword arguments
pub fn reshard(
    py: Python<'_>,
    src: PathBuf,
    out: PathBuf,
    to: &str,
    planner: &str,
    model: Option<&str>,
    cluster: Option<&PyCluster>,
    format: Option<&str>,
    weights_only: bool,
    exclude: Option<Vec<String>>,
    place: Option<Vec<String>>,
    fsdp_place: Option<Vec<String>>,
    transformer_impl: Option<&str>,
    overwrite: bool,
) -> PyResult<Py<PyAny>> {
    let target: Target = to.parse().map_err(|e| layout_error(py, e))?;
    let mut req = ReshardRequest::new(&src, &out, target);
    req.planner = planner_named(py, planner)?;
    req.model = model_arg(py, model)?;
    req.cluster = cluster.map(|c| c.inner.clone());
    req.format = format.map(str::parse).transpose().map_err(|e| app_error(py, e))?;
    req.weights_only = weights_only;
    req.exclude = exclude.unwrap_or_default();
    req.place = placements_arg(py, place)?;
    req.fsdp_place = placements_arg(py, fsdp_place)?;
    req.transformer_impl = transformer_impl
        .map(str::parse)
        .transpose()
        .map_err(PyValueError::new_err)?;
    req.overwrite = overwrite;
    let r = py.detach(|| app::reshard(&req, &())).map_err(|e| app_error(py, e))?;
    to_py(py, &r)
}

/// Placements given as `PATTERN=Shard(d)` / `PATTERN=Replicate()` strings.
fn placements_arg(py: Python<'_>, given: Option<Vec<String>>) -> PyResult<Vec<TpPlacement>> {
    given
        .unwrap_or_default()
        .iter()
        .map(|p| p.parse::<TpPlacement>())
        .collect::<Result<_, _>>()
        .map_err(|e| layout_error(py, e))
}

/// Import a Hugging Face model directory into a new tenplan checkpoint
/// under the parallel layout `layout` (`"tp=2,pp=2"`). A model of tenplan's
/// catalog is laid out under Megatron's names; any other transformers
/// family (and files that mix element types) keeps the files' names, laid
/// out by the family's tensor-parallel plan. A tensor of the files the
/// model does not read is refused unless `exclude` leaves it out.
#[pyfunction]
#[pyo3(signature = (hf, out, layout, *, model = None, dtype = None, cluster = None, exclude = None, overwrite = false))]
#[allow(clippy::too_many_arguments)] // Python keyword arguments
pub fn import_hf(
    py: Python<'_>,
    hf: PathBuf,
    out: PathBuf,
    layout: &str,
    model: Option<&str>,
    dtype: Option<&str>,
    cluster: Option<&PyCluster>,
    exclude: Option<Vec<String>>,
    overwrite: bool,
) -> PyResult<Py<PyAny>> {
    let req = ImportRequest {
        hf,
        model: model_arg(py, model)?,
        layout: config(py, layout)?,
        out,
        dtype: dtype.map(|d| crate::conversion::dtype(py, d)).transpose()?,
        cluster: cluster.map(|c| c.inner.clone()),
        exclude: exclude.unwrap_or_default(),
        overwrite,
    };
    let r = py.detach(|| app::import(&req, &())).map_err(|e| app_error(py, e))?;
    to_py(py, &r)
}

/// Check a tenplan, DCP or Megatron-Core `torch_dist` checkpoint (its
/// format, and for Megatron its tp and pp, in the result), reading every
/// byte; raises `CheckpointError` on the first problem.
#[pyfunction]
pub fn check(py: Python<'_>, dir: PathBuf) -> PyResult<Py<PyAny>> {
    let c = py.detach(|| app::check(&dir)).map_err(|e| app_error(py, e))?;
    to_py(py, &c)
}

/// Export a checkpoint's weights as a Hugging Face model directory (`hf`),
/// or as a PyTorch DCP checkpoint of the transformers model (`dcp`: Hugging
/// Face names, sharded as an FSDP2 job on the mesh `to` holds them, default
/// `dp_shard=1`). A checkpoint that holds more than the weights (optimizer
/// state, master weights) is refused unless `weights_only` or `exclude`
/// leaves it out.
#[pyfunction]
#[pyo3(signature = (ckpt, hf = None, *, dcp = None, to = None, model = None, max_shard_bytes = 5_000_000_000, weights_only = false, exclude = None))]
#[allow(clippy::too_many_arguments)] // Python keyword arguments
pub fn export(
    py: Python<'_>,
    ckpt: PathBuf,
    hf: Option<PathBuf>,
    dcp: Option<PathBuf>,
    to: Option<&str>,
    model: Option<&str>,
    max_shard_bytes: u64,
    weights_only: bool,
    exclude: Option<Vec<String>>,
) -> PyResult<Py<PyAny>> {
    let (out, mesh) = match (hf, dcp, to) {
        (Some(hf), None, None) => (hf, None),
        (None, Some(dcp), to) => {
            let mesh: MeshConfig = to.unwrap_or("dp_shard=1").parse().map_err(|e| layout_error(py, e))?;
            (dcp, Some(mesh))
        }
        (Some(_), None, Some(_)) => return Err(PyValueError::new_err("`to` is the mesh of a DCP export: give `dcp`")),
        _ => {
            return Err(PyValueError::new_err(
                "give one of `hf` (a Hugging Face directory) or `dcp` (a DCP checkpoint)",
            ))
        }
    };
    let req = ExportRequest {
        ckpt,
        model: model_arg(py, model)?,
        out,
        dcp: mesh,
        max_shard_bytes,
        weights_only,
        exclude: exclude.unwrap_or_default(),
    };
    let e = py.detach(|| app::export(&req, &())).map_err(|e| app_error(py, e))?;
    to_py(py, &e)
}

/// Compare two checkpoints or models (tenplan, PyTorch DCP or Hugging Face
/// directories, any layouts) tensor by tensor under tenplan's names: a
/// dict with `identical`, the tensors that differ, the first differing
/// element and where each side keeps it, and the tensors only one side has.
#[pyfunction]
#[pyo3(signature = (a, b, *, model = None, weights_only = false))]
pub fn diff(py: Python<'_>, a: PathBuf, b: PathBuf, model: Option<&str>, weights_only: bool) -> PyResult<Py<PyAny>> {
    let model = model_arg(py, model)?;
    let r = py
        .detach(|| app::diff(&a, &b, model.as_ref(), weights_only))
        .map_err(|e| app_error(py, e))?;
    to_py(py, &r)
}

/// The program `device` runs to perform `plan` by message passing, as a
/// dict (see `tenplan_executor::program`). The plan is checked first:
/// a rejected plan raises `PlanRejected` and gives no program. Messages of
/// at least `alone_min_bytes` travel alone where that saves a copy (default
/// `tenplan_executor::ALONE_MIN_BYTES`); every device's program of one plan
/// must be made with the same value.
#[pyfunction]
#[pyo3(signature = (plan, device, alone_min_bytes = None))]
pub fn program(py: Python<'_>, plan: &PyPlan, device: DeviceId, alone_min_bytes: Option<u64>) -> PyResult<Py<PyAny>> {
    let p = plan.inner.clone();
    let alone = alone_min_bytes.unwrap_or(tenplan_executor::ALONE_MIN_BYTES);
    let prog = py.detach(|| -> Result<DeviceProgram, String> {
        let verified = tenplan_proofs::verify(&p).map_err(|v| format!("plan rejected: {v}"))?;
        DeviceProgram::of_with(&verified, device, alone).map_err(|e| e.to_string())
    });
    match prog {
        Ok(prog) => to_py(py, &prog),
        Err(e) => Err(PyErr::from_type(py.get_type::<PlanRejected>(), e)),
    }
}

/// The names `plan` accepts.
#[pyfunction]
pub fn planners() -> Vec<&'static str> {
    tenplan_planner::PLANNERS.to_vec()
}
