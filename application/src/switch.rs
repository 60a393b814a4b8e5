//! Hot switching between parallel strategies inside a training step, as
//! HotSPa (SOSP'24) does: sequences are grouped by length, each group runs
//! under its own strategy, and the model state moves between strategies
//! several times per step.
//!
//! A step starts and ends at the *base* strategy (the first one given, where
//! the optimizer state lives) and visits every other strategy once. Each
//! switch moves the weights (and, with [`SwitchState::ParamsAndGrads`], the
//! gradients accumulated so far, which return to the base layout at the end
//! of the step) from one layout to the next. Gradients leave a strategy as
//! per-rank partial sums (each data-parallel rank's own accumulation, not yet
//! reduced) and arrive reduced: one plan of reduce-copies does the
//! data-parallel reduction and the move together (the framework then
//! accumulates on top of the reduced value on one rank of each replica group
//! and from zero on the others). Every ordered pair of strategies
//! is planned once with the chosen planner, checked, simulated and bounded;
//! the order of the strategies that minimises the step's total switching time
//! is then found exactly (Held–Karp over the strategies, k ≤ 16), skipping
//! switches whose two coexisting layouts exceed the memory budget.
//!
//! Plans are cached by (model, cluster, state, planner, source, target) in
//! the session: a training loop asks for the same switch every step and
//! gets the plan back in well under a microsecond ([`Session::cached_switch`]).

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde::Serialize;
use tenplan_models::{ModelSpec, ModelState, StateKind};
use tenplan_planner::PlannerSpec;
use tenplan_ptc::{Cluster, DType, DeviceId, Layout, Plan, Problem};

use crate::assess::{assess, Bound};
use crate::cache::Weigh;
use crate::problem::{ClusterKey, Config};
use crate::{Error, Result, Session};

/// What moves at each switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum SwitchState {
    /// bf16 weights.
    Params,
    /// bf16 weights and fp32 accumulated gradients.
    ParamsAndGrads,
}

impl SwitchState {
    /// Parse `params` or `params+grads`.
    pub fn parse(s: &str) -> Option<SwitchState> {
        match s {
            "params" => Some(SwitchState::Params),
            "params+grads" => Some(SwitchState::ParamsAndGrads),
            _ => None,
        }
    }

    /// The name `parse` reads.
    pub fn as_str(self) -> &'static str {
        match self {
            SwitchState::Params => "params",
            SwitchState::ParamsAndGrads => "params+grads",
        }
    }

    fn kind(self) -> StateKind {
        match self {
            SwitchState::Params => StateKind::Weights(DType::BF16),
            SwitchState::ParamsAndGrads => StateKind::WeightsAndGrads,
        }
    }
}

/// Identifies one switch plan in the cache.
#[derive(Clone, Debug, PartialEq)]
pub struct SwitchKey {
    /// The model (its name alone would confuse two configs in equally named directories).
    pub model: ModelSpec,
    /// The cluster.
    pub cluster: Cluster,
    /// What moves.
    pub state: SwitchState,
    /// The planner.
    pub planner: PlannerSpec,
    /// Source strategy.
    pub from: Config,
    /// Target strategy.
    pub to: Config,
}

// Cheap fields hash, the whole key compares.
impl Hash for SwitchKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.model.name.hash(h);
        ClusterKey(self.cluster.clone()).hash(h);
        self.state.hash(h);
        self.planner.hash(h);
        self.from.hash(h);
        self.to.hash(h);
    }
}

impl Eq for SwitchKey {}

/// One planned switch between two strategies.
#[derive(Clone, Debug, Serialize)]
pub struct Switch {
    /// Source strategy.
    pub from: String,
    /// Target strategy.
    pub to: String,
    /// The plan (checked).
    #[serde(skip)]
    pub plan: Arc<Plan>,
    /// Simulated makespan.
    pub makespan_s: f64,
    /// Lower bound on any plan's makespan for this switch.
    pub lower_bound_s: f64,
    /// Bytes sent between devices.
    pub bytes_moved: u64,
    /// Bytes crossing a node boundary.
    pub bytes_cross_node: u64,
    /// Time the planner took.
    pub planning_time_s: f64,
    /// Most bytes any device holds while both layouts coexist.
    pub peak_device_bytes: u64,
    /// The device holding them.
    pub peak_device: DeviceId,
}

impl Weigh for Switch {
    fn weight(&self) -> u64 {
        self.plan.weight()
    }
}

/// A switching problem: a model on a cluster and its strategies.
#[derive(Clone, Debug)]
pub struct SwitchRequest {
    /// The model.
    pub model: ModelSpec,
    /// The cluster.
    pub cluster: Cluster,
    /// Strategies; the first is the base.
    pub configs: Vec<Config>,
    /// What moves.
    pub state: SwitchState,
    /// The planner.
    pub planner: PlannerSpec,
    /// Bytes each device may hold during a switch (both layouts), if limited.
    pub memory_budget: Option<u64>,
}

