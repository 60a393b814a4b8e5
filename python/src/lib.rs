//! The Python face of tenplan (`tenplan._tenplan`, wrapped by the `tenplan`
//! package): models, layouts, clusters, problems and plans; planning,
//! checking, bounding and simulating; hot-switch schedules; checkpoint
//! operations; and the per-device programs the torch.distributed executor
//! runs. Every call is one call of the library crates, with the GIL
//! released while it works; errors become Python exceptions that carry the
//! typed fields (an infeasible problem lists its missing boxes).
#![deny(missing_docs)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use serde::{Deserialize, Serialize};
use tenplan_executor::operations::{self, Checked, ReshardRequest};
use tenplan_executor::DeviceProgram;
use tenplan_models::{resolve, to_hf_config, ModelSpec, ModelState, ParallelConfig, StateKind};
use tenplan_planner::switch::{schedule, SwitchCache, SwitchRequest, SwitchState};
use tenplan_planner::{evaluate_knowing, planner, LpPlanner, Placement, Planner};
use tenplan_ptc::{
    Cluster, DType, DatasetFields, DatasetState, DeviceId, Forwarding, Layout, Plan, Problem, Shard, TensorSpec,
};

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

/// An exception of class `E` with attributes set on it.
fn raise<E: pyo3::PyTypeInfo>(py: Python<'_>, msg: String, attrs: &[(&str, Py<PyAny>)]) -> PyErr {
    let err = PyErr::from_type(py.get_type::<E>(), msg);
    for (k, v) in attrs {
        let _ = err.value(py).setattr(*k, v);
    }
    err
}

/// `PlanRejected` carrying the checker's verdict.
fn rejected(py: Python<'_>, msg: String, verdict: &str) -> PyErr {
    let v = verdict.into_pyobject(py).map(|v| v.into_any().unbind());
    raise::<PlanRejected>(py, msg, &v.map(|v| vec![("verdict", v)]).unwrap_or_default())
}

fn json_value(py: Python<'_>, v: &serde_json::Value) -> PyResult<Py<PyAny>> {
    let text = serde_json::to_string(v).expect("values serialise");
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

fn to_py<T: Serialize + ?Sized>(py: Python<'_>, v: &T) -> PyResult<Py<PyAny>> {
    json_value(py, &serde_json::to_value(v).expect("values serialise"))
}

fn planner_error(py: Python<'_>, e: tenplan_planner::Error) -> PyErr {
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
            let attrs = match json_value(py, &serde_json::Value::Array(missing)) {
                Ok(v) => vec![("missing", v)],
                Err(_) => Vec::new(),
            };
            raise::<InfeasibleError>(py, inf.to_string(), &attrs)
        }
        E::Rejected { ref verdict, .. } => rejected(py, e.to_string(), verdict),
        E::Solver(_) | E::TooLarge { .. } | E::PlacementTooLarge { .. } => raise::<SolverError>(py, e.to_string(), &[]),
        _ => raise::<LayoutError>(py, e.to_string(), &[]),
    }
}

fn executor_error(py: Python<'_>, e: tenplan_executor::Error) -> PyErr {
    use tenplan_executor::Error as E;
    match e {
        E::Planning(p) => planner_error(py, p),
        E::Rejected { verdict } => rejected(py, format!("plan rejected: {verdict}"), &verdict),
        E::Model(_) | E::Ptc(_) | E::TargetLayout { .. } => raise::<LayoutError>(py, e.to_string(), &[]),
        _ => raise::<CheckpointError>(py, e.to_string(), &[]),
    }
}

fn layout_error(py: Python<'_>, e: impl std::fmt::Display) -> PyErr {
    raise::<LayoutError>(py, e.to_string(), &[])
}

fn parse_state(py: Python<'_>, state: &str) -> PyResult<StateKind> {
    match state {
        "weights" => Ok(StateKind::Weights(DType::BF16)),
        s => s.parse::<StateKind>().map_err(|e| layout_error(py, e)),
    }
}

/// A model: from the catalog by name, or from a Hugging Face `config.json`
/// (a file, or a model directory holding one).
#[pyclass(module = "tenplan._tenplan", name = "Model", frozen)]
struct PyModel {
    spec: ModelSpec,
}

#[pymethods]
impl PyModel {
    #[new]
    fn new(py: Python<'_>, model: &str) -> PyResult<Self> {
        let spec = resolve(model).map_err(|e| layout_error(py, e))?;
        Ok(PyModel { spec })
    }

