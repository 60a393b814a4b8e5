//! The cost model of DESIGN §3: resources with capacities, the load a plan
//! puts on each, and the trivial lower bound on any plan's makespan.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use tenplan_ptc::{BoxCopy, Cluster, DeviceId, FabricLink, Forwarding, Plan, Problem, StreamKey, TensorId};

use crate::intersect::{Fragment, HolderNodes};
use crate::lp::components::root;

/// A shared resource with a capacity in bytes per second.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// A device's intra-node send link.
    Send(DeviceId),
    /// A device's intra-node receive link.
    Recv(DeviceId),
    /// A NIC's egress (global NIC index).
    NicOut(u32),
    /// A NIC's ingress.
    NicIn(u32),
    /// A device's own memory (local copies).
    Memory(DeviceId),
    /// Message issue of a device: one message per latency (its capacity is
    /// messages per second; [`Loads`] counts messages, not bytes, on it).
    Issue(DeviceId),
    /// A fabric switch's link up to its parent switch.
    SwitchUp(u32),
    /// A fabric switch's link down from its parent switch.
    SwitchDown(u32),
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resource::Send(d) => write!(f, "intra-node send of device {d}"),
            Resource::Recv(d) => write!(f, "intra-node receive of device {d}"),
            Resource::NicOut(n) => write!(f, "egress of NIC {n}"),
            Resource::NicIn(n) => write!(f, "ingress of NIC {n}"),
            Resource::Memory(d) => write!(f, "memory of device {d}"),
            Resource::Issue(d) => write!(f, "message issue of device {d}"),
            Resource::SwitchUp(s) => write!(f, "uplink of switch {s}"),
            Resource::SwitchDown(s) => write!(f, "downlink of switch {s}"),
        }
    }
}

/// Capacity of a resource in bytes per second.
pub fn capacity(cluster: &Cluster, r: Resource) -> f64 {
    let b = cluster.bandwidth();
    match r {
        Resource::Send(_) | Resource::Recv(_) => b.intra_node,
        // The checkpoint store's link: every compute node reads at the
        // storage rate at once.
        Resource::NicOut(n) | Resource::NicIn(n) if Some(n) == cluster.storage_nic() => {
            b.storage * f64::from(cluster.compute_nodes())
        }
        Resource::NicOut(_) | Resource::NicIn(_) => b.nic,
        Resource::Memory(_) => b.device_memory,
        Resource::Issue(_) => 1.0 / cluster.latency_s(),
        Resource::SwitchUp(s) => cluster.fabric_capacity(FabricLink::Up(s)),
        Resource::SwitchDown(s) => cluster.fabric_capacity(FabricLink::Down(s)),
    }
}

/// The resources one hop from `src` to `dst` uses.
pub fn hop(cluster: &Cluster, src: DeviceId, dst: DeviceId) -> Vec<Resource> {
    if src == dst {
        vec![Resource::Memory(src)]
    } else if cluster.node_of(src) == cluster.node_of(dst) {
        vec![Resource::Send(src), Resource::Recv(dst)]
    } else {
        let (a, b) = (cluster.nic_of(src), cluster.nic_of(dst));
        let mut route = vec![Resource::NicOut(a)];
        if cluster.has_fabric() {
            let mut links = Vec::new();
            cluster.fabric_path(a, b, &mut links);
            route.extend(links.into_iter().map(switch_resource));
        }
        route.push(Resource::NicIn(b));
        route
    }
}

/// The resource of a switch link.
pub fn switch_resource(link: FabricLink) -> Resource {
    match link {
        FabricLink::Up(s) => Resource::SwitchUp(s),
        FabricLink::Down(s) => Resource::SwitchDown(s),
    }
}

/// The hops of a copy: one, or one more per relay, then one from its
/// destination to each device it forwards to.
pub fn hops(c: &BoxCopy) -> Vec<(DeviceId, DeviceId)> {
    let r = c.route();
    let mut out: Vec<(DeviceId, DeviceId)> = if r.len() == 1 {
        vec![(c.src, c.dst)]
    } else {
        r.windows(2).map(|w| (w[0], w[1])).collect()
    };
    out.extend(c.forwarded().map(|f| (c.dst, f.dst)));
    out
}

/// The resources a stream holds while it runs: every hop's (through its
/// relays to its destination, then on to each device it forwards to, as
/// [`hops`] for a copy), a resource as many times as hops cross it (a
/// destination that forwards to `k` devices sends every byte `k` times over
/// its own links). The simulator shares these among streams, and paces are
/// fitted to them.
pub(crate) fn stream_resources(cluster: &Cluster, key: &StreamKey) -> SmallVec<[Resource; 4]> {
    let path = std::iter::once(key.src)
        .chain(key.via.iter().copied())
        .chain(std::iter::once(key.dst));
    let mut out: SmallVec<[Resource; 4]> = SmallVec::new();
    let hops = path
        .clone()
        .zip(path.skip(1))
        .chain(key.fanout.iter().map(|&f| (key.dst, f)));
    for (a, b) in hops {
        out.extend(hop(cluster, a, b));
    }
    out
}

