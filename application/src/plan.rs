//! Plan one reconfiguration (`tenplan plan`), and price one for a
//! scheduler (`cost`, `cost_bound`): the same question, answered by
//! [`crate::assess`]; a scheduler's answers come from the session's cache
//! when they were asked before, and are computed on the layouts the
//! session built before and on the problem with its repeated tensors
//! stacked ([`tenplan_planner::symmetry`]) when not.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tenplan_planner::{
    fragments, plan_reduced, trivial_lower_bound, Fragment, LayoutClasses, LowerBound, LpPlannerBuilder, MipPlanner,
    MipReport, Placement, PlannerSpec, Reduced,
};
use tenplan_ptc::{Layout, Plan, Problem};

use crate::assess::{evaluate, evaluate_bounded, plan as plan_with, Assessed, Bound, PlanReport, Planned};
use crate::cache::Weigh;
use crate::problem::{Config, ModelMove};
use crate::{Error, Result, Session};

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

/// The certified lower bound of a move, without a plan: what a scheduler
/// comparing thousands of allocations asks first ([`Session::cost_bound`]).
#[derive(Clone, Debug, Serialize)]
pub struct CostBound {
    /// No plan of the move can take less (the cuts of the cluster and the
    /// message bound: see [`tenplan_planner::trivial_lower_bound`]; the
    /// same value as on the whole problem).
    pub lower_bound_s: f64,
    /// The cut that gives it.
    pub lower_bound_reason: String,
    /// Bytes that must reach a device that does not hold them (local
    /// copies excluded; data several devices need counted for each).
    pub bytes_to_move: u64,
}

impl Weigh for CostBound {
    fn weight(&self) -> u64 {
        (std::mem::size_of::<CostBound>() + self.lower_bound_reason.len()) as u64
    }
}

/// A model's state laid out under one configuration, with its tensor
/// classes: built once per (model, state, configuration) and shared by
/// every question about it.
#[derive(Debug)]
pub(crate) struct BuiltLayout {
    layout: Layout,
    classes: LayoutClasses,
}

impl Weigh for BuiltLayout {
    fn weight(&self) -> u64 {
        // About what a piece and its sub-tensor entry take.
        self.layout.pieces_held().saturating_mul(160)
    }
}

/// What names a [`BuiltLayout`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LayoutKey {
    model: tenplan_models::ModelSpec,
    state: tenplan_models::StateKind,
    config: Config,
}

impl std::hash::Hash for LayoutKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.model.name.hash(h);
        self.state.hash(h);
        self.config.hash(h);
    }
}

impl Session {
    /// The layout of `model`'s `state` under `config`, built (and checked
    /// against `cluster` and this machine's memory) the first time it is
    /// asked for; the configuration is checked against `cluster` every time.
    fn built_layout(&self, movement: &ModelMove, config: &Config, side: &'static str) -> Result<Arc<BuiltLayout>> {
        let named = |source| Error::Side { side, source };
        config.parsed().check_cluster(&movement.cluster).map_err(named)?;
        let key = LayoutKey {
            model: movement.model.clone(),
            state: movement.state,
            config: config.clone(),
        };
        self.layouts.get_or_insert_with(&key, || {
            let state = tenplan_models::ModelState::new(&movement.model, movement.state);
            state
                .check_plannable(config.parsed(), &movement.cluster)
                .map_err(named)?;
            let layout = state.layout(config.parsed()).map_err(named)?;
            let classes = LayoutClasses::of(&layout);
            Ok(BuiltLayout { layout, classes })
        })
    }

    /// A move's problem on the session's layouts (the problem
    /// [`ModelMove::problem`] poses), with the two built layouts.
    fn move_problem(&self, movement: &ModelMove) -> Result<(Problem, Arc<BuiltLayout>, Arc<BuiltLayout>)> {
        let from = self.built_layout(movement, &movement.from, "source")?;
        let to = self.built_layout(movement, &movement.to, "target")?;
        let problem = Problem::new(from.layout.clone(), to.layout.clone(), movement.cluster.clone())?;
        Ok((problem, from, to))
    }

    /// A move's problem on the session's layouts, and its reduction (none
    /// where no two tensors are interchangeable).
    fn reduced_move(&self, movement: &ModelMove) -> Result<(Problem, Option<Reduced>)> {
        let (problem, from, to) = self.move_problem(movement)?;
        let reduced = Reduced::with_classes(&problem, &from.classes, &to.classes)?;
        Ok((problem, reduced))
    }

