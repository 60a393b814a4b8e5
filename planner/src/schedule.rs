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

use tenplan_ptc::{Copy, DeviceId, Pace, Plan, TensorSpec};

use crate::cost::{copy_bytes, Loads};

/// Reorder copies for issuing (the set of copies is unchanged).
pub fn issue_order(copies: Vec<Copy>, tensors: &[TensorSpec]) -> Vec<Copy> {
    let bytes = |c: &Copy| c.region.volume() * tensors[c.tensor as usize].dtype.size();
    // Streams in order of first appearance.
    let mut index: BTreeMap<(DeviceId, Vec<DeviceId>, DeviceId), usize> = BTreeMap::new();
    let mut streams: Vec<Vec<Copy>> = Vec::new();
    for c in copies {
        let i = *index.entry(c.stream()).or_insert_with(|| {
            streams.push(Vec::new());
            streams.len() - 1
        });
        streams[i].push(c);
    }
    for s in &mut streams {
        // Stable: equal sizes keep plan order.
        s.sort_by_key(|c| std::cmp::Reverse(bytes(c)));
    }
    let total: usize = streams.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(total);
    let mut iters: Vec<std::vec::IntoIter<Copy>> = streams.into_iter().map(Vec::into_iter).collect();
    while out.len() < total {
        for it in &mut iters {
            if let Some(c) = it.next() {
                out.push(c);
            }
        }
    }
    out
}

/// Pace every stream so that all of them end together at the plan's
/// bandwidth makespan `T` (its busiest resource's load over capacity): a
/// stream of `b` bytes that can start at `t0` (its first message's issue
/// time, from the plan's order and the message latency) is sent at
/// `b / (T − t0)`. Every resource then carries about its capacity, so the
/// schedule reaches `T` (plus the last message latencies) instead of whatever
/// fair sharing makes of it: the fluid form of the preemptive open-shop
/// schedule of Gonzalez and Sahni (1976). Where the head start makes paces
/// oversubscribe a link, the simulator falls back to fair shares.
pub fn paces(plan: &Plan) -> Vec<Pace> {
    let cluster = plan.problem.cluster();
    let (t, _) = Loads::of(plan).max_time(cluster);
    if !(t > 0.0 && t.is_finite()) {
        return Vec::new();
    }
    let latency = cluster.latency_s();
    let mut issued: BTreeMap<DeviceId, f64> = BTreeMap::new();
    // Per stream: bytes and the issue time of its first message.
    let mut streams: BTreeMap<(DeviceId, Vec<DeviceId>, DeviceId), (u64, f64)> = BTreeMap::new();
    for c in &plan.copies {
        let at = issued.entry(c.src).or_insert(0.0);
        *at += latency;
        let e = streams.entry(c.stream()).or_insert((0, *at));
        e.0 += copy_bytes(plan, c);
    }
    streams
        .into_iter()
        .map(|((src, via, dst), (bytes, t0))| Pace {
            src,
            via,
            dst,
            // A head start longer than half the makespan is not worth
            // compressing the stream for.
            bytes_per_s: bytes as f64 / (t - t0).max(t / 2.0),
        })
        .collect()
}
