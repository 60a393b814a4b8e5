//! The optimal planner: a linear program over the sub-tensor transfer graph,
//! solved with HiGHS, with a certified lower bound.
//!
//! 1. Fragments with the same destination and the same set of live holders
//!    form one commodity, so the LP's size follows the number of replica
//!    groups, not the number of tensors.
//! 2. Phase 1 minimises the makespan `T`: variables `x[c,s]` are the fraction of
//!    commodity `c` sent by holder `s`, `Σ_s x[c,s] = 1`, and every
//!    resource's load is at most `capacity · T`. Bytes are divisible, so the
//!    LP is exact for the cost model. Phase 2 keeps `T` and minimises
//!    traffic (local copies free, intra-node cheaper than cross-node).
//! 3. The lower bound does not trust the solver: it is recomputed by weak
//!    duality from the phase-1 resource prices (see [`certified_bound`]),
//!    over every route a plan may take, relays included.
//! 4. Fragments are split among their sources to match the LP's byte totals
//!    at element granularity (a flat range of a box is at most 2·ndim−1 boxes).
//! 5. Multicast: a box that several devices of one node need, from holders
//!    off that node, may cross the network once to one of them (the leader)
//!    and be forwarded over the intra-node link to the others. Each such
//!    opportunity is a [`Multicast`] with one variable per (holder, leader);
//!    what it delivers counts towards every member's demand.
//!
//! Each step has its file: `commodities.rs` (commodities and multicast
//! opportunities), `columns.rs` (paths, the rows they load, where column
//! generation starts and how it prices new columns), `model.rs` (the rows,
//! phases 1 and 2), `components.rs` (phase 1 as independent LPs),
//! `certify.rs` (the bound) and `disaggregate.rs` (byte totals to copies).

mod certify;
mod columns;
mod commodities;
pub(crate) mod components;
mod disaggregate;
mod model;
#[cfg(test)]
mod tests;
mod warm;

use std::cell::OnceCell;
use std::collections::BTreeMap;

use rayon::prelude::*;
use tenplan_ptc::{Cluster, DeviceId, Forwarding, Plan, Problem};

pub use certify::{certified_bound, lower_bound, lower_bound_below, lower_bound_given, BOUND_SLACK};
pub use columns::Path;
pub use commodities::{commodities, multicasts, Commodity, Multicast};

use crate::cost::{Loads, Resource};
use crate::intersect::{fragments, Fragment};
use crate::{LowerBound, Planner, Result};
use certify::certify;
use columns::{RestrictedLp, MAX_BOUND_ROUNDS, MAX_RELAY_ROUNDS};
use commodities::prune_multicasts;
use disaggregate::{byte_splits, copies};
use model::{Fractions, LpData, Phase1};

/// Units of one LP instance: bytes are counted in units of the largest
/// commodity and time in the time that commodity takes on the fastest link,
/// so that every coefficient is near 1 whatever the problem's size.
#[derive(Clone, Copy, Debug)]
struct Units {
    bytes: f64,
    seconds: f64,
}

/// Solver settings of the LP planner.
#[derive(Clone, Debug, PartialEq)]
pub struct LpPlanner {
    threads: u32,
    time_limit_s: Option<f64>,
    ipm: bool,
    placement: Placement,
    relays: bool,
    multicast: bool,
    portfolio: bool,
    presolve: bool,
    memory_limit: Option<u64>,
    /// Columns from which a restricted LP asks for its plan within
    /// [`SHORTCUT_SLACK`] of the cuts first ([`SHORTCUT_FROM_COLUMNS`];
    /// lowered by tests).
    shortcut_from_columns: usize,
    /// How far above the cuts (or the forced loads) the largest LPs' first
    /// plan may be ([`SHORTCUT_SLACK`]; lowered by tests).
    shortcut_slack: f64,
}

/// Whether the planner may choose which device runs which target rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Placement {
    /// Keep the target layout's rank-to-device assignment.
    #[default]
    Fixed,
    /// Re-assign target ranks among the target's devices to cut traffic
    /// (an assignment problem, solved exactly); the plan carries the chosen layout.
    Optimize,
}

/// Builder for [`LpPlanner`].
#[derive(Clone, Debug)]
pub struct LpPlannerBuilder {
    planner: LpPlanner,
}

impl Default for LpPlanner {
    fn default() -> Self {
        LpPlanner {
            threads: 1,
            time_limit_s: None,
            ipm: false,
            placement: Placement::Fixed,
            relays: true,
            multicast: true,
            portfolio: true,
            presolve: true,
            memory_limit: None,
            shortcut_from_columns: SHORTCUT_FROM_COLUMNS,
            shortcut_slack: SHORTCUT_SLACK,
        }
    }
}

impl LpPlannerBuilder {
    /// HiGHS threads (default 1, which keeps plans deterministic).
    pub fn threads(mut self, threads: u32) -> Self {
        self.planner.threads = threads.max(1);
        self
    }