/// Bytes of one copy.
pub fn copy_bytes(plan: &Plan, c: &BoxCopy) -> u64 {
    c.region.volume() * plan.problem.tensors()[c.tensor as usize].dtype.size()
}

/// The load of a plan on every resource it uses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Loads {
    /// Bytes crossing each resource; messages issued, for [`Resource::Issue`].
    pub bytes: BTreeMap<Resource, u64>,
    /// Bytes crossing a node boundary (a relayed copy counts each crossing).
    pub cross_node: u64,
    /// Bytes moved between devices (local copies excluded; a relayed copy
    /// counts once, a multicast once per destination).
    pub moved: u64,
    /// Bytes copied within a device.
    pub local: u64,
}

impl Loads {
    /// Every resource's load.
    pub fn of(plan: &Plan) -> Loads {
        let cluster = plan.problem.cluster();
        let mut l = Loads::default();
        // Bytes per hop (sender, receiver) and messages per issuing device
        // first, then each distinct hop's resources once: millions of copies
        // share a few thousand hops, whose routes (a fabric walk) and map
        // entries would otherwise be paid per copy. Sums of integers: the
        // result is the same in any order.
        let mut per_hop: FxHashMap<(DeviceId, DeviceId), u64> = FxHashMap::default();
        let mut issued: FxHashMap<DeviceId, u64> = FxHashMap::default();
        for c in &plan.copies {
            let b = copy_bytes(plan, c);
            *issued.entry(c.src).or_default() += 1;
            let forwards = c.forwarded().count() as u64;
            if forwards > 0 {
                // The destination forwards one message per device.
                *issued.entry(c.dst).or_default() += forwards;
            }
            if c.src == c.dst {
                l.local += b;
            } else {
                l.moved += b * (1 + c.fanout.len() as u64);
            }
            if c.via.is_empty() && c.fanout.is_empty() {
                *per_hop.entry((c.src, c.dst)).or_default() += b;
            } else {
                for h in hops(c) {
                    *per_hop.entry(h).or_default() += b;
                }
            }
        }
        for ((s, d), b) in per_hop {
            if cluster.node_of(s) != cluster.node_of(d) {
                l.cross_node += b;
            }
            for r in hop(cluster, s, d) {
                *l.bytes.entry(r).or_default() += b;
            }
        }
        for (d, n) in issued {
            *l.bytes.entry(Resource::Issue(d)).or_default() += n;
        }
        l
    }

    /// The most loaded resource, as time at full capacity: the plan's
    /// makespan under the one-port model without latency, which a perfect
    /// schedule reaches.
    pub fn max_time(&self, cluster: &Cluster) -> (f64, Option<Resource>) {
        self.bytes
            .iter()
            .map(|(&r, &b)| (b as f64 / capacity(cluster, r), Some(r)))
            .fold((0.0, None), |a, b| if b.0 > a.0 { b } else { a })
    }
}

/// A lower bound on the makespan of every plan for a problem, with the
/// constraint that gives it.
#[derive(Clone, Debug, PartialEq)]
pub struct LowerBound {
    /// Seconds.
    pub seconds: f64,
    /// What forces it.
    pub reason: String,
}

/// The trivial bound: bytes that must cross a cut of the cluster, divided by
/// the cut's capacity, maximised over these cuts:
/// - into a device: everything it needs and does not hold, over its
///   intra-node and NIC ingress; and everything it needs at all, over those
///   plus its local copy rate (every target element is written by a copy);
/// - into a node: everything its devices need that no live device of the
///   node holds, over the node's NIC ingress;
/// - out of a node: everything other nodes need whose live holders all sit
///   on this node, over its NIC egress;
/// - out of a device: everything other devices need whose only live holder
///   it is, over its intra-node and NIC egress.
///
/// A multicast copy carries one box into a node for several of its devices,
/// so the node cuts count the elements a node needs once, however many of
/// its devices need them (the addends of a partial tensor are distinct
/// data). A device still receives its own bytes.
pub fn trivial_lower_bound(problem: &Problem, fragments: &[Fragment]) -> LowerBound {
    trivial_given_cut(problem, fragments, cut_lower_bound(problem, fragments))
}

