//! Step 1: fragments with the same destination and live holders become one
//! commodity; boxes that several devices of one node need become multicasts.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use tenplan_ptc::{Cluster, DeviceId, Region, TensorId};

use crate::intersect::{Fragment, HolderNodes};

/// Fragments that share a destination and a set of live holders.
#[derive(Clone, Debug)]
pub struct Commodity {
    /// Destination device.
    pub dst: DeviceId,
    /// Live holders, in holder order.
    pub holders: Arc<[DeviceId]>,
    /// Total bytes.
    pub bytes: u64,
    /// Indices of its fragments.
    pub fragments: Vec<usize>,
}

/// Group fragments into commodities, in order of first appearance.
pub fn commodities(frags: &[Fragment]) -> Vec<Commodity> {
    let mut index: BTreeMap<(DeviceId, &[DeviceId]), usize> = BTreeMap::new();
    // Fragments share holder lists: look a list up by address first, and
    // compare contents (hundreds of devices) once per (destination, list).
    let mut by_address: HashMap<(DeviceId, *const DeviceId), usize> = HashMap::new();
    let mut out: Vec<Commodity> = Vec::new();
    for (i, f) in frags.iter().enumerate() {
        let c = *by_address.entry((f.dst, f.holders.as_ptr())).or_insert_with(|| {
            *index.entry((f.dst, &f.holders)).or_insert_with(|| {
                out.push(Commodity {
                    dst: f.dst,
                    holders: f.holders.clone(),
                    bytes: 0,
                    fragments: Vec::new(),
                });
                out.len() - 1
            })
        });
        out[c].bytes += f.bytes;
        out[c].fragments.push(i);
    }
    out
}

/// Boxes that several devices of one node need, with the same live holders,
/// none of them on that node: one copy may carry them into the node for all
/// of its members (see [`tenplan_ptc::BoxCopy::fanout`]).
#[derive(Clone, Debug)]
pub struct Multicast {
    /// Destination devices, ascending (all on one node).
    pub members: Vec<DeviceId>,
    /// Live holders, in holder order.
    pub holders: Vec<DeviceId>,
    /// Bytes each member needs.
    pub bytes: u64,
    /// Per box: the fragment of each member (aligned with `members`).
    pub groups: Vec<Vec<usize>>,
    /// The commodity of each member.
    pub commodities: Vec<usize>,
}

impl Multicast {
    /// The (holder, leader) pairs that may send it, holder-major.
    pub fn options(&self) -> impl Iterator<Item = (DeviceId, usize)> + '_ {
        self.holders
            .iter()
            .flat_map(move |&s| (0..self.members.len()).map(move |k| (s, k)))
    }
}

