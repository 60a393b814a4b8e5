//! Placement: which physical device of the target's device set runs which
//! target rank. Megatron's fixed order (rank r on the r-th device) can move
//! far more data than needed; choosing the assignment is a linear assignment
//! problem, solved exactly here with the Hungarian algorithm.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use tenplan_ptc::{DeviceId, Problem};

use crate::intersect::fragments;
use crate::{Error, Result};

/// Cost of receiving `bytes` on device `d` when the data's live holders are
/// `holders`: nothing if `d` holds it, 1 per byte from its own node, 4 per
/// byte from another node (network links are the scarce ones).
const INTRA: i64 = 1;
const CROSS: i64 = 4;

/// The problem with its target ranks re-assigned to the target's devices so
/// that the weighted traffic (cross-node bytes ×4, intra-node bytes ×1) is
/// smallest. Returns the new problem and the device map (old → new).
pub fn optimize_placement(problem: &Problem) -> Result<(Problem, BTreeMap<DeviceId, DeviceId>)> {
    let target = problem.target();
    // Slots: every (shard, replica) of the target, by its current device.
    let slots: Vec<DeviceId> = target.devices().collect();
    let n = slots.len();
    let map = if n > MAX_PLACEMENT_RANKS {
        by_classes(problem, &slots, MAX_CLASS_PAIRS)?
    } else {
        let costs = ShardCosts::of(problem)?;
        let cost: Vec<Vec<i64>> = slots
            .iter()
            .map(|&j| {
                let k = costs.shard_of[&j];
                slots.iter().map(|&d| costs.cost(k, d)).collect()
            })
            .collect();
        let assign = hungarian(&cost);
        (0..n).map(|j| (slots[j], slots[assign[j]])).collect()
    };
    let relabelled = target.relabel(|d| map.get(&d).copied().unwrap_or(d))?;
    Ok((problem.with_target(relabelled)?, map))
}

/// What each target shard's data costs on each device: a shard's ranks
/// (its data-parallel replicas) need the same data, so costs are kept per
/// shard, summed per holder list (replicated state shares a few lists of
/// thousands of holders).
struct ShardCosts<'a> {
    cluster: &'a tenplan_ptc::Cluster,
    /// The shard of each target device.
    shard_of: FxHashMap<DeviceId, usize>,
    /// Every byte across the network: a device that holds none of the
    /// shard's data on a node that holds none.
    total: Vec<i64>,
    /// Discounts of the nodes and devices that hold some.
    node_disc: Vec<FxHashMap<u32, i64>>,
    dev_disc: Vec<FxHashMap<DeviceId, i64>>,
}

impl<'a> ShardCosts<'a> {
    fn of(problem: &'a Problem) -> Result<Self> {
        let cluster = problem.cluster();
        let shards = problem.target().shards();
        let shard_of: FxHashMap<DeviceId, usize> = shards
            .iter()
            .enumerate()
            .flat_map(|(k, s)| s.devices.iter().map(move |&d| (d, k)))
            .collect();
        // Each shard's bytes by holder list, from its first replica's
        // fragments (the others' are copies of them).
        let frags = fragments(problem)?;
        let mut need: Vec<FxHashMap<*const DeviceId, (&[DeviceId], i64)>> = vec![FxHashMap::default(); shards.len()];
        for f in &frags {
            let k = shard_of[&f.dst];
            if shards[k].devices[0] == f.dst {
                need[k].entry(f.holders.as_ptr()).or_insert((&f.holders[..], 0)).1 += f.bytes as i64;
            }
        }
        let mut total = vec![0i64; shards.len()];
        let mut node_disc: Vec<FxHashMap<u32, i64>> = vec![FxHashMap::default(); shards.len()];
        let mut dev_disc: Vec<FxHashMap<DeviceId, i64>> = vec![FxHashMap::default(); shards.len()];
        for (k, lists) in need.iter().enumerate() {
            for &(holders, b) in lists.values() {
                total[k] += CROSS * b;
                let mut nodes: Vec<u32> = holders.iter().map(|&h| cluster.node_of(h)).collect();
                nodes.sort_unstable();
                nodes.dedup();
                for nd in nodes {
                    *node_disc[k].entry(nd).or_default() += (CROSS - INTRA) * b;
                }
                for &h in holders {
                    *dev_disc[k].entry(h).or_default() += INTRA * b;
                }
            }
        }
        Ok(ShardCosts {
            cluster,
            shard_of,
            total,
            node_disc,
            dev_disc,
        })
    }