/// [`trivial_lower_bound`] given the cut bound ([`cut_lower_bound`]) of the
/// same fragments, for a caller that needs the cuts again.
pub(crate) fn trivial_given_cut(problem: &Problem, fragments: &[Fragment], cut: LowerBound) -> LowerBound {
    trivial_weighted(problem, fragments, cut, &|_| 1)
}

/// [`trivial_lower_bound`] of a problem whose every piece of tensor `t`
/// stands for `weight(t)` pieces of the problem it reduces (a stack of
/// `weight(t)` interchangeable tensors, [`crate::symmetry::Reduced`]): the
/// cuts are the reduced problem's (the same bytes), the message bound
/// counts the pieces it stands for, so the bound is the whole problem's.
pub fn trivial_lower_bound_weighted(
    problem: &Problem,
    fragments: &[Fragment],
    weight: &dyn Fn(TensorId) -> u64,
) -> LowerBound {
    trivial_weighted(problem, fragments, cut_lower_bound(problem, fragments), weight)
}

fn trivial_weighted(
    problem: &Problem,
    fragments: &[Fragment],
    cut: LowerBound,
    weight: &dyn Fn(TensorId) -> u64,
) -> LowerBound {
    // The message bound costs seconds at thousands of GPUs (sender sets of
    // thousands of devices) and is far below the cuts there; where its
    // ceiling says it cannot exceed them, it would not be chosen.
    if issue_ceiling(problem, fragments, weight).is_some_and(|c| c < cut.seconds) {
        return cut;
    }
    let issue = issue_weighted(problem, fragments, weight);
    if issue.seconds > cut.seconds {
        issue
    } else {
        cut
    }
}

/// No more than [`issue_lower_bound`] can prove, in seconds, from one pass
/// over the fragments (`None` where a fragment has no holder).
///
/// Spreading each target piece evenly over the holders of one of its
/// fragments is a way to send every piece, and a set `H` of devices sends
/// all the pieces whose senders lie within it: so no `H` owes more than
/// `|H|` times the busiest device's share (weak duality). Counting each
/// fragment as a piece of its own only adds to the shares.
fn issue_ceiling(problem: &Problem, fragments: &[Fragment], weight: &dyn Fn(TensorId) -> u64) -> Option<f64> {
    let mut per_list: HashMap<*const DeviceId, (&[DeviceId], u64)> = HashMap::new();
    for f in fragments {
        if f.holders.is_empty() {
            return None;
        }
        per_list.entry(f.holders.as_ptr()).or_insert((&f.holders, 0)).1 += weight(f.tensor);
    }
    // The order of the sums may vary from run to run; the bound chosen does
    // not, since the ceiling only ever skips a bound that would not be.
    let mut share = vec![0.0f64; problem.cluster().num_devices() as usize];
    for (list, n) in per_list.into_values() {
        let each = n as f64 / list.len() as f64;
        for &d in list {
            share[d as usize] += each;
        }
    }
    let busiest = share.into_iter().fold(0.0, f64::max);
    // The bound rounds a share up to whole messages; the margin covers the
    // sums' rounding.
    Some((busiest * (1.0 + 1e-9)).ceil() * problem.cluster().latency_s())
}

/// The cut bounds of [`trivial_lower_bound`] alone, without the message
/// bound.
pub fn cut_lower_bound(problem: &Problem, fragments: &[Fragment]) -> LowerBound {
    cuts(problem, fragments, problem.forwarding() == Forwarding::Cluster).0
}

/// The cut bounds of a problem's fragments under both forwardings:
/// (forwarding within nodes, across the cluster). The first bounds every
/// plan whose multicasts stay within nodes (the LP's, the baselines'),
/// whatever the problem allows. Forwarding across the cluster lowers only
/// the cuts out of a node, a device or a group and into a group: where
/// the first is given by another cut, the two are the same, and the
/// fragments are cut once.
pub(crate) fn cut_lower_bounds(problem: &Problem, fragments: &[Fragment]) -> (LowerBound, LowerBound) {
    let (within, shared) = cuts(problem, fragments, false);
    if shared {
        return (within.clone(), within);
    }
    (within, cuts(problem, fragments, true).0)
}

/// Raise `best` to `bytes` over `cap` where that is more (a tie keeps it).
fn consider(best: &mut LowerBound, bytes: u64, cap: f64, reason: impl FnOnce() -> String) {
    let s = bytes as f64 / cap;
    if s > best.seconds {
        *best = LowerBound {
            seconds: s,
            reason: reason(),
        };
    }
}

