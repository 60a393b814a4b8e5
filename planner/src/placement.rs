//! Placement: which physical device of the target's device set runs which
//! target rank. Megatron's fixed order (rank r on the r-th device) can move
//! far more data than needed; choosing the assignment is a linear assignment
//! problem, solved exactly here with the Hungarian algorithm.

use std::collections::BTreeMap;

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
    let cluster = problem.cluster();
    let target = problem.target();
    // Slots: every (shard, replica) of the target, by its current device.
    let slots: Vec<DeviceId> = target.devices().collect();
    let n = slots.len();
    if n > MAX_PLACEMENT_RANKS {
        return Err(Error::PlacementTooLarge {
            ranks: n,
            max: MAX_PLACEMENT_RANKS,
        });
    }
    let frags = fragments(problem)?;
    let slot_index: BTreeMap<DeviceId, usize> = slots.iter().enumerate().map(|(i, &d)| (d, i)).collect();
    // Per-slot discounts: per node and per device, of the bytes it needs.
    let nodes = cluster.nodes() as usize;
    let mut total = vec![0i64; n];
    let mut node_disc = vec![vec![0i64; nodes]; n];
    let mut dev_disc: Vec<BTreeMap<DeviceId, i64>> = vec![BTreeMap::new(); n];
    for f in &frags {
        let j = slot_index[&f.dst];
        let b = f.bytes as i64;
        total[j] += CROSS * b;
        let mut seen_nodes: Vec<u32> = f.holders.iter().map(|&h| cluster.node_of(h)).collect();
        seen_nodes.sort_unstable();
        seen_nodes.dedup();
        for nd in seen_nodes {
            node_disc[j][nd as usize] += (CROSS - INTRA) * b;
        }
        for &h in f.holders.iter() {
            *dev_disc[j].entry(h).or_default() += INTRA * b;
        }
    }
    let cost: Vec<Vec<i64>> = (0..n)
        .map(|j| {
            slots
                .iter()
                .map(|&d| {
                    total[j] - node_disc[j][cluster.node_of(d) as usize] - dev_disc[j].get(&d).copied().unwrap_or(0)
                })
                .collect()
        })
        .collect();
    let assign = hungarian(&cost);
    let map: BTreeMap<DeviceId, DeviceId> = (0..n).map(|j| (slots[j], slots[assign[j]])).collect();
    let relabelled = target.relabel(|d| map.get(&d).copied().unwrap_or(d))?;
    let placed = Problem::new(problem.source().clone(), relabelled, cluster.clone())?.with_job(*problem.job());
    Ok((placed, map))
}

/// The most target ranks [`optimize_placement`] takes on. Its dense
/// assignment problem costs n² memory and O(n³) time: at 4,096 GPUs (3,072
/// to 4,096 target ranks) planning took 10-23 s in the scale suite; at
/// 16,384 GPUs (12,288 ranks) it ran past 150 s with 6.5-7.9 GB resident.
pub const MAX_PLACEMENT_RANKS: usize = 4096;

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

    /// More target ranks than the dense assignment takes on: one clear
    /// error naming the count and the limit, before any fragment is cut or
    /// cost allocated; a small target is placed.
    #[test]
    fn placement_beyond_the_limit_is_refused_with_the_rank_count() {
        use super::{optimize_placement, MAX_PLACEMENT_RANKS};
        use tenplan_models::{find, ModelState, StateKind};
        let state = ModelState::new(find("gpt3-350m").unwrap(), StateKind::Training);
        let problem = |dp: usize| {
            let layout = |s: &str| state.layout(&s.parse().unwrap()).unwrap();
            let cluster = tenplan_ptc::Cluster::parse(&format!("dgx-h100:{}", dp.div_ceil(8))).unwrap();
            tenplan_ptc::Problem::new(layout("tp=1,pp=1,dp=8"), layout(&format!("tp=1,pp=1,dp={dp}")), cluster).unwrap()
        };
        let e = optimize_placement(&problem(MAX_PLACEMENT_RANKS + 8)).unwrap_err();
        assert!(
            matches!(e, crate::Error::PlacementTooLarge { ranks, max } if ranks == MAX_PLACEMENT_RANKS + 8 && max == MAX_PLACEMENT_RANKS),
            "{e}"
        );
        assert!(
            e.to_string().contains(&format!("{} ranks", MAX_PLACEMENT_RANKS + 8)),
            "{e}"
        );
        assert!(optimize_placement(&problem(64)).is_ok());
    }
}