    /// Refuse LPs whose solvers would need more than this many bytes
    /// (estimated before their models are built; default: the memory the
    /// kernel says is available, where it says).
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        self.planner.memory_limit = Some(bytes);
        self
    }

    /// Give up after this many seconds of solving (default: no limit).
    pub fn time_limit_s(mut self, seconds: f64) -> Self {
        self.planner.time_limit_s = Some(seconds);
        self
    }

    /// Use HiGHS's simplex method (the default). On these LPs, now that
    /// large models start from a few holders per commodity, it is 1–2.5×
    /// faster than the interior-point method (GPT-3 175B on 1024 GPUs:
    /// 1.2 s against 2.0 s; LLaMA-2-70B on 512: 0.6 s against 1.0 s).
    pub fn simplex(mut self) -> Self {
        self.planner.ipm = false;
        self
    }

    /// Use HiGHS's interior-point method instead of the simplex method.
    pub fn interior_point(mut self) -> Self {
        self.planner.ipm = true;
        self
    }

    /// Whether copies may be relayed through another device of the source's
    /// or the destination's node (default: yes).
    pub fn relays(mut self, relays: bool) -> Self {
        self.planner.relays = relays;
        self
    }

    /// Whether a box that several devices of one node need may cross the
    /// network once and be forwarded within the node (default: yes).
    pub fn multicast(mut self, multicast: bool) -> Self {
        self.planner.multicast = multicast;
        self
    }

    /// Whether, on problems small enough for per-message latency to
    /// matter (at most [`PORTFOLIO_MAX_COPIES`] copies), the planner also
    /// plans the problem with every baseline (`hotspa`, `least-loaded`,
    /// `static-p2p`, `tenplex`, `central`), simulates those whose load
    /// alone does not rule them out and whose streams are at most
    /// [`PORTFOLIO_MAX_STREAMS`], and keeps whichever the simulator finds
    /// fastest (default: yes). The LP's cost model charges message
    /// latency only as issue time, so on small recoveries a greedy plan with
    /// fewer, larger messages can beat it by a fraction of a percent; with
    /// this on, `lp` never loses to a baseline there. The plan's lower bound
    /// is unaffected: it is a property of the problem.
    pub fn portfolio(mut self, portfolio: bool) -> Self {
        self.planner.portfolio = portfolio;
        self
    }

    /// Whether HiGHS presolves the simplex method's LPs of fewer than
    /// [`PRESOLVE_MAX_COLUMNS`] columns (default on: the plans of the
    /// suites). A problem reduced by its symmetry
    /// ([`crate::symmetry::Reduced`]) has LPs of tens to hundreds of
    /// columns, which the simplex method solves in less time than the
    /// presolve takes.
    pub fn presolve(mut self, presolve: bool) -> Self {
        self.planner.presolve = presolve;
        self
    }

    /// Whether target ranks may move between the target's devices.
    pub fn placement(mut self, placement: Placement) -> Self {
        self.planner.placement = placement;
        self
    }

    /// The planner.
    pub fn build(self) -> LpPlanner {
        self.planner
    }
}

/// The LP's answer: the byte split and the certified bound.
#[derive(Clone, Debug)]
pub struct LpSolution {
    /// Makespan of the split under the cost model (max resource load), in seconds.
    pub objective_s: f64,
    /// The paths of each commodity the LP considered.
    pub paths: Vec<Vec<Path>>,
    /// Bytes of each commodity sent along each of its paths (before what
    /// multicasts deliver is taken off).
    pub split: Vec<Vec<u64>>,
    /// The multicast opportunities the LP considered.
    pub multicasts: Vec<Multicast>,
    /// Bytes of each multicast sent by each of its options (holder-major,
    /// leader-minor), then the bytes left to unicast.
    pub multicast_split: Vec<Vec<u64>>,
    /// Bound certified from the phase-1 prices (`None` when only the plan was asked for).
    pub bound: Option<LowerBound>,
    /// The cut bound ([`crate::cut_lower_bound`]) of the fragments, where
    /// the solve needed it (large LPs and fabrics), so that no caller
    /// computes it again.
    pub cut: Option<LowerBound>,
}

/// Where a solve's cut bound comes from.
enum Cut<'s> {
    /// The caller had it.
    Known(LowerBound),
    /// A thread computes it beside the solve.
    Beside(std::thread::ScopedJoinHandle<'s, LowerBound>),
    /// Computed the first time it is asked for.
    WhenNeeded,
}

/// Which parts of the LP to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phases {
    /// Phase 1 and the certified bound (no plan).
    BoundOnly,
    /// Phases 1 and 2 (a plan, no bound).
    PlanOnly,
    /// Everything.
    Both,
}

/// What a row of the LP limits: a link of the cost model, or a device's
/// time spent issuing messages (each costs the cluster's latency, one at a
/// time). Issue time is a heuristic that keeps plans from shattering into
/// many small messages; only links enter the certified bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Row {
    Link(Resource),
    Issue(DeviceId),
}

/// The first round of column generation on a fabric whose duals are
/// certified (see [`LpPlanner::generate_columns`]).
const CERTIFY_FROM: usize = 4;

/// Asked after rounds of column generation on a fabric: whether the
/// round's duals certify its makespan.
type Certified<'a> = &'a mut dyn FnMut(&RestrictedLp, &Phase1) -> bool;

struct Resources {
    ids: BTreeMap<Row, usize>,
    list: Vec<Row>,
}

impl Resources {
    fn id(&mut self, r: Row) -> usize {
        *self.ids.entry(r).or_insert_with(|| {
            self.list.push(r);
            self.list.len() - 1
        })
    }
}

impl LpPlanner {
    /// A builder with the default settings.
    pub fn builder() -> LpPlannerBuilder {
        LpPlannerBuilder {
            planner: LpPlanner::default(),
        }
    }

    fn configure(
        &self,
        model: good_lp::solvers::highs::HighsProblem,
        columns: usize,
    ) -> good_lp::solvers::highs::HighsProblem {
        self.configure_with(model, self.ipm, columns)
    }

    /// Solver options for an LP of `columns` columns.
    fn configure_with(
        &self,
        model: good_lp::solvers::highs::HighsProblem,
        ipm: bool,
        columns: usize,
    ) -> good_lp::solvers::highs::HighsProblem {
        let mut m = model.set_threads(self.threads);
        if ipm {
            m = m.set_option("solver", "ipm");
        } else if columns >= PRESOLVE_MAX_COLUMNS || !self.presolve {
            // On large LPs the simplex method gains less from HiGHS's
            // presolve than the presolve costs (GPT-3 175B with ZeRO-1 on
            // 16,384 GPUs: planning 155 s -> 81 s, and a better vertex).
            m = m.set_option("presolve", "off");
        }
        if let Some(t) = self.time_limit_s {
            m = m.set_time_limit(t);
        }
        m
    }

    /// Solve the LP for a problem's fragments and their commodities.
    pub fn solve(&self, problem: &Problem, frags: &[Fragment], comms: &[Commodity]) -> Result<LpSolution> {
        self.run(problem, frags, comms, Phases::Both, None)
    }

