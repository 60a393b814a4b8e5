//! Issue order: the order in which each device posts its copies.
//!
//! A device posts messages one at a time (each costs the message latency),
//! and a stream to a peer cannot start before its first message is posted.
//! Listing copies by destination makes a device post all its small messages
//! to early destinations before its first byte to a late one. This pass
//! interleaves: round-robin over each device's streams (source, relay,
//! destination), largest message first within a stream, so every stream
//! starts within a few latencies and the big transfers start first.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use smallvec::SmallVec;
use tenplan_ptc::{BoxCopy, Cluster, DeviceId, Pace, Plan, StreamKey, TensorSpec};

use crate::cost::{capacity, copy_bytes, stream_resources, Loads, Resource};

/// A plan from an optimal planner's copies: issue order, padding fills, and
/// per-stream paces so that it reaches its makespan.
pub fn finish(planner: &str, problem: &tenplan_ptc::Problem, copies: Vec<BoxCopy>) -> Plan {
    let (copies, ids, keys) = ordered(copies, problem.tensors());
    assemble(planner, problem, copies, &ids, keys)
}

/// A plan from copies already in issue order, each copy's stream and the
/// streams' keys (see [`stream_ids`]): padding fills and paces added.
pub(crate) fn assemble(
    planner: &str,
    problem: &tenplan_ptc::Problem,
    copies: Vec<BoxCopy>,
    ids: &[u32],
    keys: Vec<StreamKey>,
) -> Plan {
    let mut plan = Plan {
        planner: planner.to_string(),
        problem: problem.clone(),
        copies,
        fills: crate::intersect::padding_fills(problem),
        paces: Vec::new(),
    };
    plan.paces = paces_of(&plan, ids, keys);
    plan
}

/// Each copy's stream, numbered in order of first appearance, and the
/// streams' keys by number. Direct copies (no relay, no fanout: nearly all
/// of a large plan's millions) are keyed by their two devices alone, with
/// no key built per copy.
pub(crate) fn stream_ids<'a>(copies: impl ExactSizeIterator<Item = &'a BoxCopy>) -> (Vec<u32>, Vec<StreamKey>) {
    let n = copies.len();
    stream_ids_of(
        n,
        copies.map(|c| {
            let plain = c.via.is_empty() && c.fanout.is_empty();
            (c.src, c.dst, (!plain).then(|| c.stream()))
        }),
    )
}

/// [`stream_ids`] of `n` copies given as (source, destination, stream key
/// where the copy is relayed or forwarded).
pub(crate) fn stream_ids_of(
    n: usize,
    copies: impl Iterator<Item = (DeviceId, DeviceId, Option<StreamKey>)>,
) -> (Vec<u32>, Vec<StreamKey>) {
    let mut direct: FxHashMap<(DeviceId, DeviceId), u32> = FxHashMap::default();
    let mut other: FxHashMap<StreamKey, u32> = FxHashMap::default();
    let mut keys: Vec<StreamKey> = Vec::new();
    let mut ids = Vec::with_capacity(n);
    // The last direct stream: runs of copies share one (a commodity's
    // fragments from one holder), which need no hash lookup each.
    let mut last: Option<((DeviceId, DeviceId), u32)> = None;
    for (src, dst, key) in copies {
        // A relay equal to an end collapses to a direct stream.
        let is_direct = key.as_ref().is_none_or(|k| k.via.is_empty() && k.fanout.is_empty());
        let next = keys.len() as u32;
        let id = if is_direct {
            match last {
                Some((ends, id)) if ends == (src, dst) => id,
                _ => {
                    let id = *direct.entry((src, dst)).or_insert_with(|| {
                        keys.push(key.clone().unwrap_or_else(|| StreamKey::of(src, &[], dst, [])));
                        next
                    });
                    last = Some(((src, dst), id));
                    id
                }
            }
        } else {
            let key = key.expect("not direct");
            match other.get(&key) {
                Some(&id) => id,
                None => {
                    other.insert(key.clone(), next);
                    keys.push(key);
                    next
                }
            }
        };
        ids.push(id);
    }
    (ids, keys)
}

/// Reorder copies for issuing (the set of copies is unchanged).
pub fn issue_order(copies: Vec<BoxCopy>, tensors: &[TensorSpec]) -> Vec<BoxCopy> {
    ordered(copies, tensors).0
}