    /// The model's name.
    #[getter]
    fn name(&self) -> String {
        self.spec.name.to_string()
    }

    /// Number of parameters.
    fn parameters(&self) -> u64 {
        ModelState::new(&self.spec, StateKind::Weights(DType::BF16)).parameter_count()
    }

    /// The layout of the model's state under a parallel configuration
    /// (`"tp=4,pp=2,dp=2,zero=1"`, keys tp, pp, dp, ep, zero,
    /// devices=A-B, split=A:B:..). `state` is `training` (bf16 weights, fp32
    /// master weights, Adam moments), `weights` (bf16), `weights:DTYPE` or
    /// `weights+grads`.
    #[pyo3(signature = (config, state = "training"))]
    fn layout(&self, py: Python<'_>, config: &str, state: &str) -> PyResult<PyLayout> {
        let kind = parse_state(py, state)?;
        let cfg: ParallelConfig = config.parse().map_err(|e| layout_error(py, e))?;
        let st = ModelState::new(&self.spec, kind);
        let layout = py.detach(|| st.layout(&cfg)).map_err(|e| layout_error(py, e))?;
        Ok(PyLayout {
            inner: Arc::new(layout),
        })
    }

    /// The weights as inference engines serve them (`"tp=4,dp=2,devices=8-15"`:
    /// tp ranks per engine, dp engine replicas): each rank's fused QKV as
    /// `[q; k; v]`, key/value heads replicated when tp exceeds them (see
    /// docs/serving-layouts.md). The target of a weight sync from a
    /// training layout of the same model and `state` (`weights` or
    /// `weights:DTYPE`).
    #[pyo3(signature = (config, state = "weights"))]
    fn serving_layout(&self, py: Python<'_>, config: &str, state: &str) -> PyResult<PyLayout> {
        let kind = parse_state(py, state)?;
        let cfg: ParallelConfig = config.parse().map_err(|e| layout_error(py, e))?;
        let st = ModelState::new(&self.spec, kind);
        let layout = py.detach(|| st.serving_layout(&cfg)).map_err(|e| layout_error(py, e))?;
        Ok(PyLayout {
            inner: Arc::new(layout),
        })
    }

    /// The model's Hugging Face `config.json`, as a dict.
    fn hf_config(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let v = to_hf_config(&self.spec).map_err(|e| layout_error(py, e))?;
        json_value(py, &v)
    }

    fn __repr__(&self) -> String {
        format!("Model('{}')", self.spec.name)
    }
}

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
struct PyLayout {
    inner: Arc<Layout>,
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

/// A cluster: `NODESxGPUS`, a preset (`dgx-h100:4`, `dgx-h100-rail:64`,
/// `gb200-nvl72:2`, ...) or a topology file (`FILE.json`).
#[pyclass(module = "tenplan._tenplan", name = "Cluster", frozen)]
#[derive(Clone)]
struct PyCluster {
    inner: Cluster,
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
        tenplan_planner::report::fabric_summary(&self.inner)
    }

    fn __repr__(&self) -> String {
        format!("Cluster('{}', {} devices)", self.inner.name(), self.inner.num_devices())
    }
}