/// The cut bounds, forwarding within nodes or (`wide`) across the cluster,
/// and whether a cut that does not depend on the forwarding gives them.
fn cuts(problem: &Problem, fragments: &[Fragment], wide: bool) -> (LowerBound, bool) {
    let cluster = problem.cluster();
    let b = cluster.bandwidth();
    let node_nic = cluster.nics_per_node() as f64 * b.nic;
    let multi_node = cluster.nodes() > 1;
    let dev_cap = b.intra_node + if multi_node { b.nic } else { 0.0 };
    let mut into_device: BTreeMap<DeviceId, u64> = BTreeMap::new();
    let mut written: BTreeMap<DeviceId, u64> = BTreeMap::new();
    // Boxes per cut and per datum (tensor, addend), counted once below:
    // (key, fragment index) pairs, grouped by sorting (millions of them at
    // scale: a map of vectors spent its time allocating).
    let mut into_node: Vec<((u32, Datum), u32)> = Vec::new();
    let mut out_node: Vec<((u32, u32, Datum), u32)> = Vec::new();
    let mut out_device: Vec<((DeviceId, Reach, Datum), u32)> = Vec::new();
    let mut nodes_of = HolderNodes::new(cluster);
    for (i, f) in fragments.iter().enumerate() {
        let i = fragment_index(i);
        *written.entry(f.dst).or_default() += f.bytes;
        let n = cluster.node_of(f.dst);
        let datum = datum(f);
        let holder_nodes = nodes_of.of(&f.holders);
        // Only a holder on the destination's node can be the destination
        // (the list can hold thousands of devices: look only then).
        let held = holder_nodes.binary_search(&n).is_ok() && f.holders.contains(&f.dst);
        if !held {
            *into_device.entry(f.dst).or_default() += f.bytes;
        }
        if holder_nodes.binary_search(&n).is_err() {
            into_node.push(((n, datum), i));
            if let [hn] = holder_nodes[..] {
                // Forwarding across the cluster, a box may leave a node
                // once for every other node that needs it.
                out_node.push(((hn, if wide { u32::MAX } else { n }, datum), i));
            }
        }
        if let [only] = f.holders[..] {
            if only != f.dst {
                // Only a copy into another node can fan out, unless
                // forwarding reaches anywhere.
                let reach = if wide {
                    Reach::Anywhere
                } else if cluster.node_of(only) == n {
                    Reach::Device(f.dst)
                } else {
                    Reach::Node(n)
                };
                out_device.push(((only, reach, datum), i));
            }
        }
    }
    // The cuts are independent: sum them side by side (the same sums in
    // any order).
    let parallel = fragments.len() >= crate::par::SMALL;
    let ((into_node, out_node), (out_device, (into_group, out_group))) = crate::par::join(
        parallel,
        || {
            crate::par::join(
                parallel,
                || sum_by(into_node, fragments, |k| k.0),
                || sum_by(out_node, fragments, |k| k.0),
            )
        },
        || {
            crate::par::join(
                parallel,
                || sum_by(out_device, fragments, |k| k.0),
                || group_cuts(cluster, fragments, wide),
            )
        },
    );
    let mut best = LowerBound {
        seconds: 0.0,
        reason: "nothing needs to move".into(),
    };
    // First the cuts that hold whatever the forwarding.
    for (&d, &bytes) in &into_device {
        consider(&mut best, bytes, dev_cap, || {
            format!("{bytes} bytes must reach device {d}")
        });
    }
    for (&d, &bytes) in &written {
        consider(&mut best, bytes, dev_cap + b.device_memory, || {
            format!("{bytes} bytes must be written on device {d}")
        });
    }
    for (&n, &bytes) in &into_node {
        consider(&mut best, bytes, node_nic, || {
            format!("{bytes} bytes must enter node {n}")
        });
    }
    let shared = best.seconds;
    for (&n, &bytes) in &out_node {
        consider(&mut best, bytes, node_nic, || {
            format!("{bytes} bytes must leave node {n}")
        });
    }
    for (&d, &bytes) in &out_device {
        consider(&mut best, bytes, dev_cap, || {
            format!("{bytes} bytes must leave device {d}")
        });
    }
    for (g, bytes) in into_group {
        consider(&mut best, bytes, g.down, || {
            format!("{bytes} bytes must enter the nodes below {} over its downlinks", g.name)
        });
    }
    for (g, bytes) in out_group {
        consider(&mut best, bytes, g.up, || {
            format!("{bytes} bytes must leave the nodes below {} over its uplinks", g.name)
        });
    }
    let shared = best.seconds <= shared;
    (best, shared)
}

/// A closed group of a fabric: sibling switches whose subtrees hold every
/// NIC of the nodes that have any NIC there (the rail switches of one
/// scalable unit). Whatever enters those nodes from elsewhere crosses one
/// of the switches' downlinks, and whatever leaves crosses an uplink.
#[derive(Clone, Debug)]
pub struct FabricGroup {
    /// For reports: the first switch's name and how many there are.
    pub name: String,
    /// Summed uplink capacity.
    pub up: f64,
    /// Summed downlink capacity.
    pub down: f64,
    /// The nodes inside, ascending.
    pub nodes: Vec<u32>,
}