    /// The weighted traffic of shard `k`'s data landing on device `d`.
    fn cost(&self, k: usize, d: DeviceId) -> i64 {
        self.total[k]
            - self.node_disc[k].get(&self.cluster.node_of(d)).copied().unwrap_or(0)
            - self.dev_disc[k].get(&d).copied().unwrap_or(0)
    }
}

/// The most target ranks [`optimize_placement`] solves as a dense
/// assignment problem (n² costs, O(n³) time: at 4,096 GPUs, 3,072 to 4,096
/// target ranks, planning took 10-23 s in the scale suite; at 16,384 GPUs,
/// 12,288 ranks, it ran past 150 s with 6.5-7.9 GB resident). Beyond it the
/// same problem is solved over classes: target shards against groups of
/// interchangeable devices.
pub const MAX_PLACEMENT_RANKS: usize = 4096;

/// The most (shard, device) pairs [`optimize_placement`] takes on beyond
/// [`MAX_PLACEMENT_RANKS`] target ranks: it computes a cost per pair, and
/// its LP has at most that many columns. DeepSeek-V3 shrinking on 16,384
/// GPUs is within it (43 s planning); GPT-3 175B with ZeRO-1 there, whose
/// every rank is a shard of its own, has 151M.
pub const MAX_CLASS_PAIRS: usize = 1 << 24;

