//! Planner errors: "no plan exists" is data, rendered by [`Infeasible::report`].

use std::fmt;

use tenplan_ptc::{DeviceId, Region};

/// A box of the target state that no live device holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    /// Tensor name.
    pub tensor: String,
    /// The box no live device holds.
    pub region: Region,
    /// The devices that held it, all dead.
    pub dead_holders: Vec<DeviceId>,
}

/// Why no plan exists: every target box whose source is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Infeasible {
    /// Every missing (tensor, box), in tensor order, deduplicated.
    pub missing: Vec<Missing>,
}

impl Infeasible {
    /// A multi-line report listing every missing box.
    pub fn report(&self) -> String {
        let mut s = format!("no plan exists: {} boxes have no live holder\n", self.missing.len());
        for m in &self.missing {
            s += &format!(
                "  {} {} (held only by dead devices {:?})\n",
                m.tensor, m.region, m.dead_holders
            );
        }
        s
    }
}

impl fmt::Display for Infeasible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.missing.len();
        match self.missing.first() {
            Some(m) => write!(
                f,
                "no plan exists: {bytes} boxes have no live holder, first `{}` {} (held only by dead devices {:?})",
                m.tensor, m.region, m.dead_holders
            ),
            None => write!(f, "no plan exists"),
        }
    }
}

/// How the LP solver failed: typed, never a bare string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SolverFailure {
    /// The LP is infeasible (a bug: every problem with live holders has a plan).
    #[error("the LP is infeasible")]
    Infeasible,
    /// The LP is unbounded (a bug: the makespan is bounded below by zero).
    #[error("the LP is unbounded")]
    Unbounded,
    /// The time limit passed before an optimal solution was found.
    #[error("the solver reached its time limit")]
    TimeLimit,
    /// Another failure reported by HiGHS.
    #[error("HiGHS failed: {0}")]
    Other(String),
}

/// Why planning failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Some target state has no live source.
    #[error("{0}")]
    Infeasible(Infeasible),
    /// The LP solver failed.
    #[error("LP solver: {0}")]
    Solver(SolverFailure),
    /// A problem or layout the planner built is invalid (a bug in the planner).
    #[error(transparent)]
    Ptc(#[from] tenplan_ptc::Error),
    /// Solving would need more memory than the machine has available;
    /// found before the memory is allocated.
    #[error(
        "the LP would need about {} GB ({columns} columns, {nonzeros} nonzeros), more than the {} GB available",
        *need as f64 / 1e9,
        *available as f64 / 1e9
    )]
    TooLarge {
        /// Estimated bytes.
        need: u64,
        /// Bytes available.
        available: u64,
        /// Columns of the LP.
        columns: usize,
        /// Nonzeros of its matrix.
        nonzeros: usize,
    },
    /// Optimizing the placement of this many target ranks is out of reach:
    /// its transportation problem (target shards against the target's
    /// devices) has more pairs than it takes on; found before any cost is
    /// computed.
    #[error(
        "placement optimization of {ranks} target ranks in {shards} shards: {} (shard, device) pairs is more than {max}; keep the fixed placement at this size",
        *shards as u64 * *ranks as u64
    )]
    PlacementTooLarge {
        /// Target ranks (devices of the target layout).
        ranks: usize,
        /// Target shards (ranks of one shard need the same data).
        shards: usize,
        /// The most pairs placement optimization takes on.
        max: usize,
    },
    /// The planner forwards data across nodes, which the problem does not
    /// allow (its forwarding is within nodes).
    #[error(
        "the `{planner}` planner forwards across nodes, and the problem forwards within nodes only: pose it with cluster forwarding (`--forwarding cluster`, or `\"forwarding\": \"cluster\"` in the problem file)"
    )]
    NeedsClusterForwarding {
        /// The planner.
        planner: &'static str,
    },
    /// No planner of that name.
    #[error("unknown planner `{name}` (known: {known})")]
    UnknownPlanner {
        /// The name given.
        name: String,
        /// Known planners.
        known: String,
    },
    /// No placement of that name.
    #[error("unknown placement `{name}` (expected fixed or optimize)")]
    UnknownPlacement {
        /// The name given.
        name: String,
    },
    /// An option only the `lp` planner has, asked of another planner.
    #[error("{option} needs the lp planner, not {planner}")]
    NeedsLp {
        /// The option, as the command line spells it.
        option: &'static str,
        /// The planner asked.
        planner: &'static str,
    },
    /// A number of solver threads this machine cannot run.
    #[error("{threads} solver threads: expected 1 to {cores} (the cores of this machine)")]
    Threads {
        /// Threads asked for.
        threads: u32,
        /// Cores of this machine.
        cores: u32,
    },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
