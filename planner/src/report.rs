//! What a plan costs and whether it is correct: the numbers every command prints.

use std::fmt::Write as _;
use std::time::Instant;

use crate::{cost::Loads, lower_bound_given, simulate, LowerBound};
use serde::Serialize;
use tenplan_proofs::check;
use tenplan_ptc::{Cluster, Plan};

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

/// Seconds each step of an evaluation took (planning is
/// [`PlanReport::planning_time_s`]).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timings {
    /// The lower bound (0 when it was computed beforehand and shared).
    pub bound_s: f64,
    /// The independent checker.
    pub verify_s: f64,
    /// The cost model's loads.
    pub loads_s: f64,
    /// The flow-level simulation.
    pub simulate_s: f64,
}

/// Check, load, bound and simulate a plan. A plan that fails the checker is
/// reported as such and not simulated (its makespan is reported as NaN).
/// The lower bound is the larger of the trivial cut bound and the LP bound
/// certified by weak duality (see `tenplan_planner::lp::certified_bound`);
/// a verified plan's load caps what the LP could add, so the LP is skipped
/// where the cut bound is already within `BOUND_SLACK` of it.
pub fn evaluate(plan: &Plan, planning_time_s: f64) -> PlanReport {
    evaluate_knowing(plan, planning_time_s, None)
}

/// [`evaluate`] given a bound the planner certified for the plan's problem
/// on the way (see `Planner::plan_with_bound`): no LP is solved for the
/// bound where it is within `BOUND_SLACK` of the plan's load.
pub fn evaluate_knowing(plan: &Plan, planning_time_s: f64, certified: Option<&LowerBound>) -> PlanReport {
    let mut report = evaluate_unbounded(plan, planning_time_s);
    let start = Instant::now();
    let upper = if report.verified {
        report.max_load_s
    } else {
        f64::INFINITY
    };
    let bound = lower_bound_given(&plan.problem, upper, certified).unwrap_or_else(|e| LowerBound {
        seconds: f64::NAN,
        reason: e.to_string(),
    });
    report.timings.bound_s = start.elapsed().as_secs_f64();
    report.set_bound(&bound);
    report
}

/// [`evaluate`] without the lower bound (NaN, "not computed"), for a caller
/// that bounds the problem once its plans' loads are known and then calls
/// [`PlanReport::set_bound`].
pub fn evaluate_unbounded(plan: &Plan, planning_time_s: f64) -> PlanReport {
    let unknown = LowerBound {
        seconds: f64::NAN,
        reason: "not computed".into(),
    };
    evaluate_with_bound(plan, planning_time_s, &unknown)
}

/// [`evaluate`] with a lower bound computed beforehand (several planners on
/// one problem share it).
pub fn evaluate_with_bound(plan: &Plan, planning_time_s: f64, bound: &LowerBound) -> PlanReport {
    let problem = &plan.problem;
    let cluster = problem.cluster();
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
    let bound = (bound.seconds, bound.reason.clone());
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
        lower_bound_s: bound.0,
        lower_bound_reason: bound.1,
        gap: gap(makespan_s, bound.0),
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

/// A cluster's shape and fabric in a few lines: per tier of switches, how
/// many, their uplinks, and their oversubscription (the capacity of the
/// links below a switch over its uplink).
pub fn fabric_summary(cluster: &Cluster) -> String {
    let d = cluster.data();
    let b = &d.bandwidth;
    let mut out = format!(
        "cluster {}: {} nodes x {} devices ({} devices), {} NICs per node at {}/s, NVLink {}/s per device\n",
        d.name,
        d.nodes,
        d.gpus_per_node,
        d.nodes * d.gpus_per_node,
        d.nics_per_node,
        bytes(b.nic as u64),
        bytes(b.intra_node as u64),
    );
    let Some(f) = &d.fabric else {
        out.push_str("network: non-blocking (no fabric: inter-node traffic loads only the NICs)\n");
        return out;
    };
    let n = f.switches.len();
    let mut below = vec![0.0f64; n];
    for &s in &f.nics {
        below[s as usize] += b.nic;
    }
    let depth = |mut s: usize| {
        let mut k = 0;
        while let Some(p) = f.switches[s].parent {
            s = p as usize;
            k += 1;
        }
        k
    };
    let depths: Vec<usize> = (0..n).map(depth).collect();
    // Deepest first, so that every child adds to its parent before the
    // parent is read.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&s| std::cmp::Reverse(depths[s]));
    for &s in &order {
        if let Some(p) = f.switches[s].parent {
            below[p as usize] += f.switches[s].down;
        }
    }
    let _ = writeln!(
        out,
        "fabric: {n} switches in {} levels",
        depths.iter().max().unwrap_or(&0) + 1
    );
    // One line per tier and distinct (uplink, ratio).
    let mut tiers: std::collections::BTreeMap<(usize, u64, u64), usize> = std::collections::BTreeMap::new();
    for s in (0..n).filter(|&s| f.switches[s].parent.is_some()) {
        let ratio = below[s] / f.switches[s].up;
        *tiers
            .entry((depths[s], f.switches[s].up as u64, (ratio * 100.0).round() as u64))
            .or_default() += 1;
    }
    for ((tier, up, ratio), count) in tiers.iter().rev() {
        let _ = writeln!(
            out,
            "  tier {tier}: {count} switches, uplink {}/s, {:.2}:1 oversubscribed",
            bytes(*up),
            *ratio as f64 / 100.0
        );
    }
    out
}
