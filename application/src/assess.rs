//! The one path every operation takes from a problem to an answer: plan
//! ([`plan`]), check every plan with the independent checker, bound the
//! problem, and simulate ([`evaluate`]); [`assess`] does all of it for one
//! problem and any number of planners.
//!
//! ```
//! use tenplan_application::{assess, Bound};
//! use tenplan_models::{find, ModelState, StateKind};
//! use tenplan_planner::PlannerSpec;
//! use tenplan_ptc::{Cluster, Problem};
//!
//! let state = ModelState::new(find("gpt-tiny").unwrap(), StateKind::Training);
//! let from = state.layout(&"tp=2,dp=2".parse().unwrap()).unwrap();
//! let to = state.layout(&"tp=4".parse().unwrap()).unwrap();
//! let problem = Problem::new(from, to, Cluster::parse("1x4").unwrap()).unwrap();
//! let specs: Vec<PlannerSpec> = ["lp", "tenplex"].iter().map(|p| p.parse().unwrap()).collect();
//! let answers = assess(&problem, &specs, Bound::Shared).unwrap();
//! for a in &answers {
//!     assert!(a.report.verified);
//!     assert!(a.report.makespan_s >= a.report.lower_bound_s * 0.999);
//! }
//! ```

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tenplan_planner::cost::Loads;
use tenplan_planner::{lower_bound, lower_bound_given, simulate, LowerBound, PlannerSpec};
use tenplan_proofs::check;
use tenplan_ptc::{Plan, Problem};

use crate::{Error, Result};

/// The evaluation of one plan.
#[derive(Clone, Debug, Serialize)]
pub struct PlanReport {
    /// Planner that produced it.
    pub planner: String,
    /// Bytes copied, local copies included.
    pub bytes_total: u64,
    /// Bytes sent between devices.
    pub bytes_moved: u64,
    /// Bytes crossing a node boundary.
    pub bytes_cross_node: u64,
    /// Load of the busiest resource, in seconds at full capacity.
    pub max_load_s: f64,
    /// The busiest resource.
    pub bottleneck: String,
    /// Simulated makespan (flow-level, max-min fair, per-message latency).
    pub makespan_s: f64,
    /// Lower bound on any plan's makespan for this problem.
    pub lower_bound_s: f64,
    /// What gives the lower bound.
    pub lower_bound_reason: String,
    /// makespan / lower bound − 1.
    pub gap: f64,
    /// Time the planner took.
    pub planning_time_s: f64,
    /// Whether the independent checker accepted the plan.
    pub verified: bool,
    /// The checker's verdict.
    pub verdict: String,
    /// Number of copies.
    pub copies: usize,
    /// Number of zero-fills.
    pub fills: usize,
    /// Staging rounds (1 when the plan is not staged).
    pub rounds: u32,
    /// Where the evaluation's time went, in seconds.
    pub timings: Timings,
    /// The process's peak resident memory when the report was made (Linux:
    /// `VmHWM`), set by commands that plan one problem per process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
}

/// Seconds each step of an evaluation took (planning is
/// [`PlanReport::planning_time_s`]).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timings {
    /// The lower bound (shared by the plans of one problem).
    pub bound_s: f64,
    /// The independent checker.
    pub verify_s: f64,
    /// The cost model's loads.
    pub loads_s: f64,
    /// The flow-level simulation.
    pub simulate_s: f64,
}

/// This process's peak resident memory so far, where the system tells it
/// (Linux `/proc/self/status`, `VmHWM`).
pub fn peak_resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// A plan as a planner made it: how long that took, and the lower bound it
/// certified on the way (the LP planner's), if any.
#[derive(Clone, Debug)]
pub struct Planned {
    /// The plan (not checked yet).
    pub plan: Plan,
    /// Seconds planning took.
    pub planning_time_s: f64,
    /// A bound on every plan of the plan's problem, certified by the planner.
    pub certified: Option<LowerBound>,
}

impl Planned {
    /// A plan that came from elsewhere (a file, another tool): nothing
    /// certified, no planning time.
    pub fn given(plan: Plan) -> Planned {
        Planned {
            plan,
            planning_time_s: 0.0,
            certified: None,
        }
    }

