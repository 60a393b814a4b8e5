//! Reconfiguration planners for tenplan.
//!
//! A planner turns a [`Problem`](tenplan_ptc::Problem) (source layout, target layout, cluster) into
//! a [`Plan`](tenplan_ptc::Plan). This crate holds the transfer-graph construction (cutting
//! target pieces by source sub-tensors into [`Fragment`]s), the baseline
//! policies (`tenplex`, `central`, `least-loaded`, `hotspa`, and for weight
//! syncs `static-p2p`, checkpoint-engine's `broadcast` and broadcast
//! `trees`), the optimal
//! LP planner `lp` (HiGHS) with a certified lower bound, the cost model
//! with its lower bound, and the flow-level simulator that judges plans.
//!
//! ```
//! use tenplan_models::{find, ModelState, StateKind};
//! use tenplan_planner::{planner, simulate};
//! use tenplan_ptc::{Cluster, Problem};
//!
//! let state = ModelState::new(find("gpt-tiny").unwrap(), StateKind::Training);
//! let from = state.layout(&"tp=2,pp=2".parse().unwrap()).unwrap();
//! let to = state.layout(&"tp=4,pp=2".parse().unwrap()).unwrap();
//! let problem = Problem::new(from, to, Cluster::parse("2x4").unwrap()).unwrap();
//! let plan = planner("hotspa").unwrap().plan(&problem).unwrap();
//! assert!(simulate(&plan).makespan_s > 0.0);
//! ```
#![deny(missing_docs)]

mod baselines;
mod broadcast;
pub mod cost;
mod error;
mod intersect;
pub mod issue;
pub mod lp;
mod mip;
mod ord;
mod par;
pub mod placement;
mod sim;
mod spec;
pub mod symmetry;
mod trees;

pub use baselines::{Central, HotSpa, LeastLoaded, StaticP2p, Tenplex};
pub use broadcast::{broadcast_floor, Broadcast, BroadcastFloor, BUCKET_BYTES};
pub use cost::{
    cut_lower_bound, issue_lower_bound, trivial_lower_bound, trivial_lower_bound_weighted, Loads, LowerBound, Resource,
};
pub use error::{Error, Infeasible, Missing, Result, SolverFailure};
pub use intersect::{fragments, padding_fills, Fragment};
pub use lp::{
    lower_bound, lower_bound_below, lower_bound_given, LpPlanner, LpPlannerBuilder, Placement, BOUND_SLACK,
    PORTFOLIO_MAX_COPIES, PORTFOLIO_MAX_STREAMS,
};
pub use mip::{MipPlanner, MipReport};
pub(crate) use ord::OrdF64;
pub use sim::{simulate, SimReport};
pub use spec::{planner, Planner, PlannerSpec, Policy, PLANNERS, SYNC_COMPARED, SYNC_PLANNERS};
pub use symmetry::{plan_reduced, LayoutClasses, Reduced, Symmetric};
pub use trees::Trees;

/// A real model's reshard for unit tests: GPT-3 1.3B with Adam state from
/// (tp4, pp2, dp4) to (tp2, pp4, dp3) on four nodes of eight devices.
#[cfg(test)]
pub(crate) fn gpt3_reshard() -> tenplan_ptc::Problem {
    use tenplan_models::{find, ModelState, StateKind};
    let state = ModelState::new(find("gpt3-1.3b").unwrap(), StateKind::Training);
    let from = state.layout(&"tp=4,pp=2,dp=4".parse().unwrap()).unwrap();
    let to = state.layout(&"tp=2,pp=4,dp=3".parse().unwrap()).unwrap();
    tenplan_ptc::Problem::new(from, to, tenplan_ptc::Cluster::parse("4x8").unwrap()).unwrap()
}