impl SwitchRequest {
    /// The cache key of the switch from strategy `from` to strategy `to`
    /// (indices into [`SwitchRequest::configs`]).
    pub fn key(&self, from: usize, to: usize) -> SwitchKey {
        SwitchKey {
            model: self.model.clone(),
            cluster: self.cluster.clone(),
            state: self.state,
            planner: self.planner.clone(),
            from: self.configs[from].clone(),
            to: self.configs[to].clone(),
        }
    }
}

/// The best order of a step and its switches.
#[derive(Clone, Debug, Serialize)]
pub struct Schedule {
    /// Strategies in step order, from the base back to the base.
    pub order: Vec<String>,
    /// The same order as indices into the request's strategies.
    #[serde(skip)]
    pub order_indices: Vec<usize>,
    /// The switches along that order.
    pub switches: Vec<Arc<Switch>>,
    /// Total simulated switching time per step.
    pub total_s: f64,
    /// Sum of the switches' lower bounds.
    pub total_bound_s: f64,
    /// Bytes moved per step.
    pub bytes_moved: u64,
    /// Most bytes any device holds during any switch of the step.
    pub peak_device_bytes: u64,
    /// Every ordered pair's switch time (seconds; null where over budget), rows = from.
    pub matrix_s: Vec<Vec<Option<f64>>>,
}

fn peak(from: &Layout, to: &Layout) -> (u64, DeviceId) {
    let mut best = (0, 0);
    for d in from.devices().chain(to.devices()) {
        let b = from.device_bytes(d) + to.device_bytes(d);
        if b > best.0 || (b == best.0 && d < best.1) {
            best = (b, d);
        }
    }
    best
}

impl Session {
    /// Plan (or fetch from the cache) every ordered pair's switch and choose
    /// the best order of a step.
    pub fn switch(&self, req: &SwitchRequest) -> Result<Schedule> {
        let k = req.configs.len();
        if !(2..=16).contains(&k) {
            return Err(Error::StrategyCount { got: k });
        }
        let state = ModelState::new(&req.model, req.state.kind());
        let layouts: Vec<Layout> = req
            .configs
            .iter()
            .map(|c| {
                let strategy = |source| Error::Strategy {
                    strategy: c.to_string(),
                    source,
                };
                c.parsed().check_cluster(&req.cluster).map_err(strategy)?;
                state.layout(c.parsed()).map_err(strategy)
            })
            .collect::<Result<_>>()?;
        // Gradients leave a strategy as per-rank partial sums and arrive reduced.
        let grads = |t: u32| state.tensors()[t as usize].name.starts_with("grad.");
        let sources: Vec<Layout> = layouts
            .iter()
            .map(|l| l.with_partial(grads))
            .collect::<Result<_, _>>()?;
        let mut switches: Vec<Vec<Option<Arc<Switch>>>> = vec![vec![None; k]; k];
        for i in 0..k {
            for j in 0..k {
                if i == j {
                    continue;
                }
                let (bytes, device) = peak(&layouts[i], &layouts[j]);
                if req.memory_budget.is_some_and(|b| bytes > b) {
                    continue;
                }
                let s = self.switches.get_or_insert_with(&req.key(i, j), || {
                    let problem = Problem::new(sources[i].clone(), layouts[j].clone(), req.cluster.clone())?;
                    let a = assess(&problem, std::slice::from_ref(&req.planner), Bound::Exact)?
                        .remove(0)
                        .verified()?;
                    let r = &a.report;
                    Ok(Switch {
                        from: req.configs[i].to_string(),
                        to: req.configs[j].to_string(),
                        makespan_s: r.makespan_s,
                        lower_bound_s: r.lower_bound_s,
                        bytes_moved: r.bytes_moved,
                        bytes_cross_node: r.bytes_cross_node,
                        planning_time_s: r.planning_time_s,
                        peak_device_bytes: bytes,
                        peak_device: device,
                        plan: a.plan,
                    })
                })?;
                switches[i][j] = Some(s);
            }
        }
        let cost: Vec<Vec<Option<f64>>> = switches
            .iter()
            .map(|row| row.iter().map(|s| s.as_ref().map(|s| s.makespan_s)).collect())
            .collect();
        let Some((order, total_s)) = best_cycle(&cost) else {
            return Err(Error::OverBudget {
                budget: req.memory_budget.unwrap_or(u64::MAX),
                smallest: (0..k)
                    .flat_map(|i| (0..k).filter(move |&j| j != i).map(move |j| (i, j)))
                    .map(|(i, j)| peak(&layouts[i], &layouts[j]).0)
                    .min()
                    .unwrap_or(0),
            });
        };
        let along: Vec<Arc<Switch>> = order
            .windows(2)
            .map(|w| switches[w[0]][w[1]].clone().expect("the cycle uses planned switches"))
            .collect();
        Ok(Schedule {
            order: order.iter().map(|&i| req.configs[i].to_string()).collect(),
            order_indices: order.clone(),
            total_bound_s: along.iter().map(|s| s.lower_bound_s).sum(),
            bytes_moved: along.iter().map(|s| s.bytes_moved).sum(),
            peak_device_bytes: along.iter().map(|s| s.peak_device_bytes).max().unwrap_or(0),
            switches: along,
            total_s,
            matrix_s: cost,
        })
    }