/// The closed groups of a cluster's fabric (none without one): for every
/// switch, its children joined when a node has NICs below both, kept where
/// no node below them has a NIC elsewhere.
pub fn fabric_groups(cluster: &Cluster) -> Vec<FabricGroup> {
    if !cluster.has_fabric() {
        return Vec::new();
    }
    let nics_of = |n: u32| -> Vec<u32> {
        if Some(n * cluster.gpus_per_node()) == cluster.storage_device() {
            cluster.storage_nic().into_iter().collect()
        } else {
            let k = cluster.nics_per_node();
            (n * k..(n + 1) * k).collect()
        }
    };
    // Per parent switch: per node, the children of that parent above its
    // NICs, and whether some NIC of the node is not below any child.
    let mut below: BTreeMap<u32, BTreeMap<u32, (BTreeSet<u32>, bool)>> = BTreeMap::new();
    for n in 0..cluster.nodes() {
        let nics = nics_of(n);
        let mut chains: Vec<Vec<u32>> = Vec::new();
        for &k in &nics {
            let Some(mut s) = cluster.switch_of_nic(k) else {
                continue;
            };
            let mut chain = vec![s];
            while let Some(p) = cluster.parent_switch(s) {
                chain.push(p);
                s = p;
            }
            chains.push(chain);
        }
        let parents: BTreeSet<u32> = chains.iter().flat_map(|c| c[1..].iter().copied()).collect();
        for p in parents {
            let e = below.entry(p).or_default().entry(n).or_default();
            for c in &chains {
                match c.iter().position(|&s| s == p) {
                    Some(i) if i > 0 => {
                        e.0.insert(c[i - 1]);
                    }
                    _ => e.1 = true,
                }
            }
        }
    }
    // Every switch has one parent, so the children of different parents
    // never meet: one union-find over all switches joins the children a
    // node spans.
    let mut comp: Vec<usize> = (0..cluster.num_switches() as usize).collect();
    let mut groups = Vec::new();
    for (_, nodes) in below {
        for (children, _) in nodes.values() {
            let mut it = children.iter();
            if let Some(&a) = it.next() {
                for &b in it {
                    let (ra, rb) = (root(&mut comp, a as usize), root(&mut comp, b as usize));
                    comp[rb] = ra;
                }
            }
        }
        let mut members: BTreeMap<usize, (Vec<u32>, Vec<u32>, bool)> = BTreeMap::new();
        let children: BTreeSet<u32> = nodes.values().flat_map(|(c, _)| c.iter().copied()).collect();
        for c in children {
            members.entry(root(&mut comp, c as usize)).or_default().0.push(c);
        }
        for (&n, (children, open)) in &nodes {
            let Some(&c) = children.iter().next() else { continue };
            let m = members
                .get_mut(&root(&mut comp, c as usize))
                .expect("every child has a component");
            m.1.push(n);
            m.2 |= *open;
        }
        // In the order of their first switch.
        let mut members: Vec<(Vec<u32>, Vec<u32>, bool)> = members.into_values().collect();
        members.sort_by_key(|m| m.0[0]);
        for (switches, nodes, open) in members {
            if open || nodes.is_empty() {
                continue;
            }
            let cap = |l: fn(u32) -> FabricLink| switches.iter().map(|&s| cluster.fabric_capacity(l(s))).sum::<f64>();
            groups.push(FabricGroup {
                name: format!(
                    "switch `{}` and {} more",
                    cluster.switch_name(switches[0]),
                    switches.len() - 1
                ),
                up: cap(FabricLink::Up),
                down: cap(FabricLink::Down),
                nodes,
            });
        }
    }
    groups
}

/// Bytes per fabric group.
type GroupBytes = Vec<(FabricGroup, u64)>;