/// A reconfiguration problem: a source layout, a target layout, a cluster.
#[pyclass(module = "tenplan._tenplan", name = "Problem", frozen)]
struct PyProblem {
    inner: Arc<Problem>,
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

/// A plan: the copies and zero-fills that turn the source state into the
/// target state, with its problem. It proves nothing until `verify` accepts it.
#[pyclass(module = "tenplan._tenplan", name = "Plan", frozen)]
struct PyPlan {
    inner: Arc<Plan>,
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

/// The placement a Python call names.
fn parse_placement(py: Python<'_>, name: &str, placement: &str) -> PyResult<Placement> {
    match (name, placement) {
        ("lp-placed", _) | ("lp", "optimize") => Ok(Placement::Optimize),
        (_, "fixed") => Ok(Placement::Fixed),
        (_, "optimize") => Err(layout_error(
            py,
            format!("placement optimize needs the lp planner, not {name}"),
        )),
        (_, other) => Err(layout_error(
            py,
            format!("unknown placement `{other}` (expected fixed or optimize)"),
        )),
    }
}

/// The planner `name` with the options the Python call gives (made where it
/// runs: planners are not shared between threads).
fn make_planner(
    name: &str,
    threads: u32,
    time_limit: Option<f64>,
    placement: Placement,
    multicast: bool,
) -> Result<Box<dyn Planner>, tenplan_planner::Error> {
    match name {
        "lp" | "lp-placed" => {
            let mut b = LpPlanner::builder()
                .threads(threads)
                .placement(placement)
                .multicast(multicast);
            if let Some(t) = time_limit {
                b = b.time_limit_s(t);
            }
            Ok(Box::new(b.build()))
        }
        other => planner(other),
    }
}

/// Plan a problem. `planner` is `lp` (optimal, HiGHS, certified bound),
/// `lp-placed`, `tenplex`, `central`, `least-loaded` or `hotspa`;
/// `staging_budget` (bytes) splits the plan into rounds so that no device
/// stages more at once.
#[pyfunction]
#[pyo3(signature = (problem, planner = "lp", *, threads = 1, time_limit = None, placement = "fixed", multicast = true, staging_budget = None))]
#[allow(clippy::too_many_arguments)]
fn plan(
    py: Python<'_>,
    problem: &PyProblem,
    planner: &str,
    threads: u32,
    time_limit: Option<f64>,
    placement: &str,
    multicast: bool,
    staging_budget: Option<u64>,
) -> PyResult<PyPlan> {
    let placement = parse_placement(py, planner, placement)?;
    let problem = problem.inner.clone();
    let plan = py
        .detach(|| make_planner(planner, threads, time_limit, placement, multicast)?.plan(&problem))
        .map_err(|e| planner_error(py, e))?;
    let plan = match staging_budget {
        Some(b) => tenplan_planner::schedule::stage(&plan, b).map_err(|e| layout_error(py, e))?,
        None => plan,
    };
    Ok(PyPlan { inner: Arc::new(plan) })
}

/// Check a plan with the independent checker: returns its certificate, or
/// raises `PlanRejected`.
#[pyfunction]
fn verify(py: Python<'_>, plan: &PyPlan) -> PyResult<String> {
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
fn lower_bound(py: Python<'_>, problem: &PyProblem) -> PyResult<(f64, String)> {
    let p = problem.inner.clone();
    let b = py
        .detach(|| tenplan_planner::lower_bound(&p))
        .map_err(|e| planner_error(py, e))?;
    Ok((b.seconds, b.reason))
}

/// Simulate a plan (flow-level, max-min fair, per-message latency):
/// its makespan in seconds.
#[pyfunction]
fn simulate(py: Python<'_>, plan: &PyPlan) -> f64 {
    let p = plan.inner.clone();
    py.detach(|| tenplan_planner::simulate(&p).makespan_s)
}

/// Check, cost, bound and simulate a plan: a dict with makespan_s,
/// lower_bound_s, gap, bytes_moved, bytes_cross_node, verified, verdict, ...
#[pyfunction]
fn evaluate(py: Python<'_>, plan: &PyPlan) -> PyResult<Py<PyAny>> {
    let p = plan.inner.clone();
    let r = py.detach(|| evaluate_knowing(&p, 0.0, None));
    to_py(py, &r)
}

type CostKey = (ModelSpec, String, String, String, String, String, Vec<DeviceId>);

/// What `cost` answered before: a scheduler asks the same question often.
static COSTS: Mutex<Option<HashMap<CostKey, Arc<serde_json::Value>>>> = Mutex::new(None);

/// What moving a job costs: the model `model` from layout `source` to
/// layout `target` (parallel configurations, with `devices=A-B` naming the
/// devices) on `cluster`, with `dead` devices. Plans, checks, simulates and
/// bounds once; the answer (makespan_s, lower_bound_s, bytes_cross_node,
/// ... as `evaluate` gives) is cached by the question.
#[pyfunction]
#[pyo3(signature = (model, source, target, cluster, *, state = "training", planner = "lp", dead = None))]
#[allow(clippy::too_many_arguments)]
fn cost(
    py: Python<'_>,
    model: &PyModel,
    source: &str,
    target: &str,
    cluster: &PyCluster,
    state: &str,
    planner: &str,
    dead: Option<Vec<DeviceId>>,
) -> PyResult<Py<PyAny>> {
    let mut dead = dead.unwrap_or_default();
    dead.sort_unstable();
    let key: CostKey = (
        model.spec.clone(),
        source.to_string(),
        target.to_string(),
        format!("{:?}", cluster.inner.data()),
        state.to_string(),
        planner.to_string(),
        dead.clone(),
    );
    if let Some(v) = COSTS
        .lock()
        .expect("no poisoning")
        .get_or_insert_with(HashMap::new)
        .get(&key)
    {
        return json_value(py, v);
    }
    let kind = parse_state(py, state)?;
    let st = ModelState::new(&model.spec, kind);
    let (from, to): (ParallelConfig, ParallelConfig) = (
        source.parse().map_err(|e| layout_error(py, e))?,
        target.parse().map_err(|e| layout_error(py, e))?,
    );
    let c = if dead.is_empty() {
        cluster.inner.clone()
    } else {
        cluster.inner.with_dead(dead).map_err(|e| layout_error(py, e))?
    };
    for cfg in [&from, &to] {
        st.check_plannable(cfg, &c).map_err(|e| layout_error(py, e))?;
    }
    let report = py.detach(|| -> Result<_, tenplan_planner::Error> {
        let p = make_planner(planner, 1, None, Placement::Fixed, true)?;
        let problem = Problem::new(
            st.layout(&from).map_err(|e| tenplan_planner::Error::Strategy {
                strategy: source.to_string(),
                source: Box::new(e),
            })?,
            st.layout(&to).map_err(|e| tenplan_planner::Error::Strategy {
                strategy: target.to_string(),
                source: Box::new(e),
            })?,
            c,
        )?;
        let start = std::time::Instant::now();
        let (plan, bound) = p.plan_with_bound(&problem)?;
        Ok(evaluate_knowing(&plan, start.elapsed().as_secs_f64(), bound.as_ref()))
    });
    let report = report.map_err(|e| planner_error(py, e))?;
    let v = Arc::new(serde_json::to_value(&report).expect("reports serialise"));
    COSTS
        .lock()
        .expect("no poisoning")
        .get_or_insert_with(HashMap::new)
        .insert(key, v.clone());
    json_value(py, &v)
}

static SYNCS: std::sync::LazyLock<tenplan_planner::sync::SyncCache> =
    std::sync::LazyLock::new(tenplan_planner::sync::SyncCache::new);

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
fn sync(
    py: Python<'_>,
    model: &PyModel,
    trainer: &str,
    engines: &str,
    cluster: &PyCluster,
    dtype: &str,
    trainer_dtype: Option<&str>,
    planner: &str,
) -> PyResult<Py<PyAny>> {
    let dtype: tenplan_ptc::DType = dtype.parse().map_err(|e| layout_error(py, e))?;
    let trainer_dtype: Option<tenplan_ptc::DType> = trainer_dtype
        .map(str::parse)
        .transpose()
        .map_err(|e| layout_error(py, e))?;
    let req = tenplan_planner::sync::SyncRequest {
        model: model.spec.clone(),
        trainer: trainer.to_string(),
        engines: engines.to_string(),
        cluster: cluster.inner.clone(),
        dtype,
        trainer_dtype,
        planner: planner.to_string(),
    };
    let s = match SYNCS.get(&req) {
        Some(s) => s,
        None => py
            .detach(|| SYNCS.get_or_plan(&req))
            .map_err(|e| planner_error(py, e))?,
    };
    let d = to_py(py, &s.report)?;
    let dict = d.bind(py).cast::<pyo3::types::PyDict>()?;
    dict.set_item("broadcast_floor", to_py(py, &s.broadcast_floor)?)?;
    dict.set_item("conversion", to_py(py, &s.conversion)?)?;
    dict.set_item("plan", PyPlan { inner: s.plan.clone() })?;
    Ok(d)
}

static SWITCHES: std::sync::LazyLock<SwitchCache> = std::sync::LazyLock::new(SwitchCache::new);

/// Hot switching (HotSPa): plan every ordered pair of `strategies` on
/// `cluster` (cached across calls) and the best order of a step, starting
/// and ending at the first. `state` is `params` or `params+grads`.
#[pyfunction]
#[pyo3(signature = (model, cluster, strategies, *, state = "params", planner = "lp", memory_budget = None))]
fn switch_schedule(
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
        cluster_name: format!("{:?}", cluster.inner.data()),
        cluster: cluster.inner.clone(),
        configs: strategies,
        state,
        planner: planner.to_string(),
        memory_budget,
    };
    let s = py
        .detach(|| schedule(&req, &SWITCHES))
        .map_err(|e| planner_error(py, e))?;
    to_py(py, &s)
}

/// Reshard a checkpoint (tenplan's, or PyTorch DCP with `model`) into a new
/// one under the layout `to`: plan, verify, write atomically. Returns what
/// it did.
#[pyfunction]
#[pyo3(signature = (src, out, to, *, planner = "lp", model = None, cluster = None, overwrite = false))]
#[allow(clippy::too_many_arguments)] // Python keyword arguments
fn reshard(
    py: Python<'_>,
    src: PathBuf,
    out: PathBuf,
    to: &str,
    planner: &str,
    model: Option<String>,
    cluster: Option<&PyCluster>,
    overwrite: bool,
) -> PyResult<Py<PyAny>> {
    let mut req = ReshardRequest::new(&src, &out, to).map_err(|e| executor_error(py, e))?;
    req.planner = planner.to_string();
    req.model = model;
    req.cluster = cluster.map(|c| c.inner.clone());
    req.overwrite = overwrite;
    let r = py
        .detach(|| operations::reshard_checkpoint(&req, &()))
        .map_err(|e| executor_error(py, e))?;
    json_value(
        py,
        &serde_json::json!({
            "src_format": r.src_format, "model": r.model.name, "planner": r.planner, "copies": r.copies,
            "bytes_read": r.resharded.bytes_read, "data_bytes": r.resharded.written.data_bytes,
            "file_bytes": r.resharded.written.file_bytes, "files": r.resharded.written.manifest.files.len(),
            "unused_source_tensors": r.unused, "plan_seconds": r.plan_s, "execute_seconds": r.execute_s,
            "seconds": r.seconds,
        }),
    )
}

/// Check a tenplan or DCP checkpoint, reading every byte; raises
/// `CheckpointError` on the first problem.
#[pyfunction]
fn check(py: Python<'_>, dir: PathBuf) -> PyResult<Py<PyAny>> {
    let c = py
        .detach(|| operations::check_checkpoint(&dir))
        .map_err(|e| executor_error(py, e))?;
    let v = match c {
        Checked::Tenplan {
            model,
            layout,
            files,
            tensors,
            bytes,
        } => {
            serde_json::json!({"format": "tenplan", "model": model, "layout": layout, "files": files, "tensors": tensors, "bytes": bytes})
        }
        Checked::Dcp {
            ranks,
            files,
            tensors,
            chunks,
            others,
            bytes,
        } => {
            serde_json::json!({"format": "PyTorch DCP", "ranks": ranks, "files": files, "tensors": tensors, "chunks": chunks, "other_entries": others, "bytes": bytes})
        }
        _ => serde_json::json!({}),
    };
    json_value(py, &v)
}

/// Export a checkpoint's weights as a Hugging Face model directory.
#[pyfunction]
#[pyo3(signature = (ckpt, hf, *, model = None, max_shard_bytes = 5_000_000_000))]
fn export(
    py: Python<'_>,
    ckpt: PathBuf,
    hf: PathBuf,
    model: Option<String>,
    max_shard_bytes: u64,
) -> PyResult<Py<PyAny>> {
    let (spec, e) = py
        .detach(|| operations::export_checkpoint(&ckpt, model.as_deref(), &hf, max_shard_bytes, &()))
        .map_err(|e| executor_error(py, e))?;
    json_value(
        py,
        &serde_json::json!({
            "model": spec.name, "files": e.files, "tensors": e.tensors, "data_bytes": e.data_bytes,
            "file_bytes": e.file_bytes, "original_config": e.original_config,
        }),
    )
}

/// Compare two checkpoints or models (tenplan, PyTorch DCP or Hugging Face
/// directories, any layouts) tensor by tensor under tenplan's names: a
/// dict with `identical`, the tensors that differ, the first differing
/// element and where each side keeps it, and the tensors only one side has.
#[pyfunction]
#[pyo3(signature = (a, b, *, model = None, weights_only = false))]
fn diff(py: Python<'_>, a: PathBuf, b: PathBuf, model: Option<String>, weights_only: bool) -> PyResult<Py<PyAny>> {
    let r = py
        .detach(|| operations::diff_checkpoints(&a, &b, model.as_deref(), weights_only))
        .map_err(|e| executor_error(py, e))?;
    to_py(py, &r)
}

/// The program `device` runs to perform `plan` by message passing, as a
/// dict (see `tenplan_executor::program`). The plan is checked first:
/// a rejected plan raises `PlanRejected` and gives no program.
#[pyfunction]
fn program(py: Python<'_>, plan: &PyPlan, device: DeviceId) -> PyResult<Py<PyAny>> {
    let p = plan.inner.clone();
    let prog = py.detach(|| -> Result<DeviceProgram, String> {
        let verified = tenplan_proofs::verify(&p).map_err(|v| format!("plan rejected: {v}"))?;
        DeviceProgram::of(&verified, device).map_err(|e| e.to_string())
    });
    match prog {
        Ok(prog) => to_py(py, &prog),
        Err(e) => Err(raise::<PlanRejected>(py, e, &[])),
    }
}

/// Where a job is in its dataset: the seed of the global sample order,
/// the samples consumed, and the global batch. The sequence of global
/// batches is the same whatever the data-parallel degree, so a job that
/// changes it neither skips nor repeats a sample.
#[pyclass(module = "tenplan._tenplan", name = "DatasetState", frozen)]
struct PyDatasetState {
    inner: DatasetState,
}

fn data_error(py: Python<'_>, e: impl std::fmt::Display) -> PyErr {
    raise::<LayoutError>(py, e.to_string(), &[])
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
        .map_err(|e| data_error(py, e))?;
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
        let (a, b) = self.inner.share(dp, rank).map_err(|e| data_error(py, e))?;
        let base = self.inner.fields().consumed;
        Ok((base + a..base + b).map(|p| self.inner.sample_at(p)).collect())
    }