    /// The plan split into staging rounds so that no device receives more
    /// than `budget` bytes from others at once (see
    /// [`tenplan_planner::issue::stage`]); its certificate still holds.
    pub fn staged(self, budget: u64) -> Result<Planned> {
        Ok(Planned {
            plan: tenplan_planner::issue::stage(&self.plan, budget)?,
            ..self
        })
    }
}

/// Plan `problem` with the planner `spec` describes, timed.
pub fn plan(problem: &Problem, spec: &PlannerSpec) -> Result<Planned> {
    let planner = spec.build();
    let start = Instant::now();
    let (plan, certified) = planner.plan_with_bound(problem)?;
    Ok(Planned {
        plan,
        planning_time_s: start.elapsed().as_secs_f64(),
        certified,
    })
}

/// A plan, checked, bounded and simulated.
#[derive(Clone, Debug)]
pub struct Assessed {
    /// The plan (shared, not copied, by caches).
    pub plan: Arc<Plan>,
    /// What it costs and whether the checker accepted it.
    pub report: PlanReport,
}

impl Assessed {
    /// The same, or an error naming the planner and the checker's verdict
    /// when the checker rejected the plan.
    pub fn verified(self) -> Result<Assessed> {
        if self.report.verified {
            Ok(self)
        } else {
            Err(Error::Rejected {
                planner: self.report.planner,
                verdict: self.report.verdict,
            })
        }
    }
}

/// How the lower bound beside a plan is found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Bound {
    /// Once per problem for every plan of it: the LP bound, except where
    /// the cuts or a planner's certificate come within
    /// [`tenplan_planner::BOUND_SLACK`] of the best plan's load (no bound
    /// can exceed that load, so the LP could add less than the slack).
    #[default]
    Shared,
    /// The LP bound solved to its end, whatever the plans' loads.
    Exact,
}

/// Check, load and simulate plans, and bound their problems: the plans of
/// `problem` share one bound ([`Bound`] says how it is found); a plan of
/// another problem (a placing planner answers a re-placed problem) is
/// bounded on its own. A plan the checker rejects is reported as such (not
/// simulated, its makespan NaN), never an error here: each operation
/// decides what a rejected plan means ([`Assessed::verified`]).
pub fn evaluate(problem: &Problem, planned: Vec<Planned>, bound: Bound) -> Vec<Assessed> {
    let mut out: Vec<(Assessed, Option<LowerBound>)> = planned
        .into_iter()
        .map(|p| {
            let report = unbounded_report(&p.plan, p.planning_time_s);
            (
                Assessed {
                    plan: Arc::new(p.plan),
                    report,
                },
                p.certified,
            )
        })
        .collect();
    // The plans of this problem: their best verified load caps the bound,
    // and the best certificate among them may already be it.
    let shared = |a: &Assessed| a.plan.problem == *problem;
    let upper = out
        .iter()
        .filter(|(a, _)| shared(a) && a.report.verified)
        .map(|(a, _)| a.report.max_load_s)
        .fold(f64::INFINITY, f64::min);
    let mut known: Option<&LowerBound> = None;
    for (a, c) in &out {
        if let Some(c) = c.as_ref().filter(|_| shared(a)) {
            if known.is_none_or(|k| c.seconds > k.seconds) {
                known = Some(c);
            }
        }
    }
    let known = known.cloned();
    let common = out
        .iter()
        .any(|(a, _)| shared(a))
        .then(|| timed_bound(problem, upper, known.as_ref(), bound));
    for (a, certified) in &mut out {
        let (b, took) = match (&common, shared(a)) {
            (Some(common), true) => common.clone(),
            _ => {
                let upper = if a.report.verified {
                    a.report.max_load_s
                } else {
                    f64::INFINITY
                };
                timed_bound(&a.plan.problem, upper, certified.as_ref(), bound)
            }
        };
        a.report.set_bound(&b);
        a.report.timings.bound_s = took;
    }
    out.into_iter().map(|(a, _)| a).collect()
}