/// Bytes that must enter and leave each closed group of the fabric (see
/// [`FabricGroup`]), distinct per destination node and datum: a copy ends
/// on one node, so a box two nodes need crosses the group's links twice.
fn group_cuts(cluster: &Cluster, fragments: &[Fragment], wide: bool) -> (GroupBytes, GroupBytes) {
    let groups = fabric_groups(cluster);
    if groups.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let mut of_node: Vec<Vec<usize>> = vec![Vec::new(); cluster.nodes() as usize];
    for (g, group) in groups.iter().enumerate() {
        for &n in &group.nodes {
            of_node[n as usize].push(g);
        }
    }
    // A copy ends on one node (its multicast fans out within it), so what
    // enters or leaves a group is counted per destination node and datum;
    // forwarding across the cluster, once per datum.
    let mut into: Vec<((usize, usize, Datum), u32)> = Vec::new();
    let mut out: Vec<((usize, usize, Datum), u32)> = Vec::new();
    let mut nodes_of = HolderNodes::new(cluster);
    for (i, f) in fragments.iter().enumerate() {
        let i = fragment_index(i);
        let n = cluster.node_of(f.dst) as usize;
        let counted = if wide { usize::MAX } else { n };
        let holder_nodes = nodes_of.of(&f.holders);
        for &g in &of_node[n] {
            if holder_nodes.iter().all(|&h| !of_node[h as usize].contains(&g)) {
                into.push(((g, counted, datum(f)), i));
            }
        }
        // Held within one group only, needed outside it.
        if let Some(&first) = holder_nodes.first() {
            for &g in &of_node[first as usize] {
                if !of_node[n].contains(&g) && holder_nodes.iter().all(|&h| of_node[h as usize].contains(&g)) {
                    out.push(((g, counted, datum(f)), i));
                }
            }
        }
    }
    let total = |m: Vec<((usize, usize, Datum), u32)>| -> GroupBytes {
        sum_by(m, fragments, |k| k.0 as u32)
            .into_iter()
            .map(|(g, b)| (groups[g as usize].clone(), b))
            .collect()
    };
    (total(into), total(out))
}

/// Distinct bytes of each group of fragments, summed per cut.
fn sum_by<K: Ord + std::marker::Copy>(
    mut pairs: Vec<(K, u32)>,
    fragments: &[Fragment],
    cut: impl Fn(&K) -> u32,
) -> BTreeMap<u32, u64> {
    // Key, then fragment order: each group lists its fragments in order.
    pairs.sort_unstable();
    let mut out: BTreeMap<u32, u64> = BTreeMap::new();
    let mut group: Vec<&Fragment> = Vec::new();
    for run in pairs.chunk_by(|a, b| a.0 == b.0) {
        group.clear();
        group.extend(run.iter().map(|&(_, i)| &fragments[i as usize]));
        *out.entry(cut(&run[0].0)).or_default() += distinct_bytes(&mut group);
    }
    out
}

/// A fragment's index as the cut bounds store it (four billion fragments
/// would take hundreds of gigabytes long before this limit).
fn fragment_index(i: usize) -> u32 {
    u32::try_from(i).expect("fewer than 2^32 fragments")
}

/// What a fragment carries: a tensor's elements, or one holder's addend of
/// a partial tensor (distinct data even where the boxes coincide).
type Datum = (u32, Option<DeviceId>);

fn datum(f: &Fragment) -> Datum {
    (f.tensor, f.reduce.then(|| f.holders[0]))
}

/// Where a device's bytes go, for its egress cut: one device of its own
/// node (a copy each), a node (one multicast may serve all its devices),
/// or, forwarding across the cluster, anywhere (one copy may serve all).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Reach {
    Device(DeviceId),
    Node(u32),
    Anywhere,
}

/// Bytes of pairwise-disjoint boxes among fragments of one datum: a lower
/// bound on the bytes of their union (identical boxes count once, and a box
/// overlapping one already counted is skipped).
fn distinct_bytes(frags: &mut Vec<&Fragment>) -> u64 {
    frags.sort_by(|a, b| a.region.cmp(&b.region));
    frags.dedup_by(|a, b| a.region == b.region);
    frags.sort_by_key(|f| f.region.range(0).start);
    let mut open: Vec<&Fragment> = Vec::new();
    let mut bytes = 0;
    for &f in frags.iter() {
        let start = f.region.range(0).start;
        // Boxes that end before this one starts cannot overlap later ones.
        open.retain(|g| g.region.range(0).end > start);
        if open.iter().all(|g| g.region.intersect(&f.region).is_none()) {
            bytes += f.bytes;
            open.push(f);
        }
    }
    bytes
}

