//! Reconfiguration planners for tenplan.
//!
//! A planner turns a [`Problem`] (source layout, target layout, cluster) into
//! a [`Plan`]. This crate holds the transfer-graph construction (cutting
//! target pieces by source sub-tensors into [`Fragment`]s), the baseline
//! policies (`tenplex`, `central`, `least-loaded`, `hotspa`), the optimal
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
pub mod cost;
mod error;
mod intersect;
pub mod lp;
mod mip;
pub mod placement;
pub mod schedule;
mod sim;

pub use baselines::{Central, HotSpa, LeastLoaded, Tenplex};
pub use cost::{cut_lower_bound, issue_lower_bound, trivial_lower_bound, Loads, LowerBound, Resource};
pub use error::{Error, Infeasible, Missing, Result, SolverFailure};
pub use intersect::{fragments, padding_fills, Fragment};
pub use lp::{lower_bound, lower_bound_below, LpPlanner, LpPlannerBuilder, Placement, BOUND_SLACK};
pub use mip::{MipPlanner, MipReport};
pub use sim::{simulate, SimReport};

use tenplan_ptc::{Plan, Problem};

/// An `f64` ordered by `total_cmp`, for heaps of times and prices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct OrdF64(pub(crate) f64);

impl Eq for OrdF64 {}

impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for OrdF64 {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// Something that plans reconfigurations.
pub trait Planner {
    /// The name used on the command line and in plan files.
    fn name(&self) -> &'static str;
    /// Plan the problem, or say why no plan exists.
    fn plan(&self, problem: &Problem) -> Result<Plan>;
}

/// Names of every planner, in the order reports list them.
pub const PLANNERS: &[&str] = &["lp", "lp-placed", "tenplex", "central", "least-loaded", "hotspa"];

/// A planner by name.
pub fn planner(name: &str) -> Result<Box<dyn Planner>> {
    Ok(match name {
        "lp" => Box::new(LpPlanner::default()),
        "lp-placed" => Box::new(LpPlanner::builder().placement(Placement::Optimize).build()),
        "tenplex" => Box::new(Tenplex),
        "central" => Box::new(Central),
        "least-loaded" => Box::new(LeastLoaded),
        "hotspa" => Box::new(HotSpa),
        _ => {
            return Err(Error::UnknownPlanner {
                name: name.to_string(),
                known: PLANNERS.join(", "),
            })
        }
    })
}