/// [`issue_order`], with each reordered copy's stream (see [`stream_ids`])
/// and the streams' keys, for the paces.
fn ordered(copies: Vec<BoxCopy>, tensors: &[TensorSpec]) -> (Vec<BoxCopy>, Vec<u32>, Vec<StreamKey>) {
    let (ids, keys) = stream_ids(copies.iter());
    let bytes: Vec<u64> = copies
        .iter()
        .map(|c| c.region.volume() * tensors[c.tensor as usize].dtype.size())
        .collect();
    let order = round_robin(&ids, keys.len(), &bytes);
    let ids = order.iter().map(|&i| ids[i as usize]).collect();
    // Permute in place, cycle by cycle: each copy moves once, and no second
    // array of millions of copies is allocated.
    let mut copies = copies;
    let mut place = vec![0u32; order.len()];
    for (to, &from) in order.iter().enumerate() {
        place[from as usize] = to as u32;
    }
    for i in 0..copies.len() {
        while place[i] as usize != i {
            let j = place[i] as usize;
            copies.swap(i, j);
            place.swap(i, j);
        }
    }
    (copies, ids, keys)
}

/// The issue order of copies given each one's stream (of `streams`) and
/// size: which copy goes `k`-th. Round-robin over the streams in order of
/// first appearance, largest copy first within a stream (equal sizes keep
/// their order).
pub(crate) fn round_robin(ids: &[u32], streams: usize, bytes: &[u64]) -> Vec<u32> {
    // Each stream's copies (indices, in plan order), largest first; the
    // sort is stable, so equal sizes keep plan order.
    let mut start = vec![0usize; streams + 1];
    for &id in ids {
        start[id as usize + 1] += 1;
    }
    for i in 0..streams {
        start[i + 1] += start[i];
    }
    let mut fill = start.clone();
    let mut by_stream = vec![0u32; ids.len()];
    for (i, &id) in ids.iter().enumerate() {
        by_stream[fill[id as usize]] = i as u32;
        fill[id as usize] += 1;
    }
    for s in 0..streams {
        by_stream[start[s]..start[s + 1]].sort_by_key(|&i| std::cmp::Reverse(bytes[i as usize]));
    }
    // Round-robin: each round takes the next copy of every stream with
    // copies left, in stream order, visiting only those (one long stream
    // among tens of thousands must not make every round visit them all).
    let mut order = Vec::with_capacity(ids.len());
    let mut active: Vec<usize> = (0..streams).collect();
    let mut round = 0;
    while !active.is_empty() {
        active.retain(|&s| {
            let at = start[s] + round;
            if at < start[s + 1] {
                order.push(by_stream[at]);
                true
            } else {
                false
            }
        });
        round += 1;
    }
    debug_assert_eq!(order.len(), ids.len());
    order
}

/// Pace every stream so that all of them end together at the plan's
/// bandwidth makespan `T` (its busiest resource's load over capacity): a
/// stream of `b` bytes that can start at `t0` (its first message's issue
/// time, from the plan's order and the message latency) is sent at
/// `b / (T − t0)`. Every resource then carries about its capacity, so the
/// schedule reaches `T` (plus the last message latencies) instead of whatever
/// fair sharing makes of it: the fluid form of the preemptive open-shop
/// schedule of Gonzalez and Sahni (1976). Where head starts make the paces
/// on a resource add up to more than its capacity, its streams are slowed
/// by that ratio (see `fit_paces`), so no resource is oversubscribed.
pub fn paces(plan: &Plan) -> Vec<Pace> {
    let (ids, keys) = stream_ids(plan.copies.iter());
    paces_of(plan, &ids, keys)
}