/// For every fragment, the other devices of its destination's node that
/// need some of the same elements (same tensor, same addend), when a holder
/// sits off that node: the devices one multicast copy could serve with it.
/// A superset is always safe for the bounds that use it.
pub fn multicast_peers(cluster: &Cluster, fragments: &[Fragment]) -> Vec<Vec<DeviceId>> {
    let mut peers: Vec<Vec<DeviceId>> = vec![Vec::new(); fragments.len()];
    // Fragments grouped by (node, datum, first row), by sorting (millions
    // of them at scale: a map of vectors spent its time allocating).
    let mut keyed: Vec<((u32, Datum, u64), u32)> = Vec::new();
    let mut nodes_of = HolderNodes::new(cluster);
    for (i, f) in fragments.iter().enumerate() {
        let n = cluster.node_of(f.dst);
        if nodes_of.of(&f.holders) != [n] {
            keyed.push(((n, datum(f), f.region.range(0).start), fragment_index(i)));
        }
    }
    keyed.sort_unstable();
    for group in keyed.chunk_by(|a, b| (a.0 .0, a.0 .1) == (b.0 .0, b.0 .1)) {
        for (k, &(_, i)) in group.iter().enumerate() {
            let a = &fragments[i as usize];
            let end = a.region.range(0).end;
            for &((_, _, start), j) in &group[k + 1..] {
                if start >= end {
                    break;
                }
                let b = &fragments[j as usize];
                if a.dst != b.dst && a.region.intersect(&b.region).is_some() {
                    peers[i as usize].push(b.dst);
                    peers[j as usize].push(a.dst);
                }
            }
        }
    }
    for p in &mut peers {
        p.sort_unstable();
        p.dedup();
    }
    peers
}

/// The sorted union of two sorted, duplicate-free lists.
fn merge_sorted(a: &[DeviceId], b: &[DeviceId]) -> Vec<DeviceId> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => {
                out.push(a[i]);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                out.push(b[j]);
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                out.push(a[i]);
                i += 1;
                j += 1;
            }
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

/// Devices compared per sender set in the subset tests of
/// [`issue_lower_bound`], beyond which the set counts only its own pieces.
const MAX_SUBSET_WORK: usize = 1 << 20;

/// The message bound: every target piece is written by at least one
/// message, issued by a live device holding some of its elements or, for a
/// multicast, forwarded by another device of its node that receives the
/// same elements; and a device issues its messages one latency apart (the
/// last no earlier than `m · latency`).
/// For any set H of devices, the pieces whose possible senders all lie in H
/// need at least that many messages from H, so some device of H issues at
/// least ⌈pieces / |H|⌉ of them.
///
/// Forwarding across the cluster, any device that receives a box may pass
/// it on, so the bound counts every target piece against every device that
/// holds or receives anything.
pub fn issue_lower_bound(problem: &Problem, fragments: &[Fragment]) -> LowerBound {
    issue_weighted(problem, fragments, &|_| 1)
}

