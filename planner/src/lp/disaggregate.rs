//! Step 4: the LP's byte totals become copies: fragments split among their
//! paths at element granularity, multicasts emitted with their forwards.

use tenplan_ptc::{Copy, DeviceId, Forward, Problem};

use super::columns::Path;
use super::commodities::{Commodity, Multicast};
use super::model::Fractions;
use super::LpSolution;
use crate::intersect::Fragment;

/// Round an LP split (in bytes) to whole bytes that add up to `total`
/// exactly (largest remainder).
pub(super) fn integral_split(total: u64, bytes: &[f64]) -> Vec<u64> {
    let want: Vec<f64> = bytes.iter().map(|&v| v.max(0.0).min(total as f64)).collect();
    let sum: f64 = want.iter().sum();
    let scaled: Vec<f64> = if sum > 0.0 {
        want.iter().map(|w| w * total as f64 / sum).collect()
    } else {
        let mut v = vec![0.0; bytes.len()];
        v[0] = total as f64;
        v
    };
    let mut out: Vec<u64> = scaled.iter().map(|&v| v.floor() as u64).collect();
    let mut left = total - out.iter().sum::<u64>().min(total);
    let mut order: Vec<usize> = (0..out.len()).collect();
    order.sort_by(|&a, &b| {
        (scaled[b] - scaled[b].floor())
            .total_cmp(&(scaled[a] - scaled[a].floor()))
            .then(a.cmp(&b))
    });
    for i in order.into_iter().cycle() {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    out
}

/// Split a commodity's fragments among its holders so that holder `i` sends
/// `split[i]` bytes, up to one element. Holders with the smallest quotas are
/// served first, from the largest fragments, so that a minor source sends a
/// few large messages rather than many small ones; a fragment is cut in its
/// own row-major order (at most 2·ndim−1 boxes per side of a cut).
pub(super) fn disaggregate(
    problem: &Problem,
    frags: &[Fragment],
    start: &[u64],
    c: &Commodity,
    paths: &[Path],
    split: &[u64],
    out: &mut Vec<Copy>,
) {
    let tensors = problem.tensors();
    let mut quotas: Vec<(Path, u64)> = paths
        .iter()
        .cloned()
        .zip(split.iter().copied())
        .filter(|q| q.1 > 0)
        .collect();
    if quotas.is_empty() {
        let direct = Path {
            src: c.holders[0],
            via: Vec::new(),
        };
        quotas.push((direct, split.iter().sum()));
    }
    // Stable: ties keep path order.
    quotas.sort_by_key(|q| q.1);
    // What is left of each fragment once multicasts have delivered a prefix.
    let mut order: Vec<usize> = c
        .fragments
        .iter()
        .copied()
        .filter(|&i| start[i] < frags[i].region.volume())
        .collect();
    let left = |i: usize| frags[i].bytes / frags[i].region.volume() * (frags[i].region.volume() - start[i]);
    order.sort_by_cached_key(|&i| (std::cmp::Reverse(left(i)), i));
    let last = quotas.len() - 1;
    let mut q = 0;
    let mut pieces: Vec<(usize, Copy)> = Vec::new();
    for &fi in &order {
        let f = &frags[fi];
        let elem = tensors[f.tensor as usize].dtype.size();
        let n = f.region.volume();
        let mut at = start[fi];
        while at < n {
            let (path, quota) = quotas[q].clone();
            let take = if q == last { n - at } else { (quota / elem).min(n - at) };
            if take > 0 {
                let boxes = if at == 0 && take == n {
                    vec![f.region.clone()]
                } else {
                    f.region.flat_range(at, at + take)
                };
                for region in boxes {
                    pieces.push((fi, f.copy(path.src, path.via.clone(), region)));
                }
                quotas[q].1 = quota.saturating_sub(take * elem);
                at += take;
            }
            if at < n && q < last {
                q += 1;
            }
        }
    }
    // Emit in fragment order (stable within a fragment), so plans read in
    // the order of the target layout.
    pieces.sort_by_key(|&(fi, _)| fi);
    out.extend(pieces.into_iter().map(|(_, copy)| copy));
}

/// Emit a multicast's copies: option `k` carries `split[k]` bytes, up to
/// one element, taken from the front of its boxes in order; the last entry
/// of `split` is left to unicast. Records in `start` how many elements of
/// each member's fragment the multicast delivered.
pub(super) fn multicast_copies(
    problem: &Problem,
    frags: &[Fragment],
    m: &Multicast,
    split: &[u64],
    start: &mut [u64],
    out: &mut Vec<Copy>,
) {
    let tensors = problem.tensors();
    let mut quotas: Vec<((DeviceId, usize), u64)> =
        m.options().zip(split.iter().copied()).filter(|q| q.1 > 0).collect();
    let mut q = 0;
    for group in &m.groups {
        if q == quotas.len() {
            break;
        }
        let f = &frags[group[0]];
        let elem = tensors[f.tensor as usize].dtype.size();
        let n = f.region.volume();
        let mut at = 0;
        while at < n && q < quotas.len() {
            let ((src, leader), quota) = quotas[q];
            let take = (quota / elem).min(n - at);
            if take > 0 {
                let boxes = if take == n {
                    vec![f.region.clone()]
                } else {
                    f.region.flat_range(at, at + take)
                };
                let lead = &frags[group[leader]];
                let fanout: Vec<Forward> = group
                    .iter()
                    .enumerate()
                    .filter(|&(k, _)| k != leader)
                    .map(|(_, &i)| Forward {
                        dst: frags[i].dst,
                        buffer: frags[i].buffer,
                        offset: frags[i].offset,
                    })
                    .collect();
                for region in boxes {
                    out.push(Copy {
                        fanout: fanout.clone(),
                        ..lead.copy(src, Vec::new(), region)
                    });
                }
                quotas[q].1 -= take * elem;
                at += take;
            }
            if at < n {
                q += 1;
            }
        }
        for &i in group {
            start[i] = at;
        }
    }
}

/// Whole bytes per path of every commodity and per option of every
/// multicast (plus what it leaves to unicast), from the LP's fractions.
pub(super) fn byte_splits(
    comms: &[Commodity],
    mcasts: &[Multicast],
    chosen: &Fractions,
    mchosen: &Fractions,
) -> (Vec<Vec<u64>>, Vec<Vec<u64>>) {
    let split = comms
        .iter()
        .zip(chosen)
        .map(|(c, fs)| integral_split(c.bytes, &fs.iter().map(|f| f * c.bytes as f64).collect::<Vec<_>>()))
        .collect();
    let multicast_split = mcasts
        .iter()
        .zip(mchosen)
        .map(|(m, ys)| {
            let b = m.bytes as f64;
            let sent: f64 = ys.iter().map(|y| y.max(0.0)).sum();
            let mut want: Vec<f64> = ys.iter().map(|y| y.max(0.0) * b).collect();
            want.push((1.0 - sent).max(0.0) * b);
            integral_split(m.bytes, &want)
        })
        .collect();
    (split, multicast_split)
}

/// A solution's copies: the multicasts' first, then each commodity's
/// fragments split among its paths (what multicasts left of them).
pub(super) fn copies(problem: &Problem, frags: &[Fragment], comms: &[Commodity], solution: &LpSolution) -> Vec<Copy> {
    let mut copies = Vec::new();
    // Elements of each fragment delivered by multicasts (a prefix).
    let mut start = vec![0u64; frags.len()];
    for (m, split) in solution.multicasts.iter().zip(&solution.multicast_split) {
        multicast_copies(problem, frags, m, split, &mut start, &mut copies);
    }
    let tensors = problem.tensors();
    for ((c, paths), split) in comms.iter().zip(&solution.paths).zip(&solution.split) {
        let left: u64 = c
            .fragments
            .iter()
            .map(|&i| (frags[i].region.volume() - start[i]) * tensors[frags[i].tensor as usize].dtype.size())
            .sum();
        if left == 0 {
            continue;
        }
        let split = if left == c.bytes {
            split.clone()
        } else {
            integral_split(left, &split.iter().map(|&b| b as f64).collect::<Vec<_>>())
        };
        disaggregate(problem, frags, &start, c, paths, &split, &mut copies);
    }
    copies
}