/// Check, load and simulate one plan whose bound was found beforehand
/// (on a reduced problem, say: [`tenplan_planner::symmetry`]).
pub fn evaluate_bounded(planned: Planned, bound: &LowerBound) -> Assessed {
    let mut report = unbounded_report(&planned.plan, planned.planning_time_s);
    report.set_bound(bound);
    Assessed {
        plan: Arc::new(planned.plan),
        report,
    }
}

/// Plan `problem` with every planner of `planners`, then [`evaluate`] the
/// plans (one shared bound). Planning errors (no plan exists, the solver
/// failed) are errors; a rejected plan is reported, not an error.
pub fn assess(problem: &Problem, planners: &[PlannerSpec], bound: Bound) -> Result<Vec<Assessed>> {
    let planned = planners.iter().map(|s| plan(problem, s)).collect::<Result<Vec<_>>>()?;
    Ok(evaluate(problem, planned, bound))
}

/// [`assess`] with one planner.
pub fn assess_one(problem: &Problem, planner: &PlannerSpec, bound: Bound) -> Result<Assessed> {
    let mut all = assess(problem, std::slice::from_ref(planner), bound)?;
    Ok(all.remove(0))
}

/// A lower bound on every plan of `problem` and the seconds it took; a
/// bound that cannot be computed is reported as NaN with the reason.
fn timed_bound(problem: &Problem, upper: f64, known: Option<&LowerBound>, bound: Bound) -> (LowerBound, f64) {
    let start = Instant::now();
    let b = match bound {
        Bound::Shared => lower_bound_given(problem, upper, known),
        Bound::Exact => lower_bound(problem),
    }
    .unwrap_or_else(|e| LowerBound {
        seconds: f64::NAN,
        reason: e.to_string(),
    });
    (b, start.elapsed().as_secs_f64())
}

/// A plan checked, loaded and simulated; its bound still to be set.
fn unbounded_report(plan: &Plan, planning_time_s: f64) -> PlanReport {
    let cluster = plan.problem.cluster();
    let mut timings = Timings::default();
    let start = Instant::now();
    let verdict = check(plan);
    let verified = verdict.is_ok();
    timings.verify_s = start.elapsed().as_secs_f64();
    let start = Instant::now();
    // The cost model indexes the problem by the plan's tensors and devices:
    // cost only a plan whose indices are in range.
    let loads = if verified || plan.validate_indices().is_ok() {
        Loads::of(plan)
    } else {
        Loads::default()
    };
    let (max_load_s, bottleneck) = loads.max_time(cluster);
    timings.loads_s = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let makespan_s = if verified { simulate(plan).makespan_s } else { f64::NAN };
    timings.simulate_s = start.elapsed().as_secs_f64();
    PlanReport {
        planner: plan.planner.clone(),
        bytes_total: loads.moved + loads.local,
        bytes_moved: loads.moved,
        bytes_cross_node: loads.cross_node,
        max_load_s,
        bottleneck: bottleneck.map_or("none".into(), |r| r.to_string()),
        makespan_s,
        lower_bound_s: f64::NAN,
        lower_bound_reason: "not computed".into(),
        gap: f64::NAN,
        planning_time_s,
        verified,
        verdict: match verdict {
            Ok(c) => c.to_string(),
            Err(v) => format!("rejected: {v}"),
        },
        copies: plan.copies.len(),
        fills: plan.fills.len(),
        rounds: plan.copies.iter().map(|c| c.round + 1).max().unwrap_or(1),
        timings,
        peak_memory_bytes: None,
    }
}

/// makespan / bound − 1 (0 where the bound is 0).
fn gap(makespan_s: f64, bound_s: f64) -> f64 {
    if bound_s > 0.0 {
        makespan_s / bound_s - 1.0
    } else {
        0.0
    }
}

impl PlanReport {
    /// Report against `bound` instead of the one it was evaluated with.
    pub fn set_bound(&mut self, bound: &LowerBound) {
        self.lower_bound_s = bound.seconds;
        self.lower_bound_reason = bound.reason.clone();
        self.gap = gap(self.makespan_s, bound.seconds);
    }
}