    /// The cost of a move: planned, checked, bounded and simulated once,
    /// then answered from the cache. A plan the checker rejects is an
    /// error. The `lp` planner (fixed placement) plans the problem with
    /// its repeated tensors stacked and expands the plan: the same bytes
    /// on every resource as planning the whole problem, its bound valid
    /// for the whole, the expanded plan checked and simulated whole.
    pub fn cost(&self, req: &CostRequest) -> Result<Arc<Cost>> {
        self.costs.get_or_insert_with(req, || {
            let lp = req
                .planner
                .lp_builder()
                .filter(|_| req.planner.placement() == Placement::Fixed);
            let (problem, reduced) = match lp {
                Some(_) => self.reduced_move(&req.movement)?,
                None => (self.move_problem(&req.movement)?.0, None),
            };
            let a = match (lp, reduced) {
                (Some(lp), Some(reduced)) => cost_reduced(lp, &reduced)?,
                _ => evaluate(&problem, vec![plan_with(&problem, &req.planner)?], Bound::Shared).remove(0),
            }
            .verified()?;
            Ok(Cost {
                report: a.report,
                plan: a.plan,
            })
        })
    }

    /// The certified lower bound of a move, without planning it: computed
    /// once per question on the session's layouts and the reduced
    /// problem, then answered from the cache. The best plan's simulated
    /// time is [`Session::cost`]'s.
    pub fn cost_bound(&self, movement: &ModelMove) -> Result<Arc<CostBound>> {
        self.bounds.get_or_insert_with(movement, || {
            let (problem, reduced) = self.reduced_move(movement)?;
            bound_only(&problem, reduced.as_ref())
        })
    }
}

/// [`Session::cost`] of `lp` through the reduced problem: planned by the
/// LP planner `lp` describes, without HiGHS's presolve (the reduced LPs
/// have tens to hundreds of columns, solved in less time than it takes).
fn cost_reduced(lp: LpPlannerBuilder, reduced: &Reduced) -> Result<Assessed> {
    let start = Instant::now();
    let (plan, certified) = plan_reduced(&lp.presolve(false).build(), reduced)?;
    let planning_time_s = start.elapsed().as_secs_f64();
    // The bound, on the reduced problem (a bound on the whole): the
    // cuts and the message bound, raised to the planner's certificate.
    // `tenplan plan` also solves the bound LP where these stay below
    // the plan's load; a scheduler is not made to wait for it (on the
    // questions of `benches/python_cost.py` it costs more than the
    // plan and was tighter on none of 96).
    let start = Instant::now();
    let (cuts, _) = whole_trivial_bound(reduced.problem(), Some(reduced))?;
    let bound = match certified {
        Some(c) if c.seconds > cuts.seconds => c,
        _ => cuts,
    };
    let bound_s = start.elapsed().as_secs_f64();
    let planned = Planned {
        plan,
        planning_time_s,
        certified: None,
    };
    let mut a = evaluate_bounded(planned, &bound);
    a.report.timings.bound_s = bound_s;
    Ok(a)
}

/// The bound-only answer for a problem: [`Session::cost_bound`]'s, for any
/// problem, computed on its reduction where one is given (the same cuts
/// and bytes; each stacked piece counted as its members' pieces).
pub fn bound_only(problem: &Problem, reduced: Option<&Reduced>) -> Result<CostBound> {
    let (bound, frags) = whole_trivial_bound(problem, reduced)?;
    let bytes_to_move = frags
        .iter()
        .filter(|f| !f.holders.contains(&f.dst))
        .map(|f| f.bytes)
        .sum();
    Ok(CostBound {
        lower_bound_s: bound.seconds,
        lower_bound_reason: bound.reason,
        bytes_to_move,
    })
}

/// The whole problem's cuts and message bound, and the fragments they
/// were found from: the reduced problem's, each stacked piece counted as
/// its members', where a reduction is given.
fn whole_trivial_bound(problem: &Problem, reduced: Option<&Reduced>) -> Result<(LowerBound, Vec<Fragment>)> {
    let frags = fragments(reduced.map_or(problem, |r| r.problem()))?;
    let bound = match reduced {
        Some(r) => r.trivial_lower_bound(&frags),
        None => trivial_lower_bound(problem, &frags),
    };
    Ok((bound, frags))
}

