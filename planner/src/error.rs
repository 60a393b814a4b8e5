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
    /// A hot-switching request names fewer than 2 or more than 16 strategies.
    #[error("give 2 to 16 strategies (got {got})")]
    StrategyCount {
        /// Strategies given.
        got: usize,
    },
    /// A strategy of a hot-switching request is not a valid layout of the
    /// model on the cluster.
    #[error("strategy `{strategy}`: {source}")]
    Strategy {
        /// The strategy as given.
        strategy: String,
        /// What is wrong with it (boxed: the error stays small on the
        /// planner's hot paths).
        #[source]
        source: Box<tenplan_models::Error>,
    },
    /// A layout of a weight sync (the trainer's or the engines') is not a
    /// valid layout of the model on the cluster.
    #[error("layout `{layout}`: {source}")]
    Layout {
        /// The layout as given.
        layout: String,
        /// What is wrong with it.
        #[source]
        source: Box<tenplan_models::Error>,
    },
    /// A weight sync asks for an element-type conversion that cannot be
    /// made (a non-floating-point type).
    #[error("weight sync: cannot convert the weights from {from} to {to} (floating-point types only)")]
    Conversion {
        /// The type the trainer holds.
        from: tenplan_ptc::DType,
        /// The type the engines want.
        to: tenplan_ptc::DType,
    },
    /// A planner produced a plan the independent checker rejects (a bug in
    /// that planner).
    #[error("planner {planner} produced a plan that {verdict}")]
    Rejected {
        /// The planner.
        planner: String,
        /// The checker's verdict.
        verdict: String,
    },
    /// No order of the strategies keeps every switch within the memory budget.
    #[error(
        "no order of the strategies fits the memory budget of {budget} bytes per device \
         (a switch holds both layouts; the smallest switch needs {smallest} bytes)"
    )]
    OverBudget {
        /// Bytes each device may hold.
        budget: u64,
        /// Bytes the cheapest switch needs on its fullest device.
        smallest: u64,
    },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