    /// Run `phases` of the LP; `cut` is [`crate::cut_lower_bound`] of the
    /// fragments where the caller has it already.
    /// The LP's plan of `problem`, solved on `model` (the problem itself,
    /// or it with forwarding within nodes), and the solution.
    fn plan_solved(
        &self,
        problem: &Problem,
        model: &Problem,
        frags: &[Fragment],
        cut: Option<LowerBound>,
    ) -> Result<(Plan, LpSolution)> {
        let comms = commodities(frags);
        let solution = self.run(model, frags, &comms, Phases::PlanOnly, cut)?;
        let plan = copies(problem, frags, &comms, &solution).finish(self.name(), problem, frags);
        Ok((plan, solution))
    }

    fn run(
        &self,
        problem: &Problem,
        frags: &[Fragment],
        comms: &[Commodity],
        phases: Phases,
        cut: Option<LowerBound>,
    ) -> Result<LpSolution> {
        if let Some(cut) = cut {
            return self.run_with(problem, frags, comms, phases, Cut::Known(cut));
        }
        // On a fabric the first round's stop test asks for the cut bound,
        // and a restricted LP's construction asks for it as its floor; it
        // needs only the fragments, so on large problems it is computed
        // beside the multicasts, the LP's construction and its first solve
        // (the 1T weight sync: 4.3 s of its planning) rather than after them.
        let wanted = problem.cluster().has_fabric() || columns::starts_restricted(comms);
        if wanted && frags.len() >= EARLY_CUT_FRAGMENTS && !comms.is_empty() {
            return std::thread::scope(|s| {
                let early = s.spawn(|| crate::cost::cut_lower_bound(problem, frags));
                self.run_with(problem, frags, comms, phases, Cut::Beside(early))
            });
        }
        self.run_with(problem, frags, comms, phases, Cut::WhenNeeded)
    }

