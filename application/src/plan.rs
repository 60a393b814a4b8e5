//! Plan one reconfiguration (`tenplan plan`), and price one for a
//! scheduler (`cost`): the same question, answered by [`crate::assess`];
//! `cost` answers from the session's cache when it was asked before.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tenplan_planner::{MipPlanner, MipReport, PlannerSpec};
use tenplan_ptc::{Plan, Problem};

use crate::assess::{evaluate, plan as plan_with, Assessed, Bound, PlanReport, Planned};
use crate::cache::Weigh;
use crate::problem::ModelMove;
use crate::{Result, Session};

/// One problem, one planner: `tenplan plan`.
#[derive(Clone, Debug)]
pub struct PlanRequest {
    /// The problem.
    pub problem: Problem,
    /// The planner.
    pub planner: PlannerSpec,
    /// Split the plan into staging rounds so that no device receives more
    /// than this many bytes from others at once.
    pub staging_budget: Option<u64>,
}

/// Plan, stage if asked, check, bound and simulate. A plan the checker
/// rejects is returned with its report (`verified: false`) for the caller
/// to show; use [`Assessed::verified`] to make it an error.
pub fn plan(req: &PlanRequest) -> Result<Assessed> {
    let mut planned = plan_with(&req.problem, &req.planner)?;
    if let Some(b) = req.staging_budget {
        planned = planned.staged(b)?;
    }
    Ok(evaluate(&req.problem, vec![planned], Bound::Shared).remove(0))
}

/// The integer variant of a problem: whole fragments, direct paths,
/// per-message cost, solved as a MIP with a time limit (small instances).
#[derive(Clone, Debug)]
pub struct IntegralRequest {
    /// The problem.
    pub problem: Problem,
    /// The MIP solver's time limit.
    pub time_limit_s: f64,
    /// HiGHS threads.
    pub threads: u32,
    /// As [`PlanRequest::staging_budget`].
    pub staging_budget: Option<u64>,
}

/// An integral plan and how good the MIP says it is.
#[derive(Clone, Debug)]
pub struct IntegralOutcome {
    /// The plan, checked, bounded and simulated.
    pub assessed: Assessed,
    /// The MIP's status, gap and size.
    pub mip: MipReport,
}

/// Solve the integer variant; the plan takes the common path from there.
pub fn plan_integral(req: &IntegralRequest) -> Result<IntegralOutcome> {
    let mip = MipPlanner {
        time_limit_s: req.time_limit_s,
        threads: req.threads,
        ..Default::default()
    };
    let start = Instant::now();
    let (plan, report) = mip.plan_with_report(&req.problem)?;
    let mut planned = Planned::given(plan);
    if let Some(b) = req.staging_budget {
        planned = planned.staged(b)?;
    }
    planned.planning_time_s = start.elapsed().as_secs_f64();
    Ok(IntegralOutcome {
        assessed: evaluate(&req.problem, vec![planned], Bound::Shared).remove(0),
        mip: report,
    })
}

/// What moving a job costs: a model's state from one configuration to
/// another on a cluster, with one planner. The scheduler's question.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CostRequest {
    /// The move.
    pub movement: ModelMove,
    /// The planner.
    pub planner: PlannerSpec,
}

/// The answer to a [`CostRequest`]: the plan's report (simulated makespan,
/// certified lower bound, bytes moved and across nodes, ...), and the plan.
#[derive(Clone, Debug, Serialize)]
pub struct Cost {
    /// The plan, checked, bounded and simulated.
    #[serde(flatten)]
    pub report: PlanReport,
    /// The plan itself.
    #[serde(skip)]
    pub plan: Arc<Plan>,
}

impl Weigh for Cost {
    fn weight(&self) -> u64 {
        self.plan.weight()
    }
}

impl Session {
    /// The cost of a move: planned, checked, bounded and simulated once,
    /// then answered from the cache. A plan the checker rejects is an
    /// error.
    pub fn cost(&self, req: &CostRequest) -> Result<Arc<Cost>> {
        self.costs.get_or_insert_with(req, || {
            let problem = req.movement.problem()?;
            let a = evaluate(&problem, vec![plan_with(&problem, &req.planner)?], Bound::Shared)
                .remove(0)
                .verified()?;
            Ok(Cost {
                report: a.report,
                plan: a.plan,
            })
        })
    }
}