/// [`paces`] given each copy's stream and the streams' keys.
fn paces_of(plan: &Plan, ids: &[u32], keys: Vec<StreamKey>) -> Vec<Pace> {
    let cluster = plan.problem.cluster();
    let (t, _) = Loads::of(plan).max_time(cluster);
    if !(t > 0.0 && t.is_finite()) {
        return Vec::new();
    }
    let latency = cluster.latency_s();
    // Each device's issue clock advances in plan order; per stream, its
    // bytes and the issue time of its first message.
    let mut issued = vec![0.0; cluster.num_devices() as usize];
    let mut streams: Vec<(u64, f64)> = vec![(0, f64::NAN); keys.len()];
    for (c, &id) in plan.copies.iter().zip(ids) {
        let at = &mut issued[c.src as usize];
        *at += latency;
        let e = &mut streams[id as usize];
        if e.1.is_nan() {
            e.1 = *at;
        }
        e.0 += copy_bytes(plan, c);
    }
    // A head start longer than half the makespan is not worth compressing
    // the stream for.
    let mut rates: Vec<f64> = streams
        .iter()
        .map(|&(bytes, t0)| bytes as f64 / (t - t0).max(t / 2.0))
        .collect();
    fit_paces(cluster, &keys, &mut rates);
    let mut streams: Vec<(StreamKey, f64)> = keys.into_iter().zip(rates).collect();
    streams.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    streams
        .into_iter()
        .map(|(key, bytes_per_s)| Pace {
            src: key.src,
            via: key.via,
            dst: key.dst,
            fanout: key.fanout,
            bytes_per_s,
        })
        .collect()
}

/// Slow each stream down by the most its resources are oversubscribed by
/// the paces of the streams that cross them, so that no resource is.
///
/// A head start raises a stream's pace, so the paces of a resource's
/// streams can add up to a little more than its capacity (all of them are
/// running once the last has started). Fair sharing then gives the whole
/// deficit to the largest streams, which end late: DeepSeek-V3 synced to
/// one engine of 128 expert-parallel ranks had paces 0.16% over capacity on
/// 135 NICs and ended 7.4% after its bound, and 1% over, 31%. Scaled down
/// instead, every stream keeps its pace and ends at most that fraction late.
fn fit_paces(cluster: &Cluster, keys: &[StreamKey], rates: &mut [f64]) {
    let mut index: FxHashMap<Resource, usize> = FxHashMap::default();
    let mut load: Vec<f64> = Vec::new();
    let mut caps: Vec<f64> = Vec::new();
    let routes: Vec<SmallVec<[usize; 4]>> = keys
        .iter()
        .zip(rates.iter())
        .map(|(key, &rate)| {
            let mut route: SmallVec<[usize; 4]> = SmallVec::new();
            for r in stream_resources(cluster, key) {
                let i = *index.entry(r).or_insert_with(|| {
                    load.push(0.0);
                    caps.push(capacity(cluster, r));
                    load.len() - 1
                });
                route.push(i);
                load[i] += rate;
            }
            route
        })
        .collect();
    for (rate, route) in rates.iter_mut().zip(&routes) {
        let over = route.iter().map(|&i| load[i] / caps[i]).fold(1.0, f64::max);
        *rate /= over;
    }
}

/// Why a plan cannot be staged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StagingError {
    /// One element of a tensor is larger than the budget.
    #[error("staging budget of {budget} bytes is smaller than one element of `{tensor}` ({elem} bytes)")]
    BudgetBelowElement {
        /// The budget.
        budget: u64,
        /// Tensor name.
        tensor: String,
        /// Its element size.
        elem: u64,
    },
}