    /// The samples of the next `steps` global batches.
    fn global_batches(&self, py: Python<'_>, steps: u64) -> PyResult<Vec<Vec<u64>>> {
        self.inner.global_batches(steps).map_err(|e| data_error(py, e))
    }

    /// The state after `steps` steps.
    #[pyo3(signature = (steps = 1))]
    fn advance(&self, py: Python<'_>, steps: u64) -> PyResult<Self> {
        let inner = self.inner.advance(steps).map_err(|e| data_error(py, e))?;
        Ok(PyDatasetState { inner })
    }

    /// The state as JSON (what a checkpoint manifest keeps).
    fn to_json(&self) -> String {
        serde_json::to_string(&self.inner).expect("states serialise")
    }

    /// A state from JSON.
    #[staticmethod]
    fn from_json(py: Python<'_>, text: &str) -> PyResult<Self> {
        let inner = serde_json::from_str(text).map_err(|e| data_error(py, format!("not a dataset state: {e}")))?;
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

/// The names `plan` accepts.
#[pyfunction]
fn planners() -> Vec<&'static str> {
    tenplan_planner::PLANNERS.to_vec()
}

/// The tenplan Python module.
#[pymodule]
fn _tenplan(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PyModel>()?;
    m.add_class::<PyLayout>()?;
    m.add_class::<PyCluster>()?;
    m.add_class::<PyProblem>()?;
    m.add_class::<PyPlan>()?;
    m.add_class::<PyDatasetState>()?;
    for f in [
        wrap_pyfunction!(plan, m)?,
        wrap_pyfunction!(verify, m)?,
        wrap_pyfunction!(lower_bound, m)?,
        wrap_pyfunction!(simulate, m)?,
        wrap_pyfunction!(evaluate, m)?,
        wrap_pyfunction!(cost, m)?,
        wrap_pyfunction!(switch_schedule, m)?,
        wrap_pyfunction!(reshard, m)?,
        wrap_pyfunction!(check, m)?,
        wrap_pyfunction!(export, m)?,
        wrap_pyfunction!(diff, m)?,
        wrap_pyfunction!(sync, m)?,
        wrap_pyfunction!(program, m)?,
        wrap_pyfunction!(planners, m)?,
    ] {
        m.add_function(f)?;
    }
    m.add("TenplanError", py.get_type::<TenplanError>())?;
    m.add("LayoutError", py.get_type::<LayoutError>())?;
    m.add("InfeasibleError", py.get_type::<InfeasibleError>())?;
    m.add("PlanRejected", py.get_type::<PlanRejected>())?;
    m.add("SolverError", py.get_type::<SolverError>())?;
    m.add("CheckpointError", py.get_type::<CheckpointError>())?;
    Ok(())
}
