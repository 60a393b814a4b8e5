//! Step 4: the LP's byte totals become copies: fragments split among their
//! paths at element granularity, multicasts emitted with their forwards.

use std::cmp::Reverse;
use std::collections::BTreeSet;

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
/// one element; the last entry of `split` is left to unicast.
///
/// Which boxes an option carries decides how many messages its leader
/// forwards, and per-message issue time can set the makespan: filled in box
/// order, one leader of a redeploy to 256 new GPUs got a run of small
/// tensors and forwarded 1.7x the average number of messages (makespan 1.43x
/// the bound). So boxes go smallest first, each whole to the leader that has
/// led the fewest copies so far (`sent`, per device, across multicasts)
/// among those with an option that has room for it, into that leader's
/// tightest-fitting option; the largest boxes come last and are split among
/// the largest options left, which fills the quotas exactly. Records in
/// `start` how many elements of each member's fragment the multicast
/// delivered (a prefix).
pub(super) fn multicast_copies(
    problem: &Problem,
    frags: &[Fragment],
    m: &Multicast,
    split: &[u64],
    start: &mut [u64],
    sent: &mut [usize],
    out: &mut Vec<Copy>,
) {
    let tensors = problem.tensors();
    let options: Vec<(DeviceId, usize)> = m.options().collect();
    // Each leader's options with bytes left, by bytes (then option).
    let mut left: Vec<BTreeSet<(u64, usize)>> = vec![BTreeSet::new(); m.members.len()];
    for (k, &quota) in split.iter().take(options.len()).enumerate() {
        if quota > 0 {
            left[options[k].1].insert((quota, k));
        }
    }
    let mut total: Vec<u64> = left.iter().map(|o| o.iter().map(|e| e.0).sum()).collect();
    // Smallest boxes first, so that counts even out while every leader
    // has room; the largest come last and are split to fill the quotas.
    let mut order: Vec<usize> = (0..m.groups.len()).collect();
    order.sort_by_key(|&g| (frags[m.groups[g][0]].bytes, g));
    let mut emitted: Vec<(usize, Copy)> = Vec::new();
    for g in order {
        let group = &m.groups[g];
        let f = &frags[group[0]];
        let elem = tensors[f.tensor as usize].dtype.size();
        let n = f.region.volume();
        let mut at = 0;
        while at < n {
            let rest = (n - at) * elem;
            // The leader with the fewest copies among those with room for
            // the rest of the box, or else the one with the largest option.
            let roomy = (0..left.len())
                .filter(|&l| left[l].last().is_some_and(|&(q, _)| q >= rest))
                .min_by_key(|&l| (sent[m.members[l] as usize], Reverse(total[l]), l));
            let largest = || {
                (0..left.len())
                    .filter_map(|l| left[l].last().map(|&(q, k)| (q, Reverse(k), l)))
                    .max()
                    .map(|(_, _, l)| l)
            };
            let Some(leader) = roomy.or_else(largest) else {
                break; // no option has a whole element of this box left
            };
            // Its option that fits the rest of the box most tightly, or
            // else its largest.
            let &(quota, k) = left[leader]
                .range((rest, 0)..)
                .next()
                .or_else(|| left[leader].last())
                .expect("a leader with bytes left");
            let take = (quota / elem).min(n - at);
            if take == 0 {
                break; // not even the largest option has a whole element left
            }
            left[leader].remove(&(quota, k));
            let src = options[k].0;
            let boxes = if take == n {
                vec![f.region.clone()]
            } else {
                f.region.flat_range(at, at + take)
            };
            let lead = &frags[group[leader]];
            let fanout: Vec<Forward> = group
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != leader)
                .map(|(_, &i)| Forward {
                    dst: frags[i].dst,
                    buffer: frags[i].buffer,
                    offset: frags[i].offset,
                })
                .collect();
            sent[m.members[leader] as usize] += boxes.len();
            total[leader] -= take * elem;
            for region in boxes {
                emitted.push((
                    g,
                    Copy {
                        fanout: fanout.clone(),
                        ..lead.copy(src, Vec::new(), region)
                    },
                ));
            }
            let quota = quota - take * elem;
            if quota > 0 {
                left[leader].insert((quota, k));
            }
            at += take;
        }
        for &i in group {
            start[i] = at;
        }
    }
    // Emit in box order (stable within a box), as the target layout reads.
    emitted.sort_by_key(|&(g, _)| g);
    out.extend(emitted.into_iter().map(|(_, copy)| copy));
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
    // About a copy per fragment (a multicast takes several, a split adds a
    // few): sized once, not doubled and moved (9M copies of 150 bytes in a
    // 1T weight sync).
    let mut copies = Vec::with_capacity(frags.len() + frags.len() / 16);
    // Elements of each fragment delivered by multicasts (a prefix).
    let mut start = vec![0u64; frags.len()];
    // Copies each device leads so far, across multicasts.
    let mut sent = vec![0usize; problem.cluster().num_devices() as usize];
    for (m, split) in solution.multicasts.iter().zip(&solution.multicast_split) {
        multicast_copies(problem, frags, m, split, &mut start, &mut sent, &mut copies);
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