#[cfg(test)]
mod tests {
    use tenplan_models::{find, StateKind};
    use tenplan_planner::{cut_lower_bound, fragments, trivial_lower_bound};
    use tenplan_ptc::Cluster;

    use super::*;

    fn movement(from: &str, to: &str) -> ModelMove {
        ModelMove {
            model: find("gpt3-1.3b").unwrap().clone(),
            state: StateKind::Training,
            from: from.parse().unwrap(),
            to: to.parse().unwrap(),
            cluster: Cluster::parse("dgx-h100:2").unwrap(),
        }
    }

    /// The scheduler's `lp` price plans the reduced problem: the same
    /// bytes on every resource as planning the whole, the expanded plan
    /// checked whole, a bound no plan beats.
    #[test]
    fn the_lp_price_is_the_whole_problems_optimum() {
        let session = Session::new();
        let m = movement("tp=4,dp=2", "tp=2,pp=2,dp=2,devices=8-15");
        let req = CostRequest {
            movement: m.clone(),
            planner: "lp".parse().unwrap(),
        };
        let cost = session.cost(&req).unwrap();
        assert!(cost.report.verified);
        let whole = plan(&PlanRequest {
            problem: m.problem().unwrap(),
            planner: "lp".parse().unwrap(),
            staging_budget: None,
        })
        .unwrap();
        let (a, b) = (cost.report.max_load_s, whole.report.max_load_s);
        assert!((a - b).abs() <= 1e-6 * b, "load {a} vs the whole problem's {b}");
        let (a, b) = (
            cost.report.bytes_cross_node as f64,
            whole.report.bytes_cross_node as f64,
        );
        assert!((a - b).abs() <= 1e-6 * b, "{a} bytes across nodes vs {b}");
        assert!(cost.report.lower_bound_s <= whole.report.makespan_s * (1.0 + 1e-9));
        assert!(cost.report.lower_bound_s >= whole.report.lower_bound_s * (1.0 - 1e-3));
        assert!(Arc::ptr_eq(&cost, &session.cost(&req).unwrap()));
    }

    /// The bound-only answer lies between the whole problem's cuts and its
    /// trivial bound, and every planner's plan takes at least as long.
    #[test]
    fn the_bound_only_answer_bounds_every_plan() {
        let session = Session::new();
        let m = movement("tp=8", "tp=2,pp=2,dp=4");
        let b = session.cost_bound(&m).unwrap();
        let problem = m.problem().unwrap();
        let frags = fragments(&problem).unwrap();
        let cut = cut_lower_bound(&problem, &frags).seconds;
        let trivial = trivial_lower_bound(&problem, &frags).seconds;
        assert!(b.lower_bound_s >= cut * (1.0 - 1e-9) && b.lower_bound_s <= trivial * (1.0 + 1e-9));
        for p in ["lp", "tenplex", "least-loaded"] {
            let c = session
                .cost(&CostRequest {
                    movement: m.clone(),
                    planner: p.parse().unwrap(),
                })
                .unwrap();
            assert!(c.report.makespan_s >= b.lower_bound_s * (1.0 - 1e-9), "{p}");
        }
        // Two configurations asked about, again and again: two layouts
        // built; a third configuration adds one.
        assert_eq!(session.layouts.len(), 2);
        session
            .cost_bound(&movement("tp=2,pp=2,dp=4", "tp=8,devices=8-15"))
            .unwrap();
        assert_eq!(session.layouts.len(), 3);
    }

    /// A configuration the cluster cannot hold is refused naming its side,
    /// layouts cached or not.
    #[test]
    fn a_configuration_too_large_is_refused_naming_its_side() {
        let session = Session::new();
        session.cost_bound(&movement("tp=8", "tp=8,devices=8-15")).unwrap();
        let e = session.cost_bound(&movement("tp=8", "tp=8,dp=4")).unwrap_err();
        assert!(e.to_string().contains("target"), "{e}");
        let e = session.cost_bound(&movement("tp=8,dp=4", "tp=8")).unwrap_err();
        assert!(e.to_string().contains("source"), "{e}");
    }
}