/// [`issue_lower_bound`] with each piece of tensor `t` counted
/// `weight(t)` times (see [`trivial_lower_bound_weighted`]).
fn issue_weighted(problem: &Problem, fragments: &[Fragment], weight: &dyn Fn(TensorId) -> u64) -> LowerBound {
    let latency = problem.cluster().latency_s();
    if problem.forwarding() == Forwarding::Cluster {
        let mut pieces: Vec<(DeviceId, u32, u64, TensorId)> = fragments
            .iter()
            .map(|f| (f.dst, f.buffer, f.offset, f.tensor))
            .collect();
        pieces.sort_unstable();
        pieces.dedup();
        let mut senders: Vec<DeviceId> = Vec::new();
        let mut lists: HashSet<*const DeviceId> = HashSet::new();
        for f in fragments {
            senders.push(f.dst);
            if lists.insert(f.holders.as_ptr()) {
                senders.extend(f.holders.iter().copied());
            }
        }
        senders.sort_unstable();
        senders.dedup();
        let (n, count) = (
            senders.len().max(1) as u64,
            pieces.iter().map(|p| weight(p.3)).sum::<u64>(),
        );
        return LowerBound {
            seconds: count.div_ceil(n) as f64 * latency,
            reason: format!("{count} target pieces can only be sent by {n} devices, one message per {latency:e} s"),
        };
    }
    let peers = multicast_peers(problem.cluster(), fragments);
    // The possible senders of each target piece: its fragments' holder
    // lists and multicast peers. Pieces are first counted by the addresses
    // of their (shared) holder lists and their peers, which is cheap to
    // hash, then merged by content: `by_set` is ordered by content, so the
    // result stays deterministic.
    let mut order: Vec<usize> = (0..fragments.len()).collect();
    order.sort_by_key(|&i| (fragments[i].dst, fragments[i].buffer, fragments[i].offset));
    // (addresses of the holder lists, peers) -> (the lists, pieces).
    type Key = (Vec<*const DeviceId>, Vec<DeviceId>);
    type Count<'a> = (Vec<&'a Arc<[DeviceId]>>, u64);
    let mut by_lists: HashMap<Key, Count<'_>> = HashMap::new();
    for piece in order.chunk_by(|&i, &j| {
        let (a, b) = (&fragments[i], &fragments[j]);
        (a.dst, a.buffer, a.offset) == (b.dst, b.buffer, b.offset)
    }) {
        let mut lists: Vec<&Arc<[DeviceId]>> = piece.iter().map(|&i| &fragments[i].holders).collect();
        lists.sort_by_key(|l| l.as_ptr());
        lists.dedup_by_key(|l| l.as_ptr());
        let mut extra: Vec<DeviceId> = piece.iter().flat_map(|&i| peers[i].iter().copied()).collect();
        extra.sort_unstable();
        extra.dedup();
        let key = (lists.iter().map(|l| l.as_ptr()).collect(), extra);
        by_lists.entry(key).or_insert((lists, 0)).1 += weight(fragments[piece[0]].tensor);
    }
    // Many keys share their holder lists and differ in a few peers: the
    // lists' union (thousands of devices under wide data parallelism) is
    // sorted once per combination and merged with each key's peers.
    let mut unions: HashMap<Vec<*const DeviceId>, Vec<DeviceId>> = HashMap::new();
    let mut counted: HashMap<Vec<DeviceId>, u64> = HashMap::new();
    for ((ptrs, extra), (lists, n)) in by_lists {
        let union = unions.entry(ptrs).or_insert_with(|| {
            let mut u: Vec<DeviceId> = lists.iter().flat_map(|l| l.iter().copied()).collect();
            u.sort_unstable();
            u.dedup();
            u
        });
        *counted.entry(merge_sorted(union, &extra)).or_default() += n;
    }
    let by_set: BTreeMap<Vec<DeviceId>, u64> = counted.into_iter().collect();
    let mut best = LowerBound {
        seconds: 0.0,
        reason: "no messages".into(),
    };
    let mut consider = |pieces: u64, set: &[DeviceId]| {
        let n = set.len().max(1) as u64;
        let s = pieces.div_ceil(n) as f64 * latency;
        if s > best.seconds {
            best = LowerBound {
                seconds: s,
                reason: format!(
                    "{pieces} target pieces can only be sent by {n} devices, one message per {latency:e} s"
                ),
            };
        }
    };
    let all: Vec<DeviceId> = by_set
        .keys()
        .flatten()
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    consider(by_set.values().sum(), &all);
    // A set G lies within H only if G's smallest device is in H: index the
    // sets by their smallest device, so each H looks at few candidates
    // (replica groups of different shards are disjoint).
    let sets: Vec<(&Vec<DeviceId>, u64)> = by_set.iter().map(|(s, &n)| (s, n)).collect();
    let devices = all.last().map_or(0, |&d| d as usize + 1);
    let mut by_first: Vec<Vec<usize>> = vec![Vec::new(); devices];
    for (i, (g, _)) in sets.iter().enumerate() {
        if let Some(&first) = g.first() {
            by_first[first as usize].push(i);
        }
    }
    // H as a bitset over devices, so each test of a candidate G costs |G|.
    let mut in_h = vec![0u64; devices.div_ceil(64)];
    for &(h, n) in &sets {
        for &d in h {
            in_h[d as usize / 64] |= 1 << (d % 64);
        }
        // A pathological family of nested sets falls back to H's own
        // pieces once the tests would cost more than MAX_SUBSET_WORK.
        let mut work = 0;
        let candidates = h
            .iter()
            .flat_map(|&first| &by_first[first as usize])
            .map(|&i| sets[i])
            .filter(|(g, _)| g.len() <= h.len());
        let mut within = Some(0);
        for (g, m) in candidates {
            work += g.len();
            if work > MAX_SUBSET_WORK {
                within = None;
                break;
            }
            // From the largest device down: sets of one family share their
            // holders (low ids, a shard's replicas) and differ in their
            // multicast peers (the destination's node), so a G not within
            // H is told by its first test rather than after hundreds.
            if g.iter().rev().all(|&d| in_h[d as usize / 64] & (1 << (d % 64)) != 0) {
                within = within.map(|w| w + m);
            }
        }
        for &d in h {
            in_h[d as usize / 64] = 0;
        }
        consider(within.unwrap_or(n), h);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fragments;

    /// The ceiling that lets the cut bounds skip the message bound is never
    /// below it: on random problems (failures, storage, uneven layouts) and
    /// on a real model's reshard.
    #[test]
    fn the_message_bound_stays_under_its_ceiling() {
        let real = crate::gpt3_reshard();
        let mut checked = 0;
        for problem in std::iter::once(real).chain((0..200).map(tenplan_proofs::random_problem)) {
            let Ok(frags) = fragments(&problem) else { continue };
            let Some(ceiling) = issue_ceiling(&problem, &frags, &|_| 1) else {
                continue;
            };
            let bound = issue_lower_bound(&problem, &frags).seconds;
            assert!(bound <= ceiling, "message bound {bound} above its ceiling {ceiling}");
            checked += usize::from(bound > 0.0);
        }
        assert!(checked > 50, "only {checked} problems with message latency");
    }
}