/// Split a plan into staging rounds so that, within a round, no device
/// receives (as destination, relay or forwarded-to device) more than `budget` bytes from other
/// devices: the receive buffers in flight. Copies larger than the budget are
/// cut into flat ranges of their box; each copy goes to the first round with
/// room on every device it stages on (first fit, in issue order). Local
/// copies (see [`BoxCopy::is_local`]: a copy relayed back to its source is
/// not one) need no staging and stay in round 0. Paces are dropped: streams
/// share links fairly within a round.
pub fn stage(plan: &Plan, budget: u64) -> Result<Plan, StagingError> {
    let tensors = plan.problem.tensors();
    let mut pieces: Vec<BoxCopy> = Vec::with_capacity(plan.copies.len());
    for c in &plan.copies {
        let spec = &tensors[c.tensor as usize];
        let elem = spec.dtype.size();
        let bytes = c.region.volume() * elem;
        if c.is_local() || bytes <= budget {
            pieces.push(c.clone());
            continue;
        }
        if elem > budget {
            return Err(StagingError::BudgetBelowElement {
                budget,
                tensor: spec.name.clone(),
                elem,
            });
        }
        let per = budget / elem;
        let n = c.region.volume();
        let mut at = 0;
        while at < n {
            let end = (at + per).min(n);
            for region in c.region.flat_range(at, end) {
                pieces.push(BoxCopy { region, ..c.clone() });
            }
            at = end;
        }
    }
    // usage[round][device]: bytes staged.
    let mut usage: Vec<BTreeMap<DeviceId, u64>> = Vec::new();
    for c in &mut pieces {
        if c.is_local() {
            c.round = 0;
            continue;
        }
        let bytes = c.region.volume() * tensors[c.tensor as usize].dtype.size();
        let staged = staged_on(c);
        let fits =
            |u: &BTreeMap<DeviceId, u64>| staged.iter().all(|d| u.get(d).copied().unwrap_or(0) + bytes <= budget);
        let r = match usage.iter().position(fits) {
            Some(r) => r,
            None => {
                usage.push(BTreeMap::new());
                usage.len() - 1
            }
        };
        for &d in &staged {
            *usage[r].entry(d).or_default() += bytes;
        }
        c.round = r as u32;
    }
    // Rounds in order; within a round, the issue order.
    pieces.sort_by_key(|c| c.round);
    Ok(Plan {
        planner: plan.planner.clone(),
        problem: plan.problem.clone(),
        copies: pieces,
        fills: plan.fills.clone(),
        paces: Vec::new(),
    })
}

/// Bytes each device stages (receives from others, as destination or relay)
/// in each round.
pub fn staged_bytes(plan: &Plan) -> BTreeMap<(u32, DeviceId), u64> {
    let tensors = plan.problem.tensors();
    let mut out = BTreeMap::new();
    for c in plan.copies.iter().filter(|c| !c.is_local()) {
        let bytes = c.region.volume() * tensors[c.tensor as usize].dtype.size();
        for d in staged_on(c) {
            *out.entry((c.round, d)).or_default() += bytes;
        }
    }
    out
}

/// The devices a remote copy stages its box on: relays, destination, and
/// the devices it forwards to.
fn staged_on(c: &BoxCopy) -> Vec<DeviceId> {
    let mut on = c.route()[1..].to_vec();
    on.extend(c.forwarded().map(|f| f.dst));
    on
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tenplan_models::find;
    use tenplan_ptc::{Cluster, DType};

    use crate::cost::{capacity, stream_resources, Loads};
    use crate::Planner;

    /// LLaMA-3 70B from 64 training GPUs to 4 engines of tp=16: streams
    /// that start later get higher paces, and left alone those add up to
    /// more than some NICs carry (the plan then ended 0.8% after its load,
    /// fair sharing slowing the largest streams).
    #[test]
    fn paces_never_oversubscribe_a_resource() {
        // The weight sync's problem, as the application poses it.
        let state = tenplan_models::ModelState::new(
            find("llama3-70b").unwrap(),
            tenplan_models::StateKind::Weights(DType::BF16),
        );
        let problem = tenplan_ptc::Problem::new(
            state.layout(&"tp=8,pp=4,dp=2".parse().unwrap()).unwrap(),
            state
                .serving_layout(&"tp=16,dp=4,devices=64-127".parse().unwrap())
                .unwrap(),
            Cluster::open("dgx-h100-rail:16").unwrap(),
        )
        .unwrap()
        .with_forwarding(tenplan_ptc::Forwarding::Cluster);
        let plan = crate::LpPlanner::builder()
            .portfolio(false)
            .build()
            .plan(&problem)
            .unwrap();
        let cluster = problem.cluster();
        assert!(!plan.paces.is_empty());
        let mut load: BTreeMap<_, f64> = BTreeMap::new();
        for p in &plan.paces {
            for r in stream_resources(cluster, &p.stream()) {
                *load.entry(r).or_default() += p.bytes_per_s;
            }
        }
        for (&r, &paced) in &load {
            assert!(
                paced <= capacity(cluster, r) * (1.0 + 1e-9),
                "{r:?}: paces {paced} over {}",
                capacity(cluster, r)
            );
        }
        let bandwidth = Loads::of(&plan).max_time(cluster).0;
        let makespan = crate::simulate(&plan).makespan_s;
        assert!(
            makespan <= bandwidth * 1.005,
            "{makespan} s against a load of {bandwidth} s"
        );
    }
}