    fn run_with(
        &self,
        problem: &Problem,
        frags: &[Fragment],
        comms: &[Commodity],
        phases: Phases,
        source: Cut<'_>,
    ) -> Result<LpSolution> {
        let cluster = problem.cluster();
        if comms.is_empty() {
            return Ok(LpSolution {
                objective_s: 0.0,
                paths: Vec::new(),
                split: Vec::new(),
                multicasts: Vec::new(),
                multicast_split: Vec::new(),
                bound: Some(LowerBound {
                    seconds: 0.0,
                    reason: "nothing to move".into(),
                }),
                cut: None,
            });
        }
        let mcasts = if self.multicast {
            prune_multicasts(cluster, comms, multicasts(cluster, frags, comms))
        } else {
            Vec::new()
        };
        // What the cuts prove no plan can beat: computed once, where needed
        // (or taken from the thread that computed it beside this one).
        let (cut, beside) = match source {
            Cut::Known(c) => (OnceCell::from(c), None),
            Cut::Beside(h) => (OnceCell::new(), Some(h)),
            Cut::WhenNeeded => (OnceCell::new(), None),
        };
        let beside = std::cell::RefCell::new(beside);
        let cut_bound = || {
            cut.get_or_init(|| match beside.borrow_mut().take() {
                Some(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                None => crate::cost::cut_lower_bound(problem, frags),
            })
        };
        let cut_s = || cut_bound().seconds;
        let mut lp = RestrictedLp::start(cluster, comms, mcasts, cut_s);
        self.check_memory(&lp)?;
        let converge = cluster.has_fabric();
        // No plan is faster than the cuts. Where only a plan is wanted and
        // the LP is large (restricted, on a flat network), ask phase 2 first
        // for the least traffic at the cuts' makespan (with phase 2's own
        // slack): if the restricted LP meets it, phase 1 could only have
        // found that makespan, and this is the plan phase 2 would then have
        // given, without phase 1, which costs several times more on large
        // single-component LPs (DeepSeek-V3 on 16,384 GPUs: 24 s against
        // 3.4 s). If it cannot, column generation goes on as before.
        // On the largest LPs (SHORTCUT_FROM_COLUMNS), on a fabric too, it
        // asks for the least traffic within SHORTCUT_SLACK of the cuts: the
        // first columns on a fabric reach the cuts only within 0.01-0.08%,
        // and a plan within 0.1% of them is where column generation would
        // stop anyway (Llama 3.1 405B's pp 16 -> 8 on 16,384 GPUs of the 2:1
        // rail fabric: 10.8 s planning against 6.4 s).
        let columns: usize = lp.routes.iter().chain(&lp.mroutes).map(Vec::len).sum();
        let largest = lp.restricted && columns >= self.shortcut_from_columns;
        // There, too, the relays that spread a node's ingress over its NICs
        // (see `RestrictedLp::ingress_relays`) come from the start: column
        // generation would find them one crowded link per round (GPT-3
        // 175B's ZeRO-1 on 16,384 GPUs, flat: 11.0 s planning, 3.6 s with
        // them, where phase 2 meets the shortcut).
        if largest {
            let caps = lp.capacities(cluster);
            for (ci, path) in lp.ingress_relays(cluster, comms, &caps, cut_s() / lp.units.seconds) {
                lp.add_path(cluster, &comms[ci], ci, path);
            }
        }
        if phases == Phases::PlanOnly && lp.restricted && (largest || !converge) {
            let caps = lp.capacities(cluster);
            let slack = if largest { self.shortcut_slack } else { 0.0 };
            let t = cut_s() * (1.0 + slack) / lp.units.seconds;
            // Not where what some row must carry whatever the split already
            // exceeds that makespan, beyond the solver's tolerance: the
            // attempt would fail (GPT-3 175B's ZeRO-1 on 16,384 GPUs of the
            // 2:1 rail fabric: 1.5 s to find so).
            let beyond = (t * (1.0 + PHASE2_SLACK) + 1e-7) * (1.0 + FORCED_MARGIN);
            let forced = lp.forced_loads();
            let hopeless = forced.iter().zip(&caps).any(|(&f, &c)| f > c * beyond);
            if !hopeless {
                if let Ok((chosen, mchosen)) = self.least_traffic(&lp, &caps, t) {
                    return Ok(lp.solution(comms, &caps, &chosen, &mchosen, None, cut.get().cloned()));
                }
            } else if largest && converge {
                // On a fabric, where the makespan the forced loads imply
                // (their floor) is within STALL_GAP of the cuts, ask for the
                // least traffic within the slack of that floor instead: no
                // split of these columns beats it, and column generation
                // there stops at a stall within STALL_GAP of the cuts anyway. GPT-3 175B's ZeRO-1
                // on 16,384 GPUs of the 2:1 rail fabric: its first round
                // (4 s) ends at its forced loads, 0.12% above the cuts, and
                // its second (1.2 s) stalls there.
                let floor = forced
                    .iter()
                    .zip(&caps)
                    .filter(|&(_, &c)| c > 0.0)
                    .map(|(&f, &c)| f / c)
                    .fold(0.0, f64::max);
                if floor * lp.units.seconds <= cut_s() * (1.0 + STALL_GAP) {
                    let t = floor * (1.0 + self.shortcut_slack);
                    if let Ok((chosen, mchosen)) = self.least_traffic(&lp, &caps, t) {
                        return Ok(lp.solution(comms, &caps, &chosen, &mchosen, None, cut.get().cloned()));
                    }
                }
            }
        }
        // Likewise where only the bound is wanted (a baseline's report): a
        // restricted LP that meets the cuts' makespan within BOUND_SLACK
        // shows that the LP's optimum, and so every bound its duals could
        // certify, is within BOUND_SLACK of the cuts, which stay the bound,
        // without phase 1 (interior point and its certificate: 12 s of a
        // 18 s command for `tenplex` on LLaMA-3 70B at 16,384 GPUs). The
        // restricted LP's first columns reach the cuts only within about
        // 0.1% there, so the tolerance is the bound's own, as where a plan's
        // load caps it (see `lower_bound_given`). On a fabric it is the
        // gap at which column generation stops there anyway (STALL_GAP, see
        // below): the same guarantee without phase 1 and its certificates
        // (`central` on 405B on the 2:1 rail fabric at 16,384 GPUs: its
        // bound 9.2 -> 5.3 s). The simplex method, as for the plan.
        let gap = bound_gap(cluster);
        if phases == Phases::BoundOnly && lp.restricted {
            let caps = lp.capacities(cluster);
            let simplex = LpPlanner {
                ipm: false,
                ..self.clone()
            };
            let t = cut_s() * (1.0 + gap) / lp.units.seconds;
            if simplex.least_traffic(&lp, &caps, t).is_ok() {
                return Ok(LpSolution {
                    objective_s: cut_s(),
                    paths: lp.paths,
                    split: Vec::new(),
                    multicasts: lp.mcasts,
                    multicast_split: Vec::new(),
                    bound: Some(cut_bound().clone()),
                    cut: cut.get().cloned(),
                });
            }
        }
        // The bound needs the duals of an LP that no column improves. On a
        // fabric (bridges, rails) the planning rounds stop with duals that
        // certify far less than the LP's optimum, so for the bound column
        // generation goes on until a round's duals certify the makespan
        // (within BOUND_SLACK) or no column prices in; every round's
        // certificate is valid, and the best is kept.
        let peers = OnceCell::new();
        let peers = || peers.get_or_init(|| crate::cost::multicast_peers(cluster, frags));
        let mut best: Option<LowerBound> = None;
        let mut certified = |lp: &RestrictedLp, solved: &Phase1| -> bool {
            let (t_star, duals, phase1, mphase1) = solved;
            let mut phase1 = phase1.clone();
            lp.fill_pinned(&mut phase1);
            let loads = lp.loads(&phase1, mphase1);
            let caps = lp.capacities(cluster);
            let b = certify(problem, frags, peers(), &lp.res.list, &caps, duals, &loads, *t_star);
            let close = b.seconds >= t_star * lp.units.seconds * (1.0 - BOUND_SLACK);
            if best.as_ref().is_none_or(|x| b.seconds > x.seconds) {
                best = Some(b);
            }
            close
        };
        let (t_star, duals, mut phase1, mphase1) = self.generate_columns(
            problem,
            comms,
            &mut lp,
            cut_s,
            converge.then_some(&mut certified as Certified<'_>),
        )?;
        lp.fill_pinned(&mut phase1);
        let caps = lp.capacities(cluster);
        // A restricted optimum within BOUND_SLACK of the cuts (where they
        // were computed) caps every certificate the LP's duals could give
        // at that: the cuts are the bound, as the planner reports (certified,
        // it took 4.9 s of a 14 s baseline command on LLaMA-3 70B's shrink
        // at 16,384 GPUs on the 2:1 rail fabric, for at most 0.1% more).
        // Likewise where column generation on a fabric stopped at a stall
        // within STALL_GAP of them (GPT-3 175B ZeRO-1's certificate there
        // took 3.3 s to prove 0.0015 s against the cuts' 0.122 s).
        let at_cuts = cut
            .get()
            .filter(|c| t_star * lp.units.seconds <= c.seconds * (1.0 + gap));
        let bound = match (best, at_cuts) {
            (Some(b), _) => Some(b),
            (None, Some(c)) => Some(c.clone()),
            (None, None) => (phases != Phases::PlanOnly).then(|| {
                let loads = lp.loads(&phase1, &mphase1);
                certify(problem, frags, peers(), &lp.res.list, &caps, &duals, &loads, t_star)
            }),
        };
        if phases == Phases::BoundOnly {
            return Ok(LpSolution {
                objective_s: t_star * lp.units.seconds,
                paths: lp.paths,
                split: Vec::new(),
                multicasts: lp.mcasts,
                multicast_split: Vec::new(),
                bound,
                cut: cut.get().cloned(),
            });
        }
        // Phase 2: least traffic at the optimal makespan, with a little
        // slack so that it stays feasible under the solver's tolerances.
        // Should it fail, the phase-1 split is optimal for the makespan too.
        // (From phase 1's warm basis, on a fabric, it took longer than
        // rebuilt and split: LLaMA-3 70B on 4,096 GPUs, 8.5 s against 6.1 s
        // planning.)
        let (chosen, mchosen) = self.least_traffic(&lp, &caps, t_star).unwrap_or((phase1, mphase1));
        Ok(lp.solution(comms, &caps, &chosen, &mchosen, bound, cut.get().cloned()))
    }

    /// Phase 2 at makespan `t` (in LP units), with the slack that keeps it
    /// feasible under the solver's tolerances; pinned commodities filled in.
    /// On a fabric, as phase 1, first without the switch links (see
    /// [`LpPlanner::phase1_off_fabric`]).
    fn least_traffic(&self, lp: &RestrictedLp, caps: &[f64], t: f64) -> Result<Split> {
        let data = lp.data(caps);
        let bound = t * (1.0 + PHASE2_SLACK) + 1e-7;
        let (mut chosen, mchosen) = match self.phase2_off_fabric(lp, &data, bound) {
            Some(split) => split,
            None => self.phase2_split(&data, bound)?,
        };
        lp.fill_pinned(&mut chosen);
        Ok((chosen, mchosen))
    }

    /// Phase 2 at `bound` without the switch links no relaxation found
    /// binding, putting back those its answer overloads while the LP still
    /// splits, up to [`TIGHTEN_ROUNDS`] times. `None` where there is no
    /// fabric, nothing splits, or no round fits.
    fn phase2_off_fabric(&self, lp: &RestrictedLp, data: &LpData<'_>, bound: f64) -> Option<Split> {
        let mut dropped = relaxable_rows(lp);
        for _ in 0..TIGHTEN_ROUNDS {
            let relaxed = components::Relaxed::new(data, &dropped)?;
            match self.phase2_relaxed(data, &relaxed, bound)? {
                Ok(split) => return Some(split),
                Err(over) => over.into_iter().for_each(|r| dropped[r] = false),
            }
        }
        None
    }

    /// Phase 2 at `bound` of a relaxed LP: its answer where it fits every row
    /// of the whole LP (`Ok`), else the rows it overloads (`Err`); `None`
    /// where the solve fails (the whole LP's solve will say why).
    fn phase2_relaxed(
        &self,
        data: &LpData<'_>,
        relaxed: &components::Relaxed,
        bound: f64,
    ) -> Option<std::result::Result<Split, Vec<usize>>> {
        let (chosen, mchosen) = self.phase2_split(&relaxed.lp(data), bound).ok()?;
        let over = components::overloaded(data, &chosen, &mchosen, bound);
        Some(if over.is_empty() {
            Ok((chosen, mchosen))
        } else {
            Err(over)
        })
    }

    /// Phase 1 without the fabric's switch links, where dropping them splits
    /// the LP into independent ones (the rails of a rail-optimized fabric,
    /// as on a flat network) and the answer fits them anyway: the
    /// relaxation's optimum is then the LP's, and so are its duals (zero on
    /// the switch rows, which are slack). The node failure on the 2:1 rail
    /// fabric at 16,384 GPUs: its first solve 8.4 s as one LP, 1.7 s split.
    /// Where the answer overloads switch links, they go back into the LP
    /// (for good: `RestrictedLp::binding_switches`) and it is solved again,
    /// while it still splits, up to [`TIGHTEN_ROUNDS`] times: LLaMA-3 70B's
    /// shrink there, whose cuts are switch links, ended 0.50x the cuts
    /// without them, and fitted with the 782 rows that overloaded.
    /// `None` where there is no fabric, nothing splits, or no round fits
    /// (`cut_s`: the cuts, in seconds).
    fn phase1_off_fabric(&self, lp: &mut RestrictedLp, caps: &[f64], cut_s: f64) -> Result<Option<Phase1>> {
        for _ in 0..TIGHTEN_ROUNDS {
            let data = lp.data(caps);
            let Some(relaxed) = components::Relaxed::new(&data, &relaxable_rows(lp)) else {
                return Ok(None);
            };
            let (t_star, duals, fractions, mfractions) = self.phase1_split(&relaxed.lp(&data))?;
            let over = components::overloaded(&data, &fractions, &mfractions, t_star);
            if over.is_empty() {
                return Ok(Some((t_star, duals, fractions, mfractions)));
            }
            // Phase 1's vertex routes with no regard for the links left out
            // (608 of them overloaded, up to 1.65x, on that node failure);
            // at or above the cuts, the least traffic at its makespan, split
            // too, often fits them: a plan of the whole LP at the
            // relaxation's optimum (within phase 2's slack), which the
            // relaxation's duals then certify. Below the cuts nothing fits.
            let over = if t_star * lp.units.seconds < cut_s * (1.0 - 1e-9) {
                over
            } else {
                let bound = t_star * (1.0 + PHASE2_SLACK) + 1e-7;
                match self.phase2_relaxed(&data, &relaxed, bound) {
                    None => return Ok(None),
                    Some(Ok((chosen, mchosen))) => return Ok(Some((t_star, duals, chosen, mchosen))),
                    Some(Err(over)) => over,
                }
            };
            lp.binding_switches.extend(over);
        }
        Ok(None)
    }

    /// Phase 1 with column generation: minimise `T`, then add the paths
    /// (relayed, or from holders not yet tried) that the row prices say are
    /// cheaper than every path a commodity has, until none is or the gain
    /// stalls (where `converge` certifies a bound: until a certificate
    /// closes the gap, or a stall near the cuts, see [`STALL_GAP`]). Returns
    /// the last phase-1 solution.
    fn generate_columns(
        &self,
        problem: &Problem,
        comms: &[Commodity],
        lp: &mut RestrictedLp,
        cut_s: impl Fn() -> f64,
        mut converge: Option<Certified<'_>>,
    ) -> Result<Phase1> {
        let cluster = problem.cluster();
        let mut round = 0;
        let mut previous = f64::INFINITY;
        // Column generation to convergence keeps one HiGHS model warm across
        // its rounds: each adds its columns and re-solves from the last
        // basis. So does a large LP that is one component (GPT-3 175B with
        // ZeRO-1 on 16,384 GPUs: its second round 11.2 s cold, 4.1 s warm).
        // Elsewhere each round's LP is rebuilt and split into independent
        // components, which is faster where there are many (LLaMA-3 70B on
        // 16,384 GPUs, flat: 9.5 s planning against 42 s on one warm model,
        // whose first solve is of the whole LP).
        let keep_warm = converge.is_some()
            || (lp.restricted && components::components(&lp.data(&lp.capacities(cluster))).len() <= 1);
        let mut warm: Option<warm::WarmPhase1> = None;
        // Certifying costs about what a round does, and the duals rarely
        // certify before column generation has converged: from round
        // CERTIFY_FROM on, at powers of two, and at the end.
        let scheduled = |round: usize| round >= CERTIFY_FROM && round.is_power_of_two();
        loop {
            let caps = lp.capacities(cluster);
            // On a fabric, first without the switch links, where that splits
            // the LP, until the answer no longer fits them (then warm).
            let off_fabric = match &warm {
                None if keep_warm => self.phase1_off_fabric(lp, &caps, cut_s())?,
                _ => None,
            };
            let solved = if let Some(solved) = off_fabric {
                solved
            } else if keep_warm {
                let w = match warm.as_mut() {
                    Some(w) => {
                        w.sync(lp, &caps)?;
                        w
                    }
                    None => warm.insert(warm::WarmPhase1::new(self, lp, &caps)?),
                };
                w.solve()?
            } else {
                self.phase1_split(&lp.data(&caps))?
            };
            round += 1;
            let t_star = solved.0;
            // Stop where the makespan is within 0.1% of what the cuts prove
            // no plan can beat (large models, where a solve costs a fraction
            // of a second; on a fabric, a spine every copy must cross).
            if (converge.is_some() || lp.restricted) && t_star * lp.units.seconds <= cut_s() * (1.0 + BOUND_SLACK) {
                return Ok(solved);
            }
            // Stop when relays stopped paying: a round that gains less than
            // 0.1% is not worth another solve.
            let stalled = t_star >= previous * (1.0 - 1e-3);
            previous = t_star;
            if let Some(certified) = converge.as_mut() {
                // Rounds that no longer improve the makespan go on only to
                // certify a bound above the cuts; within STALL_GAP of them
                // that is not worth its rounds (GPT-3 175B ZeRO-1 on the 2:1
                // rail fabric at 16,384 GPUs: 20 rounds of 2 s each,
                // degenerate pivots that moved the makespan by 0.1%, for a
                // bound that stayed the cuts).
                if stalled && t_star * lp.units.seconds <= cut_s() * (1.0 + STALL_GAP) {
                    return Ok(solved);
                }
                let last = round > MAX_BOUND_ROUNDS;
                if last || scheduled(round) {
                    // Certified whether or not it is the last round: the
                    // bound keeps the best certificate.
                    let close = certified(lp, &solved);
                    if close || last {
                        return Ok(solved);
                    }
                }
            } else if (!self.relays && !lp.restricted) || round > MAX_RELAY_ROUNDS || stalled {
                return Ok(solved);
            }
            let mut new_paths = lp.price(cluster, comms, &caps, &solved, self.relays, converge.is_some());
            // Far above the cuts after the first round on a fabric: the
            // rail-matched relays of every off-rail direct path at once
            // (see `RestrictedLp::rail_relays`).
            if converge.is_some()
                && self.relays
                && round == 1
                && t_star * lp.units.seconds > cut_s() * (1.0 + STALL_GAP)
            {
                let priced: std::collections::HashSet<(usize, columns::Path)> = new_paths.iter().cloned().collect();
                let rails: Vec<_> = lp
                    .rail_relays(cluster, comms)
                    .into_iter()
                    .filter(|x| !priced.contains(x))
                    .collect();
                new_paths.extend(rails);
            }
            if new_paths.is_empty() {
                if let Some(certified) = converge.as_mut().filter(|_| !scheduled(round)) {
                    certified(lp, &solved);
                }
                return Ok(solved);
            }
            for (ci, path) in new_paths {
                lp.add_path(cluster, &comms[ci], ci, path);
            }
        }
    }
}

impl RestrictedLp {
    /// The answer for the split `chosen` (and `mchosen`): its makespan under
    /// the cost model and its byte totals.
    fn solution(
        self,
        comms: &[Commodity],
        caps: &[f64],
        chosen: &model::Fractions,
        mchosen: &model::Fractions,
        bound: Option<LowerBound>,
        cut: Option<LowerBound>,
    ) -> LpSolution {
        let loads = self.loads(chosen, mchosen);
        let objective_s = loads
            .iter()
            .zip(caps)
            .zip(&self.res.list)
            .filter(|(_, r)| matches!(r, Row::Link(_)))
            .map(|((&l, &c), _)| l / c * self.units.seconds)
            .fold(0.0, f64::max);
        let (split, multicast_split) = byte_splits(comms, &self.mcasts, chosen, mchosen);
        LpSolution {
            objective_s,
            paths: self.paths,
            split,
            multicasts: self.mcasts,
            multicast_split,
            bound,
            cut,
        }
    }
}

/// Column generation to convergence (on a fabric) stops at the first round
/// that stalls (gains under 0.1%) with its makespan within this fraction of
/// the cuts: no certificate could then raise the bound by more than that.
const STALL_GAP: f64 = 1e-2;

/// How close a bound must come to what caps the LP's optimum (a plan's
/// load, a restricted LP's makespan) to stand without solving more of the
/// LP: [`BOUND_SLACK`], and on a fabric [`STALL_GAP`], the gap at which
/// column generation there stops anyway.
fn bound_gap(cluster: &Cluster) -> f64 {
    if cluster.has_fabric() {
        STALL_GAP
    } else {
        BOUND_SLACK
    }
}

/// The switch rows of a restricted LP that no relaxation found binding.
fn relaxable_rows(lp: &RestrictedLp) -> Vec<bool> {
    let mut dropped: Vec<bool> = lp
        .res
        .list
        .iter()
        .map(|r| matches!(r, Row::Link(Resource::SwitchUp(_) | Resource::SwitchDown(_))))
        .collect();
    for &r in &lp.binding_switches {
        dropped[r] = false;
    }
    dropped
}

/// Rounds of putting overloaded switch links back into a relaxed LP (see
/// [`LpPlanner::phase1_off_fabric`]).
const TIGHTEN_ROUNDS: usize = 4;

/// Phase 2's answer: the fractions of the commodities' paths and of the
/// multicasts' options.
type Split = (Fractions, Fractions);

/// Relative slack of phase 2's makespan over the one it is given (see
/// [`LpPlanner::least_traffic`]).
const PHASE2_SLACK: f64 = 1e-6;

/// How far above the cuts the largest LPs' plan is asked for before phase
/// 1 (see [`LpPlanner::run_with`]): within [`BOUND_SLACK`], where column
/// generation stops, with room left for phase 2's slack and the solver's
/// tolerances, so that the plan's load stays within `BOUND_SLACK` of the
/// cuts and the report takes them as the bound without solving the LP.
const SHORTCUT_SLACK: f64 = 0.9 * BOUND_SLACK;

/// How far a row's forced load (see `RestrictedLp::forced_loads`) must
/// exceed phase 2's makespan for the attempt to be skipped: well beyond
/// HiGHS's feasibility tolerance (1e-7), so that no attempt it would have
/// accepted is skipped.
const FORCED_MARGIN: f64 = 1e-6;

/// Restricted LPs of at least this many columns ask for their plan within
/// [`SHORTCUT_SLACK`] of the cuts before phase 1. Phase 1 costs seconds
/// there (every scale row at 16,384 GPUs has 131k-406k columns); on
/// smaller LPs it costs a fraction of a second, and a plan at the
/// restricted LP's optimum is up to 0.08% faster (the 1,024- and
/// 4,096-GPU rows, the large suite).
const SHORTCUT_FROM_COLUMNS: usize = 200_000;

/// Problems of at least this many fragments on a fabric compute their cut
/// bound on a thread of its own (see [`LpPlanner::run`]); below it the bound
/// takes well under a second and a thread would only compete.
const EARLY_CUT_FRAGMENTS: usize = 100_000;

/// Bytes the solvers take per nonzero of the LP's matrix, at most, as
/// measured at 1k–16k GPUs (good_lp's row expressions and HiGHS's copies
/// of the matrix, components solved two at a time: 90–250 bytes).
const BYTES_PER_NONZERO: u64 = 250;

impl LpPlanner {
    /// Refuse an LP the solvers would need more memory for than the machine
    /// has available, before building their models (see
    /// [`LpPlannerBuilder::memory_limit`]).
    fn check_memory(&self, lp: &RestrictedLp) -> Result<()> {
        let Some(available) = self.memory_limit.or_else(tenplan_ptc::limits::available_memory) else {
            return Ok(());
        };
        let columns: usize = lp.routes.iter().chain(&lp.mroutes).map(Vec::len).sum();
        let nonzeros: usize = lp.routes.iter().chain(&lp.mroutes).flatten().map(Vec::len).sum();
        let need = nonzeros as u64 * BYTES_PER_NONZERO;
        if need > available {
            return Err(crate::Error::TooLarge {
                need,
                available,
                columns,
                nonzeros,
            });
        }
        Ok(())
    }
}

impl Planner for LpPlanner {
    fn name(&self) -> &'static str {
        match self.placement {
            Placement::Fixed => "lp",
            Placement::Optimize => "lp-placed",
        }
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        Ok(self.plan_with_bound(problem)?.0)
    }

    fn plan_with_bound(&self, problem: &Problem) -> Result<(Plan, Option<LowerBound>)> {
        let placed;
        let problem = match self.placement {
            Placement::Fixed => problem,
            Placement::Optimize => {
                placed = crate::placement::optimize_placement(problem)?.0;
                &placed
            }
        };
        let frags = fragments(problem)?;
        // Forwarding across the cluster, broadcast trees among the
        // receivers may beat anything the LP (whose multicasts stay within
        // a node) can plan, and its certificate does not hold: the bound is
        // the cuts.
        let wide = match problem.forwarding() {
            Forwarding::Cluster if self.multicast => Some(Wide::new(problem, &frags, self.name())),
            _ => None,
        };
        let (plan, bound, known) = match wide {
            None => {
                let (plan, solution) = self.plan_solved(problem, problem, &frags, None)?;
                // Where the solve computed the cuts, the trivial bound costs
                // one more pass over the fragments here, and the report need
                // not cut them again (the 1T weight sync: 6 s of its
                // command): the larger of it and the LP's certificate, the
                // report's rule.
                let bound = match (solution.bound, solution.cut) {
                    (certified, Some(cut)) => Some(certify::raised(
                        crate::cost::trivial_given_cut(problem, &frags, cut),
                        certified.as_ref(),
                    )),
                    (certified, None) => certified,
                };
                (plan, bound, None)
            }
            Some(w) if w.trees_suffice() => {
                let (makespan, trees) = w.trees.expect("trees that suffice were planned");
                (trees, Some(w.cuts), Some(makespan))
            }
            Some(w) => {
                // Planned within nodes, against the cuts of such plans.
                let within_nodes = problem.clone().with_forwarding(Forwarding::Node);
                let (plan, _) = self.plan_solved(problem, &within_nodes, &frags, Some(w.within))?;
                let makespan = crate::simulate(&plan).makespan_s;
                // Ties keep the LP's plan.
                let (makespan, plan) = match w.trees {
                    Some((trees_makespan, trees)) if trees_makespan < makespan => (trees_makespan, trees),
                    _ => (makespan, plan),
                };
                (plan, Some(w.cuts), Some(makespan))
            }
        };
        // The alternatives have a copy per fragment (forwarding across the
        // cluster, where `known` is set, the plan may have far fewer).
        let many = plan.copies.len().max(if known.is_some() { frags.len() } else { 0 });
        if !self.portfolio || many > PORTFOLIO_MAX_COPIES {
            return Ok((plan, bound));
        }
        // The LP's plan and the greedy alternatives are judged by the
        // simulator side by side (rayon); the first of the fastest wins, so
        // ties keep the LP's plan, whatever finishes first.
        // Every baseline, so that `lp` never loses to one (Qwen3-235B's
        // one-node weight sync: `static-p2p`'s plan was 60 µs faster).
        let alternatives: [&(dyn Planner + Sync); 5] = [
            &crate::HotSpa,
            &crate::LeastLoaded,
            &crate::StaticP2p,
            &crate::Tenplex,
            &crate::Central,
        ];
        let (lp_makespan, others) = rayon::join(
            || known.unwrap_or_else(|| crate::simulate(&plan).makespan_s),
            || {
                alternatives
                    .par_iter()
                    .filter_map(|a| a.plan(problem).ok())
                    .collect::<Vec<_>>()
            },
        );
        // No simulation beats a plan's busiest resource (bytes over
        // capacity, messages over the issue rate), so an alternative whose
        // load alone reaches the LP plan's makespan cannot win: it is not
        // simulated (a greedy all-to-all can take a minute to simulate).
        let cluster = problem.cluster();
        let others: Vec<(f64, Plan)> = others
            .into_par_iter()
            .filter(|p| Loads::of(p).max_time(cluster).0 < lp_makespan)
            .filter(|p| crate::issue::stream_ids(p.copies.iter()).1.len() <= PORTFOLIO_MAX_STREAMS)
            .map(|p| (crate::simulate(&p).makespan_s, p))
            .collect();
        let mut best = (lp_makespan, plan);
        for (makespan, mut other) in others {
            if makespan < best.0 {
                other.planner = self.name().to_string();
                best = (makespan, other);
            }
        }
        Ok((best.1, bound))
    }
}

/// What the `lp` planner weighs where forwarding reaches across the cluster.
struct Wide {
    /// The cuts of every plan that forwards within nodes only.
    within: LowerBound,
    /// The bound: the cuts across the cluster, or the message bound.
    cuts: LowerBound,
    /// The broadcast trees and their simulated makespan, where worth
    /// planning.
    trees: Option<(f64, Plan)>,
}

impl Wide {
    fn new(problem: &Problem, frags: &[Fragment], name: &str) -> Wide {
        let (within, cuts) = crate::cost::cut_lower_bounds(problem, frags);
        let cuts = crate::cost::trivial_given_cut(problem, frags, cuts);
        // Where the cuts within nodes are those across the cluster, trees
        // lower no cut, and the LP reaches the cuts: they are planned there
        // only on small problems (where the LP's certificate, which does
        // not hold here, was above the cuts, they may come closer to them).
        let worth = within.seconds > cuts.seconds * (1.0 + TREES_ENOUGH) || frags.len() <= PORTFOLIO_MAX_COPIES;
        let trees = worth.then(|| {
            let plan = crate::trees::tree_plan(problem, frags, name);
            (crate::simulate(&plan).makespan_s, plan)
        });
        Wide { within, cuts, trees }
    }