    /// A switch planned before, if it is in the cache (a lookup, no planning).
    pub fn cached_switch(&self, key: &SwitchKey) -> Option<Arc<Switch>> {
        self.switches.get(key)
    }
}

/// The cheapest cycle from node 0 through every node and back (asymmetric
/// costs; `None` = forbidden), exactly, by Held–Karp dynamic programming.
/// Ties go to the lexicographically smallest order.
pub fn best_cycle(cost: &[Vec<Option<f64>>]) -> Option<(Vec<usize>, f64)> {
    let k = cost.len();
    if k == 1 {
        return Some((vec![0, 0], 0.0));
    }
    let full = 1usize << k;
    // dp[mask][j]: cheapest path from 0 visiting `mask` (which holds 0 and j), ending at j.
    let mut dp = vec![vec![f64::INFINITY; k]; full];
    let mut prev = vec![vec![usize::MAX; k]; full];
    dp[1][0] = 0.0;
    for mask in 1..full {
        if mask & 1 == 0 {
            continue;
        }
        for j in 0..k {
            let here = dp[mask][j];
            if mask & (1 << j) == 0 || !here.is_finite() {
                continue;
            }
            for n in 1..k {
                if mask & (1 << n) != 0 {
                    continue;
                }
                let Some(c) = cost[j][n] else { continue };
                let next = mask | (1 << n);
                if here + c < dp[next][n] {
                    dp[next][n] = here + c;
                    prev[next][n] = j;
                }
            }
        }
    }
    let all = full - 1;
    let (mut best, mut last) = (f64::INFINITY, usize::MAX);
    for j in 1..k {
        if let Some(c) = cost[j][0] {
            if dp[all][j] + c < best {
                best = dp[all][j] + c;
                last = j;
            }
        }
    }
    if !best.is_finite() {
        return None;
    }
    let mut tail = Vec::new();
    let (mut mask, mut j) = (all, last);
    while j != 0 {
        tail.push(j);
        let p = prev[mask][j];
        mask &= !(1 << j);
        j = p;
    }
    tail.reverse();
    let mut order = vec![0];
    order.extend(tail);
    order.push(0);
    Some((order, best))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute(cost: &[Vec<Option<f64>>]) -> Option<f64> {
        fn perms(v: &mut Vec<usize>, k: usize, out: &mut Vec<Vec<usize>>) {
            if k == v.len() {
                out.push(v.clone());
            }
            for i in k..v.len() {
                v.swap(k, i);
                perms(v, k + 1, out);
                v.swap(k, i);
            }
        }
        let mut rest: Vec<usize> = (1..cost.len()).collect();
        let mut all = Vec::new();
        perms(&mut rest, 0, &mut all);
        all.into_iter()
            .filter_map(|p| {
                let mut path = vec![0];
                path.extend(p);
                path.push(0);
                path.windows(2).map(|w| cost[w[0]][w[1]]).sum::<Option<f64>>()
            })
            .min_by(f64::total_cmp)
    }

    #[test]
    fn held_karp_matches_enumeration() {
        let mut x = 12345u64;
        let mut rnd = || {
            x = tenplan_ptc::rng::mix(x);
            x
        };
        for k in 2..=7 {
            for _ in 0..30 {
                let cost: Vec<Vec<Option<f64>>> = (0..k)
                    .map(|i| {
                        (0..k)
                            .map(|j| (i != j && rnd() % 5 != 0).then(|| (rnd() % 1000) as f64))
                            .collect()
                    })
                    .collect();
                let got = best_cycle(&cost);
                assert_eq!(got.as_ref().map(|g| g.1), brute(&cost), "{cost:?}");
                if let Some((order, total)) = got {
                    assert_eq!(order.len(), k + 1);
                    assert_eq!((order[0], order[k]), (0, 0));
                    let mut seen = order[..k].to_vec();
                    seen.sort();
                    assert_eq!(seen, (0..k).collect::<Vec<_>>());
                    let sum: f64 = order.windows(2).map(|w| cost[w[0]][w[1]].unwrap()).sum();
                    assert_eq!(sum, total);
                }
            }
        }
    }
}
