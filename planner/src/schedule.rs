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

use tenplan_ptc::{Copy, DeviceId, TensorSpec};

/// Reorder copies for issuing (the set of copies is unchanged).
pub fn issue_order(copies: Vec<Copy>, tensors: &[TensorSpec]) -> Vec<Copy> {
    let bytes = |c: &Copy| c.region.volume() * tensors[c.tensor as usize].dtype.size();
    // Streams in order of first appearance.
    let mut index: BTreeMap<(DeviceId, Option<DeviceId>, DeviceId), usize> = BTreeMap::new();
    let mut streams: Vec<Vec<Copy>> = Vec::new();
    for c in copies {
        let i = *index.entry((c.src, c.via, c.dst)).or_insert_with(|| {
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
