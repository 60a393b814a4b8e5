//! Every job-level operation of tenplan, written once, between the library
//! crates and the two faces (the `tenplan` command line and the Python
//! package), which only parse, convert and print.
//!
//! - Reconfigurations: [`plan()`] one problem with one planner (or
//!   [`plan_integral`]); price a move for a scheduler ([`Session::cost`]);
//!   sync weights from a trainer to inference engines ([`Session::sync`],
//!   [`compare_sync`]); plan hot switches between parallel strategies
//!   ([`Session::switch`]).
//! - Checkpoints: [`init`], [`import`], [`reshard()`], [`check()`],
//!   [`export()`], [`diff()`].
//!
//! Requests carry parsed values: layouts as [`Config`] (parsed, and spelled
//! as given for messages and manifests), clusters as
//! [`tenplan_ptc::Cluster`], planners as [`PlannerSpec`] (the one reader of
//! a planner's name). Every operation that plans goes through one path,
//! [`assess()`]: plan, check with the independent checker, bound, simulate.
//! The questions asked again and again (cost, sync, switch) are answered
//! from the [`Session`]'s plan cache, keyed by the typed request, least
//! recently used evicted first. Outcomes derive `Serialize`: the command
//! line's `--json` and the Python package's dicts are the same object.
//!
//! ```
//! use tenplan_application::{CostRequest, ModelMove, Session};
//! use tenplan_models::{find, StateKind};
//! use tenplan_ptc::Cluster;
//!
//! let session = Session::new();
//! let req = CostRequest {
//!     movement: ModelMove {
//!         model: find("gpt-tiny").unwrap().clone(),
//!         state: StateKind::Training,
//!         from: "tp=2,dp=2".parse().unwrap(),
//!         to: "tp=4".parse().unwrap(),
//!         cluster: Cluster::parse("1x4").unwrap(),
//!     },
//!     planner: "lp".parse().unwrap(),
//! };
//! let cost = session.cost(&req).unwrap();
//! assert!(cost.report.verified && cost.report.makespan_s >= cost.report.lower_bound_s * 0.999);
//! // Asked again: the same answer, from the cache.
//! assert!(std::sync::Arc::ptr_eq(&cost, &session.cost(&req).unwrap()));
//! ```
#![deny(missing_docs)]

pub mod assess;
pub mod cache;
mod check;
mod cluster;
mod create;
mod diff;
mod error;
mod export;
mod plan;
mod problem;
mod reshard;
mod stored;
mod switch;
mod sync;
pub mod units;

use std::sync::LazyLock;

pub use assess::{
    assess, assess_one, evaluate, evaluate_bounded, peak_resident_bytes, Assessed, Bound, PlanReport, Planned, Timings,
};
pub use cache::PlanCache;
pub use check::{check, Checked, CheckedKind};
pub use cluster::{default_cluster, fabric_summary};
pub use create::{import, init, ImportRequest, Imported, InitRequest, Initialized};
pub use diff::{diff, Diffed};
pub use error::{Error, Result};
pub use export::{export, model_weight_bytes, ExportOutcome, ExportRequest, DEFAULT_MAX_SHARD_BYTES};
pub use plan::{
    bound_only, plan, plan_integral, Cost, CostBound, CostRequest, IntegralOutcome, IntegralRequest, PlanRequest,
};
pub use problem::{check_problem_memory, read_input, read_plan, read_problem, Config, ModelMove, MAX_INPUT_BYTES};
pub use reshard::{is_optimizer_state, reshard, Format, Mesh, ReshardRequest, Resharded, Target};
pub use stored::{dcp_model, dcp_state, hf_model, original_config, ModelArg, OpenedSource, Progress};
pub use switch::{best_cycle, Schedule, Switch, SwitchKey, SwitchRequest, SwitchState};
pub use sync::{compare_sync, Conversion, SyncComparison, SyncPlan, SyncRequest};
pub use tenplan_planner::{Placement, PlannerSpec};

/// The questions a process asks again and again, answered once: costs,
/// weight syncs and hot switches, each in a [`PlanCache`] with least
/// recently used eviction. One session serves the threads of a process
/// ([`Session::global`] is the one the faces share).
#[derive(Debug, Default)]
pub struct Session {
    costs: PlanCache<CostRequest, Cost>,
    bounds: PlanCache<ModelMove, CostBound>,
    layouts: PlanCache<plan::LayoutKey, plan::BuiltLayout>,
    syncs: PlanCache<SyncRequest, SyncPlan>,
    switches: PlanCache<SwitchKey, Switch>,
}

impl Session {
    /// A session with empty caches and their default limits
    /// ([`cache::DEFAULT_MAX_ENTRIES`], [`cache::DEFAULT_MAX_BYTES`] each).
    pub fn new() -> Session {
        Session::default()
    }

    /// The process's session: what the Python package and the command line
    /// ask through.
    pub fn global() -> &'static Session {
        static GLOBAL: LazyLock<Session> = LazyLock::new(Session::new);
        &GLOBAL
    }

    /// Switch plans cached so far.
    pub fn cached_switches(&self) -> usize {
        self.switches.len()
    }

    /// Median time to fetch the switch `key` from the cache, in nanoseconds
    /// (see [`PlanCache::median_lookup_ns`]).
    pub fn switch_lookup_ns(&self, key: &SwitchKey) -> f64 {
        self.switches.median_lookup_ns(key)
    }
}

/// What `tenplan models` says of a model: its description, and the size of
/// its training state.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelSummary {
    /// The model's description.
    #[serde(flatten)]
    pub spec: tenplan_models::ModelSpec,
    /// Parameter tensors.
    pub tensors: usize,
    /// Parameters.
    pub parameters: u64,
    /// Bytes of its mixed-precision training state (bf16 weights, fp32
    /// master weights and Adam moments).
    pub training_state_bytes: u64,
}

/// A model's description and sizes.
pub fn describe_model(spec: &tenplan_models::ModelSpec) -> ModelSummary {
    let training = tenplan_models::ModelState::new(spec, tenplan_models::StateKind::Training);
    ModelSummary {
        spec: spec.clone(),
        tensors: training.parameter_tensors(),
        parameters: training.parameter_count(),
        training_state_bytes: training.tensors().iter().map(|t| t.bytes()).sum(),
    }
}