/// Find the multicast opportunities among fragments: identical boxes (same
/// tensor, region, holders and addend) needed by two or more devices of a
/// node that no holder sits on, aggregated by (members, holders).
pub fn multicasts(cluster: &Cluster, frags: &[Fragment], comms: &[Commodity]) -> Vec<Multicast> {
    let mut comm_of = vec![0; frags.len()];
    for (ci, c) in comms.iter().enumerate() {
        for &f in &c.fragments {
            comm_of[f] = ci;
        }
    }
    // Fragments share holder lists (`fragments` interns them): name each
    // list by the address of its first copy with that content. Candidates
    // are sorted by a hash of their key, so that equal keys sit in runs,
    // then split by the exact key within a run (a hash map of millions of
    // one-fragment groups cost seconds at 16k GPUs), and the groups of two
    // or more are listed in the order of their full keys.
    let mut first_with: BTreeMap<&[DeviceId], *const DeviceId> = BTreeMap::new();
    let mut canonical: HashMap<*const DeviceId, *const DeviceId> = HashMap::new();
    let mut nodes_of = HolderNodes::new(cluster);
    let mut keyed: Vec<(u64, usize, *const DeviceId)> = Vec::new();
    for (i, f) in frags.iter().enumerate() {
        let n = cluster.node_of(f.dst);
        if nodes_of.of(&f.holders).binary_search(&n).is_err() {
            let list = *canonical
                .entry(f.holders.as_ptr())
                .or_insert_with(|| *first_with.entry(&f.holders).or_insert(f.holders.as_ptr()));
            let mut h = std::hash::DefaultHasher::new();
            (n, f.tensor, &f.region, list).hash(&mut h);
            keyed.push((h.finish(), i, list));
        }
    }
    keyed.sort_unstable_by_key(|&(h, i, _)| (h, i));
    type Key<'a> = (u32, TensorId, &'a Region, &'a [DeviceId]);
    let key = |i: usize| -> Key<'_> {
        let f = &frags[i];
        (cluster.node_of(f.dst), f.tensor, &f.region, &f.holders[..])
    };
    let mut same: Vec<(Key<'_>, *const DeviceId, Vec<usize>)> = Vec::new();
    for run in keyed.chunk_by(|a, b| a.0 == b.0).filter(|run| run.len() >= 2) {
        // Hash collisions aside, a run is one group.
        let mut groups: Vec<(Key<'_>, *const DeviceId, Vec<usize>)> = Vec::new();
        for &(_, i, list) in run {
            let k = key(i);
            // Equal lists share their canonical address: compare that, not
            // thousands of devices per fragment.
            let same_key =
                |g: &(Key<'_>, *const DeviceId, Vec<usize>)| g.1 == list && (g.0 .0, g.0 .1, g.0 .2) == (k.0, k.1, k.2);
            match groups.iter_mut().find(|g| same_key(g)) {
                Some(g) => g.2.push(i),
                None => groups.push((k, list, vec![i])),
            }
        }
        same.extend(groups.into_iter().filter(|g| g.2.len() >= 2));
    }
    same.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut out: Vec<Multicast> = Vec::new();
    // By holder list address: comparing lists of thousands of devices per
    // group dominated at 16k GPUs. Creation order follows `same`'s.
    let mut index: HashMap<(Vec<DeviceId>, *const DeviceId), usize> = HashMap::new();
    for ((_, _, _, holders), list, mut group) in same {
        // One fragment per device: a device needing a box twice gets its
        // second one by unicast.
        group.sort_by_key(|&i| (frags[i].dst, i));
        group.dedup_by_key(|i| frags[*i].dst);
        if group.len() < 2 {
            continue;
        }
        let members: Vec<DeviceId> = group.iter().map(|&i| frags[i].dst).collect();
        let m = *index.entry((members.clone(), list)).or_insert_with(|| {
            out.push(Multicast {
                commodities: group.iter().map(|&i| comm_of[i]).collect(),
                members,
                holders: holders.to_vec(),
                bytes: 0,
                groups: Vec::new(),
            });
            out.len() - 1
        });
        out[m].bytes += frags[group[0]].bytes;
        out[m].groups.push(group);
    }
    out
}

/// How much makespan the LP may give up by leaving out multicasts whose
/// savings are too small to matter, as a fraction of the busiest node's
/// ingress time.
pub(super) const MULTICAST_SLACK: f64 = 5e-4;

/// Leave out the multicasts that cannot change the makespan by more than
/// [`MULTICAST_SLACK`]: each costs one LP column per (holder, leader), and
/// replicated small tensors (layer norms on every tensor-parallel rank)
/// make hundreds of them that save microseconds. A multicast left out adds
/// at most its saving (bytes · (members − 1) over the node's NIC capacity)
/// to its node's ingress, and about that much, spread over its holders'
/// nodes, to their egress; the smallest are left out while every node's
/// total stays within the slack. Plans stay exact, and the bound still
/// prices every multicast.
pub(super) fn prune_multicasts(cluster: &Cluster, comms: &[Commodity], mcasts: Vec<Multicast>) -> Vec<Multicast> {
    if mcasts.is_empty() {
        return mcasts;
    }
    let node_cap = f64::from(cluster.nics_per_node()) * cluster.bandwidth().nic;
    let mut into: BTreeMap<u32, u64> = BTreeMap::new();
    for c in comms {
        let n = cluster.node_of(c.dst);
        if c.holders.iter().all(|&h| cluster.node_of(h) != n) {
            *into.entry(n).or_default() += c.bytes;
        }
    }
    let busiest = into.values().copied().max().unwrap_or(0) as f64 / node_cap;
    let budget = MULTICAST_SLACK * busiest;
    let saving = |m: &Multicast| m.bytes as f64 * (m.members.len() - 1) as f64 / node_cap;
    let mut order: Vec<usize> = (0..mcasts.len()).collect();
    order.sort_by(|&a, &b| saving(&mcasts[a]).total_cmp(&saving(&mcasts[b])).then(a.cmp(&b)));
    let mut used: BTreeMap<u32, f64> = BTreeMap::new();
    let mut dropped = vec![false; mcasts.len()];
    for i in order {
        let m = &mcasts[i];
        let s = saving(m);
        let node = cluster.node_of(m.members[0]);
        let mut sources: Vec<u32> = m.holders.iter().map(|&h| cluster.node_of(h)).collect();
        sources.sort_unstable();
        sources.dedup();
        let share = s / sources.len() as f64;
        let fits = |n: u32, add: f64| used.get(&n).copied().unwrap_or(0.0) + add <= budget;
        if !(fits(node, s) && sources.iter().all(|&n| fits(n, share))) {
            continue;
        }
        *used.entry(node).or_default() += s;
        for n in sources {
            *used.entry(n).or_default() += share;
        }
        dropped[i] = true;
    }
    mcasts
        .into_iter()
        .zip(dropped)
        .filter(|(_, d)| !d)
        .map(|(m, _)| m)
        .collect()
}
