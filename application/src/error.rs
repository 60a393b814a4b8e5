//! Why an operation failed: the library crates' errors, typed, and what
//! only a job-level request can get wrong.

use tenplan_ptc::DType;

/// Why an operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Planning failed (an infeasible problem carries its missing boxes).
    #[error(transparent)]
    Planning(#[from] tenplan_planner::Error),
    /// Performing a plan failed.
    #[error(transparent)]
    Execution(#[from] tenplan_executor::Error),
    /// A file could not be read or written.
    #[error(transparent)]
    Format(#[from] tenplan_formats::Error),
    /// A model or a parallel layout that cannot be built.
    #[error(transparent)]
    Model(#[from] tenplan_models::Error),
    /// A cluster, problem or layout that is invalid.
    #[error(transparent)]
    Ptc(#[from] tenplan_ptc::Error),
    /// Staging rounds cannot be made under the budget.
    #[error(transparent)]
    Staging(#[from] tenplan_planner::issue::StagingError),
    /// One side of a move (`source` or `target`) is not a valid layout of
    /// the model on the cluster.
    #[error("{side} layout: {source}")]
    Side {
        /// `source` or `target`.
        side: &'static str,
        /// What is wrong with it.
        #[source]
        source: tenplan_models::Error,
    },
    /// The target layout does not fit the cluster.
    #[error("the target layout does not fit: {source}")]
    TargetLayout {
        /// Why.
        #[source]
        source: tenplan_ptc::Error,
    },
    /// A planner produced a plan the independent checker rejects (a bug in
    /// that planner); nothing was performed.
    #[error("planner {planner} produced a plan that {verdict}")]
    Rejected {
        /// The planner.
        planner: String,
        /// The checker's verdict.
        verdict: String,
    },
    /// A plan the independent checker rejects, given to be performed;
    /// nothing was performed.
    #[error("plan rejected: {verdict}")]
    PlanRejected {
        /// The checker's verdict.
        verdict: String,
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
        /// What is wrong with it.
        #[source]
        source: tenplan_models::Error,
    },
    /// A layout of a request (a weight sync's trainer or engines, a cost's
    /// source or target) is not a valid layout of the model on the cluster.
    #[error("layout `{layout}`: {source}")]
    Layout {
        /// The layout as given.
        layout: String,
        /// What is wrong with it.
        #[source]
        source: tenplan_models::Error,
    },
    /// A weight sync asks for an element-type conversion that cannot be
    /// made (a non-floating-point type).
    #[error("weight sync: cannot convert the weights from {from} to {to} (floating-point types only)")]
    Conversion {
        /// The type the trainer holds.
        from: DType,
        /// The type the engines want.
        to: DType,
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
    /// A request that contradicts what it names (a model given for a
    /// checkpoint that names its own, an output that is the source, ...).
    #[error("{what}")]
    Request {
        /// What is wrong.
        what: String,
    },
}

impl Error {
    /// A request error with this message.
    pub(crate) fn request(what: impl Into<String>) -> Error {
        Error::Request { what: what.into() }
    }

    /// The planner's account of why no plan exists, when that is the error.
    pub fn infeasible(&self) -> Option<&tenplan_planner::Infeasible> {
        match self {
            Error::Planning(tenplan_planner::Error::Infeasible(inf)) => Some(inf),
            _ => None,
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