/// The assignment of [`optimize_placement`] over classes, exactly: the
/// ranks of one target shard (its data-parallel replicas) need the same
/// data, so their rows of costs are equal, and devices whose columns of
/// costs are equal are interchangeable. What is left is a transportation
/// problem, shards (with their replica counts) against groups of devices
/// (with their sizes), whose LP has integral vertices (its matrix is
/// totally unimodular): solved by HiGHS's simplex method, each shard then
/// takes its devices from the groups the solution gives it, in device
/// order. Returns the device map (old rank's device -> new device).
fn by_classes(problem: &Problem, slots: &[DeviceId], max_pairs: usize) -> Result<BTreeMap<DeviceId, DeviceId>> {
    use good_lp::solvers::highs::highs;
    use good_lp::{variable, Expression, ProblemVariables, Solution, SolverModel};

    let shards = problem.target().shards();
    if shards.len().saturating_mul(slots.len()) > max_pairs {
        return Err(Error::PlacementTooLarge {
            ranks: slots.len(),
            shards: shards.len(),
            max: max_pairs,
        });
    }
    let costs = ShardCosts::of(problem)?;
    // Devices by their column of costs, in device order within a group.
    let mut sorted: Vec<DeviceId> = slots.to_vec();
    sorted.sort_unstable();
    let mut group_of: BTreeMap<Vec<i64>, usize> = BTreeMap::new();
    let mut groups: Vec<Vec<DeviceId>> = Vec::new();
    let mut columns: Vec<Vec<i64>> = Vec::new();
    for &d in &sorted {
        let column: Vec<i64> = (0..shards.len()).map(|k| costs.cost(k, d)).collect();
        let g = *group_of.entry(column.clone()).or_insert_with(|| {
            groups.push(Vec::new());
            columns.push(column);
            groups.len() - 1
        });
        groups[g].push(d);
    }
    // Costs relative to the largest, for the solver's tolerances.
    let scale = columns.iter().flatten().map(|c| c.abs()).max().unwrap_or(1).max(1) as f64;
    let mut vars = ProblemVariables::new();
    let x: Vec<Vec<good_lp::Variable>> = (0..shards.len())
        .map(|_| (0..groups.len()).map(|_| vars.add(variable().min(0.0))).collect())
        .collect();
    let objective: Expression = (0..shards.len())
        .flat_map(|k| (0..groups.len()).map(move |g| (k, g)))
        .map(|(k, g)| (columns[g][k] as f64 / scale) * x[k][g])
        .sum();
    let mut model = vars.minimise(objective).using(highs).set_threads(1);
    for (k, shard) in shards.iter().enumerate() {
        let sent: Expression = x[k].iter().sum();
        model.add_constraint(sent.eq(shard.devices.len() as f64));
    }
    for (g, members) in groups.iter().enumerate() {
        let taken: Expression = x.iter().map(|row| row[g]).sum();
        model.add_constraint(taken.eq(members.len() as f64));
    }
    let solution = model
        .solve()
        .map_err(|e| Error::Solver(crate::SolverFailure::Other(format!("placement: {e}"))))?;
    // A vertex is integral: shard k takes x[k][g] devices of group g. The
    // devices of a group cost the same to every shard, so which ones is
    // free: a rank keeps its own device where its shard takes from that
    // device's group (as the dense assignment's ties do: a redeployment,
    // where every device costs the same, keeps the given placement), and
    // the other ranks take what is left of the groups, in device order.
    let not_integral = || {
        Error::Solver(crate::SolverFailure::Other(
            "placement: the transportation LP's solution is not integral".into(),
        ))
    };
    let mut quota: Vec<Vec<usize>> = (0..shards.len())
        .map(|k| {
            (0..groups.len())
                .map(|g| solution.value(x[k][g]).round().max(0.0) as usize)
                .collect()
        })
        .collect();
    let group_index: FxHashMap<DeviceId, usize> = groups
        .iter()
        .enumerate()
        .flat_map(|(g, members)| members.iter().map(move |&d| (d, g)))
        .collect();
    let mut map = BTreeMap::new();
    let mut taken: rustc_hash::FxHashSet<DeviceId> = Default::default();
    for (k, shard) in shards.iter().enumerate() {
        for &rank in &shard.devices {
            let g = group_index[&rank];
            if quota[k][g] > 0 {
                quota[k][g] -= 1;
                map.insert(rank, rank);
                taken.insert(rank);
            }
        }
    }
    let mut left: Vec<std::collections::VecDeque<DeviceId>> = groups
        .iter()
        .map(|members| members.iter().copied().filter(|d| !taken.contains(d)).collect())
        .collect();
    for (k, shard) in shards.iter().enumerate() {
        let rest: Vec<DeviceId> = shard.devices.iter().copied().filter(|r| !map.contains_key(r)).collect();
        let mut ranks = rest.iter();
        for g in 0..groups.len() {
            for _ in 0..quota[k][g] {
                let (Some(&rank), Some(device)) = (ranks.next(), left[g].pop_front()) else {
                    return Err(not_integral());
                };
                map.insert(rank, device);
            }
        }
        if ranks.next().is_some() {
            return Err(not_integral());
        }
    }
    Ok(map)
}

/// Minimum-cost perfect assignment of rows to columns of a square matrix:
/// returns the column of every row. O(n³), shortest augmenting paths with
/// potentials (Kuhn–Munkres as refined by Jonker–Volgenant).
pub fn hungarian(cost: &[Vec<i64>]) -> Vec<usize> {
    let n = cost.len();
    if n == 0 {
        return Vec::new();
    }
    const INF: i64 = i64::MAX / 4;
    // 1-based arrays; column 0 is a sentinel.
    let mut u = vec![0i64; n + 1];
    let mut v = vec![0i64; n + 1];
    let mut p = vec![0usize; n + 1];
    let mut way = vec![0usize; n + 1];
    for i in 1..=n {
        p[0] = i;
        let mut j0 = 0;
        let mut minv = vec![INF; n + 1];
        let mut used = vec![false; n + 1];
        loop {
            used[j0] = true;
            let i0 = p[j0];
            let mut delta = INF;
            let mut j1 = 0;
            for j in 1..=n {
                if !used[j] {
                    let cur = cost[i0 - 1][j - 1] - u[i0] - v[j];
                    if cur < minv[j] {
                        minv[j] = cur;
                        way[j] = j0;
                    }
                    if minv[j] < delta {
                        delta = minv[j];
                        j1 = j;
                    }
                }
            }
            for j in 0..=n {
                if used[j] {
                    u[p[j]] += delta;
                    v[j] -= delta;
                } else {
                    minv[j] -= delta;
                }
            }
            j0 = j1;
            if p[j0] == 0 {
                break;
            }
        }
        loop {
            let j1 = way[j0];
            p[j0] = p[j1];
            j0 = j1;
            if j0 == 0 {
                break;
            }
        }
    }
    let mut assign = vec![0; n];
    for j in 1..=n {
        if p[j] > 0 {
            assign[p[j] - 1] = j - 1;
        }
    }
    assign
}

