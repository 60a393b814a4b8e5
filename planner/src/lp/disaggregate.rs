//! Step 4: the LP's byte totals become copies: fragments split among their
//! paths at element granularity, multicasts emitted with their forwards.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use rayon::prelude::*;
use tenplan_ptc::{BoxCopy, DeviceId, Forward, Plan, Problem, Region, StreamKey};

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
///
/// Tiny fragments, whose transfer at a NIC's rate takes less than
/// 1/[`TINY_PER_LATENCY`] of a message's latency (optimizer steps, routing
/// biases), cost their issue time, not their bytes: the LP charges a path its fraction of the
/// commodity's messages, so they are dealt out whole first, each to the
/// path furthest below its share of them ([`deal_tiny`]), or all to the
/// destination's own copy where it holds them. Served by bytes
/// alone they all fell to the largest quota: scaling a DeepSeek-V3 AdamW
/// state up to 4,096 GPUs, one source issued every step and bias message of
/// the destinations it served (makespan 1.059x the bound).
pub(super) fn disaggregate(
    problem: &Problem,
    frags: &[Fragment],
    start: &[u64],
    c: &Commodity,
    paths: &[Path],
    split: &[u64],
    out: &mut Drafts,
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
    let cluster = problem.cluster();
    let tiny_bytes = (cluster.latency_s() * cluster.data().bandwidth.nic / TINY_PER_LATENCY) as u64;
    let tiny_from = order.partition_point(|&i| left(i) > tiny_bytes);
    // Each path's relays, entered in `out` once the path is used.
    let mut vias: Vec<Option<u32>> = vec![None; quotas.len()];
    let mut pieces: Vec<(usize, Draft)> = Vec::new();
    if quotas.len() > 1 && tiny_from < order.len() {
        let tiny: Vec<(usize, u64)> = order[tiny_from..].iter().map(|&i| (i, left(i))).collect();
        // A destination that holds them copies them itself: nothing to issue
        // across devices, nothing to move.
        let local = quotas.iter().position(|(p, _)| p.src == c.dst && p.via.is_empty());
        for (fi, q) in deal_tiny(&mut quotas, &tiny, local) {
            let via = relay(out, &mut vias[q], &quotas[q].0);
            send(
                out,
                &mut pieces,
                fi,
                &frags[fi],
                quotas[q].0.src,
                via,
                start[fi]..frags[fi].region.volume(),
            );
        }
        order.truncate(tiny_from);
    }
    let last = quotas.len() - 1;
    let mut q = 0;
    for &fi in &order {
        let f = &frags[fi];
        let elem = tensors[f.tensor as usize].dtype.size();
        let n = f.region.volume();
        let mut at = start[fi];
        while at < n {
            let quota = quotas[q].1;
            let take = if q == last { n - at } else { (quota / elem).min(n - at) };
            if take > 0 {
                let via = relay(out, &mut vias[q], &quotas[q].0);
                send(out, &mut pieces, fi, f, quotas[q].0.src, via, at..at + take);
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
    out.list.extend(pieces.into_iter().map(|(_, draft)| draft));
}

/// How much shorter than a message's latency a tiny fragment's transfer
/// is: dealt by count, the bytes a path gets of them add at most 1/64 of
/// their issue time (counting fragments of up to a whole latency's
/// transfer as tiny took tiny models' plans 2% past their bound).
const TINY_PER_LATENCY: f64 = 64.0;

/// The relay entry of `path` in `out` (`NONE` for a direct path), entered
/// in `slot` the first time the path is used.
fn relay(out: &mut Drafts, slot: &mut Option<u32>, path: &Path) -> u32 {
    if path.via.is_empty() {
        NONE
    } else {
        *slot.get_or_insert_with(|| out.via(path.via.clone()))
    }
}

/// Send elements `range` of fragment `fi` from `src` (relayed by `via`):
/// one draft for the whole fragment, else one per box of the range.
fn send(
    out: &mut Drafts,
    pieces: &mut Vec<(usize, Draft)>,
    fi: usize,
    f: &Fragment,
    src: DeviceId,
    via: u32,
    range: std::ops::Range<u64>,
) {
    if range.start == 0 && range.end == f.region.volume() {
        pieces.push((fi, Draft::of(fi, src, via, NONE, NONE)));
    } else {
        for region in f.region.flat_range(range.start, range.end) {
            let region = out.region(region);
            pieces.push((fi, Draft::of(fi, src, via, NONE, region)));
        }
    }
}

/// Deal `tiny` fragments (index, bytes left) out whole among `quotas`,
/// each to the path furthest below its share of their count (its share of
/// the commodity's bytes, as the LP charges issue time; all of them for
/// `local`, the destination's own copy, where there is one; ties to the
/// earlier path); the bytes dealt are taken off the quotas. Returns each
/// fragment's path.
fn deal_tiny<P>(quotas: &mut [(P, u64)], tiny: &[(usize, u64)], local: Option<usize>) -> Vec<(usize, usize)> {
    let total: u64 = quotas.iter().map(|q| q.1).sum();
    let n = tiny.len() as f64;
    let share: Vec<f64> = (0..quotas.len())
        .map(|q| match local {
            Some(l) => f64::from(u8::from(q == l)) * n,
            None if total == 0 => 0.0,
            None => quotas[q].1 as f64 / total as f64 * n,
        })
        .collect();
    let mut dealt = vec![0u64; quotas.len()];
    tiny.iter()
        .map(|&(fi, bytes)| {
            let q = (0..quotas.len())
                .max_by(|&a, &b| {
                    (share[a] - dealt[a] as f64)
                        .total_cmp(&(share[b] - dealt[b] as f64))
                        .then(b.cmp(&a))
                })
                .expect("at least one quota");
            dealt[q] += 1;
            quotas[q].1 = quotas[q].1.saturating_sub(bytes);
            (fi, q)
        })
        .collect()
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
    out: &mut Drafts,
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
    let mut emitted: Vec<(usize, Draft)> = Vec::new();
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
            let lead = group[leader];
            // A whole box is the leader's own region where it is the
            // first member's (as it is for every member of a group).
            let boxes = if take == n && frags[lead].region == f.region {
                vec![NONE]
            } else if take == n {
                vec![out.region(f.region.clone())]
            } else {
                f.region
                    .flat_range(at, at + take)
                    .into_iter()
                    .map(|r| out.region(r))
                    .collect()
            };
            let fanout: Vec<Forward> = group
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != leader)
                .map(|(_, &i)| Forward::new(frags[i].dst, frags[i].buffer, frags[i].offset))
                .collect();
            sent[m.members[leader] as usize] += boxes.len();
            total[leader] -= take * elem;
            let fanout = if fanout.is_empty() { NONE } else { out.fanout(fanout) };
            for region in boxes {
                emitted.push((g, Draft::of(lead, src, NONE, fanout, region)));
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
    out.list.extend(emitted.into_iter().map(|(_, draft)| draft));
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

/// A solution's copies, drafted: the multicasts' first, then each
/// commodity's fragments split among its paths (what multicasts left of
/// them).
pub(super) fn copies(problem: &Problem, frags: &[Fragment], comms: &[Commodity], solution: &LpSolution) -> Drafts {
    // About a copy per fragment (a multicast takes several, a split adds a
    // few): sized once, not doubled and moved.
    let mut copies = Drafts {
        list: Vec::with_capacity(frags.len() + frags.len() / 16),
        vias: Vec::new(),
        fanouts: Vec::new(),
        regions: Vec::new(),
    };
    // Elements of each fragment delivered by multicasts (a prefix).
    let mut start = vec![0u64; frags.len()];
    // Copies each device leads so far, across multicasts.
    let mut sent = vec![0usize; problem.cluster().num_devices() as usize];
    for (m, split) in solution.multicasts.iter().zip(&solution.multicast_split) {
        multicast_copies(problem, frags, m, split, &mut start, &mut sent, &mut copies);
    }
    // Commodities are split independently once the multicasts are out:
    // in parallel, in chunks appended in commodity order.
    let tensors = problem.tensors();
    let chunks: Vec<Drafts> = comms
        .par_iter()
        .zip(&solution.paths)
        .zip(&solution.split)
        .with_min_len(1024)
        .fold(Drafts::default, |mut out, ((c, paths), split)| {
            let left: u64 = c
                .fragments
                .iter()
                .map(|&i| (frags[i].region.volume() - start[i]) * tensors[frags[i].tensor as usize].dtype.size())
                .sum();
            if left > 0 {
                let split = if left == c.bytes {
                    split.clone()
                } else {
                    integral_split(left, &split.iter().map(|&b| b as f64).collect::<Vec<_>>())
                };
                disaggregate(problem, frags, &start, c, paths, &split, &mut out);
            }
            out
        })
        .collect();
    for chunk in chunks {
        copies.append(chunk);
    }
    copies
}

/// "None" in a [`Draft`]'s index fields.
const NONE: u32 = u32::MAX;

/// A copy decided but not yet written out: a box of a fragment, sent from
/// a holder, perhaps relayed or forwarded. 20 bytes where a [`BoxCopy`] is
/// about 150: the issue order permutes drafts, and each copy is then
/// written once, in its place (Llama 3.1 405B on 16,384 GPUs: 7.3M copies,
/// whose permutation in place took 1.2 s of cache misses).
#[derive(Clone, Copy, Debug)]
pub(super) struct Draft {
    /// The fragment whose target piece the copy writes.
    frag: u32,
    src: DeviceId,
    /// Index into [`Drafts::vias`], or `NONE`: direct.
    via: u32,
    /// Index into [`Drafts::fanouts`], or `NONE`: no forwards.
    fanout: u32,
    /// Index into [`Drafts::regions`], or `NONE`: the fragment's box.
    region: u32,
}

impl Draft {
    fn of(frag: usize, src: DeviceId, via: u32, fanout: u32, region: u32) -> Self {
        Draft {
            frag: frag as u32,
            src,
            via,
            fanout,
            region,
        }
    }
}

/// A plan's copies as drafts, in the order the solution emits them, with
/// what the drafts share: relays, forwards, and the boxes of fragments cut
/// between paths.
#[derive(Default)]
pub(super) struct Drafts {
    list: Vec<Draft>,
    vias: Vec<Vec<DeviceId>>,
    fanouts: Vec<Vec<Forward>>,
    regions: Vec<Region>,
}

impl Drafts {
    /// `other`'s drafts after these.
    fn append(&mut self, other: Drafts) {
        let shift = |i: u32, by: usize| if i == NONE { NONE } else { i + by as u32 };
        let (vias, fanouts, regions) = (self.vias.len(), self.fanouts.len(), self.regions.len());
        self.list.extend(other.list.into_iter().map(|d| Draft {
            via: shift(d.via, vias),
            fanout: shift(d.fanout, fanouts),
            region: shift(d.region, regions),
            ..d
        }));
        self.vias.extend(other.vias);
        self.fanouts.extend(other.fanouts);
        self.regions.extend(other.regions);
    }

    fn via(&mut self, via: Vec<DeviceId>) -> u32 {
        self.vias.push(via);
        (self.vias.len() - 1) as u32
    }

    fn fanout(&mut self, fanout: Vec<Forward>) -> u32 {
        self.fanouts.push(fanout);
        (self.fanouts.len() - 1) as u32
    }

    fn region(&mut self, region: Region) -> u32 {
        self.regions.push(region);
        (self.regions.len() - 1) as u32
    }

    fn region_of<'a>(&'a self, frags: &'a [Fragment], d: &Draft) -> &'a Region {
        match d.region {
            NONE => &frags[d.frag as usize].region,
            r => &self.regions[r as usize],
        }
    }

    /// The copy a draft names.
    fn copy(&self, frags: &[Fragment], d: &Draft) -> BoxCopy {
        let f = &frags[d.frag as usize];
        BoxCopy {
            fanout: match d.fanout {
                NONE => Vec::new(),
                i => self.fanouts[i as usize].clone(),
            },
            ..f.copy(
                d.src,
                match d.via {
                    NONE => Vec::new(),
                    i => self.vias[i as usize].clone(),
                },
                self.region_of(frags, d).clone(),
            )
        }
    }

    /// The copies, in the order they were drafted.
    #[cfg(test)]
    pub(super) fn built(&self, frags: &[Fragment]) -> Vec<BoxCopy> {
        self.list.iter().map(|d| self.copy(frags, d)).collect()
    }

    /// The plan: the drafts in issue order ([`crate::issue::finish`]'s
    /// order), each written out once, in its place.
    pub(super) fn finish(self, planner: &str, problem: &Problem, frags: &[Fragment]) -> Plan {
        let tensors = problem.tensors();
        let mut bytes: Vec<u64> = Vec::with_capacity(self.list.len());
        let (ids, keys) = crate::issue::stream_ids_of(
            self.list.len(),
            self.list.iter().map(|d| {
                let f = &frags[d.frag as usize];
                bytes.push(self.region_of(frags, d).volume() * tensors[f.tensor as usize].dtype.size());
                let key = (d.via != NONE || d.fanout != NONE).then(|| {
                    let via = if d.via == NONE {
                        &[][..]
                    } else {
                        &self.vias[d.via as usize][..]
                    };
                    let fanout = if d.fanout == NONE {
                        &[][..]
                    } else {
                        &self.fanouts[d.fanout as usize][..]
                    };
                    StreamKey::of(d.src, via, f.dst, fanout.iter().map(|f| f.dst))
                });
                (d.src, f.dst, key)
            }),
        );
        let order = crate::issue::round_robin(&ids, keys.len(), &bytes);
        drop(bytes);
        let copies: Vec<BoxCopy> = order
            .par_iter()
            .map(|&i| self.copy(frags, &self.list[i as usize]))
            .collect();
        let ids: Vec<u32> = order.iter().map(|&i| ids[i as usize]).collect();
        drop(order);
        drop(self);
        crate::issue::assemble(planner, problem, copies, &ids, keys)
    }
}

#[cfg(test)]
mod tiny_tests {
    use super::deal_tiny;

    #[test]
    fn tiny_fragments_follow_each_paths_share_of_the_bytes() {
        // A quarter and three quarters of the bytes: one and three of four
        // tiny fragments, the bytes dealt taken off the quotas.
        let mut quotas = vec![("a", 1000u64), ("b", 3000)];
        let dealt = deal_tiny(&mut quotas, &[(7, 4), (8, 4), (9, 4), (10, 4)], None);
        let to_a = dealt.iter().filter(|&&(_, q)| q == 0).count();
        assert_eq!(to_a, 1, "{dealt:?}");
        assert_eq!(quotas[0].1 + quotas[1].1, 4000 - 16);
        // Deterministic, ties to the earlier path.
        let mut even = vec![("a", 10u64), ("b", 10)];
        assert_eq!(deal_tiny(&mut even, &[(0, 1), (1, 1)], None), [(0, 0), (1, 1)]);
    }
}
