//! The planner trait and the planners by name.

use tenplan_ptc::{Plan, Problem};

use crate::LowerBound;
use crate::{Broadcast, Central, Error, HotSpa, LeastLoaded, LpPlanner, Placement, Result, StaticP2p, Tenplex, Trees};

/// Something that plans reconfigurations.
pub trait Planner {
    /// The name used on the command line and in plan files.
    fn name(&self) -> &'static str;
    /// Plan the problem, or say why no plan exists.
    fn plan(&self, problem: &Problem) -> Result<Plan>;

    /// Plan the problem, with a lower bound on the makespan of every plan
    /// of the plan's problem where planning certified one on the way (the
    /// LP on a fabric); `None` where it did not.
    fn plan_with_bound(&self, problem: &Problem) -> Result<(Plan, Option<LowerBound>)> {
        Ok((self.plan(problem)?, None))
    }
}

/// Names of every planner, in the order reports list them.
pub const PLANNERS: &[&str] = &["lp", "lp-placed", "tenplex", "central", "least-loaded", "hotspa"];

/// Planners of weight syncs above all (RL post-training), beside
/// [`PLANNERS`]: the published point-to-point and broadcast policies, and
/// broadcast trees among the receivers (`tenplan sync`, the rl suite).
pub const SYNC_PLANNERS: &[&str] = &["static-p2p", "broadcast", "trees"];

/// The planners a weight sync is compared with unless asked otherwise
/// (`tenplan sync`, `tenplan bench --suite rl`): the optimal planner, the
/// published sync policy, and the reshard baselines.
pub const SYNC_COMPARED: &[&str] = &["lp", "static-p2p", "broadcast", "hotspa", "least-loaded", "tenplex"];

/// A planner by name.
pub fn planner(name: &str) -> Result<Box<dyn Planner>> {
    Ok(match name {
        "lp" => Box::new(LpPlanner::default()),
        "lp-placed" => Box::new(LpPlanner::builder().placement(Placement::Optimize).build()),
        "tenplex" => Box::new(Tenplex),
        "central" => Box::new(Central),
        "least-loaded" => Box::new(LeastLoaded),
        "hotspa" => Box::new(HotSpa),
        "static-p2p" => Box::new(StaticP2p),
        "trees" => Box::new(Trees),
        "broadcast" => Box::new(Broadcast),
        _ => {
            return Err(Error::UnknownPlanner {
                name: name.to_string(),
                known: [PLANNERS, SYNC_PLANNERS].concat().join(", "),
            })
        }
    })
}