#[cfg(test)]
mod tests {
    use super::hungarian;

    fn brute(cost: &[Vec<i64>]) -> i64 {
        fn go(cost: &[Vec<i64>], row: usize, used: &mut Vec<bool>) -> i64 {
            if row == cost.len() {
                return 0;
            }
            let mut best = i64::MAX;
            for j in 0..cost.len() {
                if !used[j] {
                    used[j] = true;
                    best = best.min(cost[row][j] + go(cost, row + 1, used));
                    used[j] = false;
                }
            }
            best
        }
        go(cost, 0, &mut vec![false; cost.len()])
    }

    #[test]
    fn matches_brute_force() {
        let mut seed = 12345u64;
        for n in 1..=6 {
            for _ in 0..50 {
                let cost: Vec<Vec<i64>> = (0..n)
                    .map(|_| {
                        (0..n)
                            .map(|_| {
                                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                                ((seed >> 33) % 100) as i64
                            })
                            .collect()
                    })
                    .collect();
                let a = hungarian(&cost);
                let mut cols = a.clone();
                cols.sort_unstable();
                assert_eq!(cols, (0..n).collect::<Vec<_>>());
                let got: i64 = a.iter().enumerate().map(|(i, &j)| cost[i][j]).sum();
                assert_eq!(got, brute(&cost));
            }
        }
    }

    /// A placed problem is the same question with its target relabelled:
    /// its forwarding and job state are kept (it used to be rebuilt by
    /// hand and fell back to node forwarding, so `lp-placed` planned and
    /// bounded another problem than the weight sync it was asked).
    #[test]
    fn a_placed_problem_keeps_every_field() {
        use super::optimize_placement;
        use tenplan_models::{find, ModelState, StateKind};
        use tenplan_ptc::{DatasetFields, DatasetState, Forwarding, JobState};
        let state = ModelState::new(
            find("llama-tiny").unwrap(),
            StateKind::Weights(tenplan_ptc::DType::BF16),
        );
        let from = state.layout(&"tp=1,pp=4,dp=1".parse().unwrap()).unwrap();
        let to = state
            .serving_layout(&"tp=8,dp=3,devices=8-31".parse().unwrap())
            .unwrap();
        let dataset = DatasetState::new(DatasetFields {
            dataset_size: 100,
            seed: 3,
            consumed: 40,
            global_batch: 8,
        })
        .unwrap();
        let job = JobState {
            dataset: Some(dataset),
            ..JobState::default()
        };
        let problem = tenplan_ptc::Problem::new(from, to, tenplan_ptc::Cluster::parse("dgx-h100-rail:4").unwrap())
            .unwrap()
            .with_forwarding(Forwarding::Cluster)
            .with_job(job);
        let (placed, _) = optimize_placement(&problem).unwrap();
        assert_eq!(placed.forwarding(), Forwarding::Cluster);
        assert_eq!(placed.job(), problem.job());
        assert_eq!(placed.source(), problem.source());
        assert_eq!(placed.cluster(), problem.cluster());
    }

