//! What a plan costs and whether it is correct: the numbers every command prints.

use std::fmt::Write as _;

use serde::Serialize;
use tenplan_planner::{cost::Loads, lower_bound, simulate, LowerBound};
use tenplan_proofs::check;
use tenplan_ptc::Plan;

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
}

/// Check, load, bound and simulate a plan. A plan that fails the checker is
/// reported as such and not simulated (its makespan is reported as NaN).
/// The lower bound is the larger of the trivial cut bound and the LP bound
/// certified by weak duality (see `tenplan_planner::lp::certified_bound`).
pub fn evaluate(plan: &Plan, planning_time_s: f64) -> PlanReport {
    let bound = lower_bound(&plan.problem).unwrap_or_else(|e| LowerBound {
        seconds: f64::NAN,
        reason: e.to_string(),
    });
    evaluate_with_bound(plan, planning_time_s, &bound)
}

/// [`evaluate`] with a lower bound computed beforehand (several planners on
/// one problem share it).
pub fn evaluate_with_bound(plan: &Plan, planning_time_s: f64, bound: &LowerBound) -> PlanReport {
    let problem = &plan.problem;
    let cluster = problem.cluster();
    let verdict = check(plan);
    let verified = verdict.is_ok();
    // The cost model indexes the problem by the plan's tensors and devices:
    // cost only a plan whose indices are in range.
    let loads = if verified || plan.validate_indices().is_ok() {
        Loads::of(plan)
    } else {
        Loads::default()
    };
    let (max_load_s, bottleneck) = loads.max_time(cluster);
    let bound = (bound.seconds, bound.reason.clone());
    let makespan_s = if verified { simulate(plan).makespan_s } else { f64::NAN };
    PlanReport {
        planner: plan.planner.clone(),
        bytes_total: loads.moved + loads.local,
        bytes_moved: loads.moved,
        bytes_cross_node: loads.cross_node,
        max_load_s,
        bottleneck: bottleneck.map_or("none".into(), |r| r.to_string()),
        makespan_s,
        lower_bound_s: bound.0,
        lower_bound_reason: bound.1,
        gap: if bound.0 > 0.0 { makespan_s / bound.0 - 1.0 } else { 0.0 },
        planning_time_s,
        verified,
        verdict: match verdict {
            Ok(c) => c.to_string(),
            Err(v) => format!("rejected: {v}"),
        },
        copies: plan.copies.len(),
        fills: plan.fills.len(),
        rounds: plan.copies.iter().map(|c| c.round + 1).max().unwrap_or(1),
    }
}

/// Bytes in human units (decimal).
pub fn bytes(b: u64) -> String {
    let b = b as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.2} kB", b / 1e3)
    } else {
        format!("{b} B")
    }
}

/// Seconds in human units.
pub fn seconds(s: f64) -> String {
    if !s.is_finite() {
        "n/a".into()
    } else if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

impl PlanReport {
    /// A short two-column table for people.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let rows = [
            ("planner", self.planner.clone()),
            (
                "copies",
                format!(
                    "{} (+ {} zero-fills){}",
                    self.copies,
                    self.fills,
                    if self.rounds > 1 {
                        format!(" in {} staging rounds", self.rounds)
                    } else {
                        String::new()
                    }
                ),
            ),
            (
                "bytes moved",
                format!(
                    "{} between devices, {} in total",
                    bytes(self.bytes_moved),
                    bytes(self.bytes_total)
                ),
            ),
            ("cross-node bytes", bytes(self.bytes_cross_node)),
            (
                "max resource load",
                format!("{} ({})", seconds(self.max_load_s), self.bottleneck),
            ),
            ("simulated makespan", seconds(self.makespan_s)),
            (
                "lower bound",
                format!("{} ({})", seconds(self.lower_bound_s), self.lower_bound_reason),
            ),
            ("planning time", seconds(self.planning_time_s)),
            (
                "verified",
                if self.verified {
                    format!("yes, {}", self.verdict)
                } else {
                    format!("NO, {}", self.verdict)
                },
            ),
        ];
        for (k, v) in rows {
            let _ = writeln!(s, "{k:<20}{v}");
        }
        s
    }
}