    /// Whether the trees are taken without solving the LP: near the cuts,
    /// or faster than any plan that forwards within nodes can be (the
    /// trainer's egress carrying the weights once per engine).
    fn trees_suffice(&self) -> bool {
        self.trees.as_ref().is_some_and(|&(makespan, _)| {
            makespan <= self.cuts.seconds * (1.0 + TREES_ENOUGH) || self.within.seconds >= makespan
        })
    }
}

/// How close to the cuts (a fraction of them) a broadcast-tree plan's
/// simulated makespan must come for the `lp` planner to take it without
/// solving its LP, where the problem allows forwarding across the cluster
/// (it is also taken where plans that forward within nodes cannot beat it).
pub const TREES_ENOUGH: f64 = 5e-3;

/// The largest plans (in copies) on which the `lp` planner also tries the
/// baselines' plans (see [`LpPlannerBuilder::portfolio`]): the
/// simulator judges each in well under a second there (Qwen3-235B's
/// one-node weight sync, 296k copies, where `static-p2p` was 0.016% faster
/// than the LP's plan with its tiny commodities pinned), and beyond it
/// transfer time, which the LP optimises, dwarfs message latency.
pub const PORTFOLIO_MAX_COPIES: usize = 500_000;

/// The most streams (distinct sender, relays, receiver) of a baseline's
/// plan that the `lp` planner simulates beside its own (see
/// [`LpPlannerBuilder::portfolio`]). Every alternative the paper and large
/// suites simulate has at most 49k. GPT-3 175B with ZeRO-1 on 4,096 GPUs
/// of the 2:1 rail fabric has 285k copies, under [`PORTFOLIO_MAX_COPIES`],
/// and the portfolio simulated `hotspa`, `least-loaded` and `static-p2p`
/// (83k, 171k and 208k streams), 40 s of a 44 s planning with the
/// simulator of the time (0.25-0.7 s each since the level-based one), for
/// plans 1.1–2.7% slower than the LP's. Where that many streams cross the
/// network, transfer time, which the LP optimises, dwarfs message latency.
pub const PORTFOLIO_MAX_STREAMS: usize = 64_000;

/// LPs of at least this many columns are solved by the simplex method
/// without presolve. Smaller ones (every LP of the paper and large suites,
/// at most about 10k columns) keep it, and their plans are unchanged.
pub const PRESOLVE_MAX_COLUMNS: usize = 50_000;