    /// Beyond the dense assignment's limit the placement is solved over
    /// classes: a permutation of the target's devices. Where its
    /// transportation problem has more (shard, device) pairs than allowed,
    /// one clear error naming its size, before any cost is computed.
    #[test]
    fn placement_beyond_the_dense_limit_is_solved_over_classes() {
        use super::{by_classes, optimize_placement, MAX_PLACEMENT_RANKS};
        use tenplan_models::{find, ModelState, StateKind};
        let state = ModelState::new(find("gpt3-350m").unwrap(), StateKind::Training);
        let layout = |s: &str| state.layout(&s.parse().unwrap()).unwrap();
        let dp = MAX_PLACEMENT_RANKS + 8;
        let cluster = tenplan_ptc::Cluster::parse(&format!("dgx-h100:{}", dp / 8)).unwrap();
        let problem =
            tenplan_ptc::Problem::new(layout("tp=1,pp=1,dp=8"), layout(&format!("tp=1,pp=1,dp={dp}")), cluster)
                .unwrap();
        let (_, map) = optimize_placement(&problem).unwrap();
        let mut image: Vec<u32> = map.values().copied().collect();
        image.sort_unstable();
        assert_eq!(image, (0..dp as u32).collect::<Vec<_>>());
        let slots: Vec<u32> = problem.target().devices().collect();
        let e = by_classes(&problem, &slots, 1).unwrap_err();
        assert!(
            matches!(e, crate::Error::PlacementTooLarge { ranks, shards: 1, max: 1 } if ranks == dp),
            "{e}"
        );
        assert!(e.to_string().contains(&format!("{dp} target ranks")), "{e}");
    }

    /// Over classes (shards against groups of interchangeable devices) the
    /// assignment is a permutation of the target's devices with the dense
    /// Hungarian assignment's cost, on problems small enough for both; a
    /// redeployment, where every device costs the same, keeps its ranks.
    #[test]
    fn classes_reach_the_dense_assignments_cost() {
        use super::{by_classes, optimize_placement};
        use tenplan_models::{find, ModelState, StateKind};
        let state = ModelState::new(find("gpt3-350m").unwrap(), StateKind::Training);
        let layout = |s: &str| state.layout(&s.parse().unwrap()).unwrap();
        for (from, to, cluster) in [
            ("tp=2,pp=2,dp=4", "tp=2,pp=2,dp=4,devices=16-31", "4x8"),
            ("tp=4,pp=2,dp=2", "tp=2,pp=2,dp=3", "2x8"),
            ("tp=2,pp=2,dp=4", "tp=4,pp=1,dp=3", "2x8"),
            ("tp=1,pp=1,dp=16", "tp=2,pp=2,dp=4,devices=8-23", "4x8"),
        ] {
            let problem =
                tenplan_ptc::Problem::new(layout(from), layout(to), tenplan_ptc::Cluster::parse(cluster).unwrap())
                    .unwrap();
            let slots: Vec<u32> = problem.target().devices().collect();
            let map = by_classes(&problem, &slots, usize::MAX).unwrap();
            let mut image: Vec<u32> = map.values().copied().collect();
            image.sort_unstable();
            let mut sorted = slots.clone();
            sorted.sort_unstable();
            assert_eq!(image, sorted, "{from} -> {to}: not a permutation");
            assert_eq!(map.keys().copied().collect::<Vec<_>>(), sorted);
            if to.contains("devices=16-31") {
                // Every device costs the same: the given placement stays.
                assert!(map.iter().all(|(a, b)| a == b), "{from} -> {to}: {map:?}");
            }
            let weighted = |p: &tenplan_ptc::Problem| {
                crate::fragments(p)
                    .unwrap()
                    .iter()
                    .map(|f| {
                        let node = p.cluster().node_of(f.dst);
                        let b = f.bytes as i64;
                        if f.holders.contains(&f.dst) {
                            0
                        } else if f.holders.iter().any(|&h| p.cluster().node_of(h) == node) {
                            super::INTRA * b
                        } else {
                            super::CROSS * b
                        }
                    })
                    .sum::<i64>()
            };
            let relabelled = problem.target().relabel(|d| map[&d]).unwrap();
            let placed =
                tenplan_ptc::Problem::new(problem.source().clone(), relabelled, problem.cluster().clone()).unwrap();
            let (dense, _) = optimize_placement(&problem).unwrap();
            assert_eq!(weighted(&placed), weighted(&dense), "{from} -> {to}");
        }
    }
}
