//! The optimal planner: a linear program over the sub-tensor transfer graph,
//! solved with HiGHS, with a certified lower bound.
//!
//! 1. Fragments with the same destination and the same set of live holders
//!    form one commodity, so the LP's size follows the number of replica
//!    groups, not the number of tensors.
//! 2. Phase 1 minimises the makespan `T`: variables `x[c,s]` are the fraction of
//!    commodity `c` sent by holder `s`, `Σ_s x[c,s] = 1`, and every
//!    resource's load is at most `capacity · T`. Bytes are divisible, so the
//!    LP is exact for the cost model. Phase 2 keeps `T` and minimises
//!    traffic (local copies free, intra-node cheaper than cross-node).
//! 3. The lower bound does not trust the solver: it is recomputed by weak
//!    duality from the phase-1 resource prices (see [`certified_bound`]),
//!    over every route a plan may take, relays included.
//! 4. Fragments are split among their sources to match the LP's byte totals
//!    at element granularity (a flat range of a box is at most 2·ndim−1 boxes).
//! 5. Multicast: a box that several devices of one node need, from holders
//!    off that node, may cross the network once to one of them (the leader)
//!    and be forwarded over the intra-node link to the others. Each such
//!    opportunity is a [`Multicast`] with one variable per (holder, leader);
//!    what it delivers counts towards every member's demand.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use good_lp::{highs, variable, Expression, ProblemVariables, Solution, SolverModel, Variable};
use tenplan_ptc::{Cluster, Copy, DeviceId, Forward, Plan, Problem, Region, TensorId};

use crate::cost::{capacity, hop, Resource};
use crate::intersect::{fragments, Fragment, HolderNodes};
use crate::{Error, LowerBound, Planner, Result, SolverFailure};

/// Units of one LP instance: bytes are counted in units of the largest
/// commodity and time in the time that commodity takes on the fastest link,
/// so that every coefficient is near 1 whatever the problem's size.
#[derive(Clone, Copy, Debug)]
struct Units {
    bytes: f64,
    seconds: f64,
}

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
/// of its members (see [`tenplan_ptc::Copy::fanout`]).
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
    type Key<'a> = (u32, TensorId, &'a Region, &'a [DeviceId]);
    let mut same: BTreeMap<Key<'_>, Vec<usize>> = BTreeMap::new();
    let mut nodes_of = HolderNodes::new(cluster);
    for (i, f) in frags.iter().enumerate() {
        let n = cluster.node_of(f.dst);
        if nodes_of.of(&f.holders).binary_search(&n).is_err() {
            same.entry((n, f.tensor, &f.region, &f.holders)).or_default().push(i);
        }
    }
    let mut out: Vec<Multicast> = Vec::new();
    let mut index: BTreeMap<(Vec<DeviceId>, &[DeviceId]), usize> = BTreeMap::new();
    for ((_, _, _, holders), mut group) in same {
        // One fragment per device: a device needing a box twice gets its
        // second one by unicast.
        group.sort_by_key(|&i| (frags[i].dst, i));
        group.dedup_by_key(|i| frags[*i].dst);
        if group.len() < 2 {
            continue;
        }
        let members: Vec<DeviceId> = group.iter().map(|&i| frags[i].dst).collect();
        let m = *index.entry((members.clone(), holders)).or_insert_with(|| {
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
const MULTICAST_SLACK: f64 = 5e-4;

/// Leave out the multicasts that cannot change the makespan by more than
/// [`MULTICAST_SLACK`]: each costs one LP column per (holder, leader), and
/// replicated small tensors (layer norms on every tensor-parallel rank)
/// make hundreds of them that save microseconds. A multicast left out adds
/// at most its saving (bytes · (members − 1) over the node's NIC capacity)
/// to its node's ingress, and about that much, spread over its holders'
/// nodes, to their egress; the smallest are left out while every node's
/// total stays within the slack. Plans stay exact, and the bound still
/// prices every multicast.
fn prune_multicasts(cluster: &Cluster, comms: &[Commodity], mcasts: Vec<Multicast>) -> Vec<Multicast> {
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

/// The rows one multicast option loads, for the whole multicast: the hop
/// from the holder to the leader, and from the leader to every other member.
fn multicast_route(
    cluster: &Cluster,
    m: &Multicast,
    src: DeviceId,
    leader: usize,
    units: Units,
    res: &mut Resources,
) -> Route {
    let bytes = m.bytes as f64 / units.bytes;
    let messages = cluster.latency_s() * m.groups.len() as f64 / units.seconds;
    let l = m.members[leader];
    let mut route: Route = Vec::new();
    for r in hop(cluster, src, l) {
        route.push((res.id(Row::Link(r)), bytes));
    }
    for &e in m.members.iter().filter(|&&e| e != l) {
        for r in hop(cluster, l, e) {
            route.push((res.id(Row::Link(r)), bytes));
        }
        if messages > 0.0 {
            route.push((res.id(Row::Issue(l)), messages));
        }
    }
    if messages > 0.0 {
        route.push((res.id(Row::Issue(src)), messages));
    }
    route
}

/// Solver settings of the LP planner.
#[derive(Clone, Debug, PartialEq)]
pub struct LpPlanner {
    threads: u32,
    time_limit_s: Option<f64>,
    ipm: bool,
    placement: Placement,
    relays: bool,
    multicast: bool,
}

/// Whether the planner may choose which device runs which target rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Placement {
    /// Keep the target layout's rank-to-device assignment.
    #[default]
    Fixed,
    /// Re-assign target ranks among the target's devices to cut traffic
    /// (an assignment problem, solved exactly); the plan carries the chosen layout.
    Optimize,
}

/// Builder for [`LpPlanner`].
#[derive(Clone, Debug)]
pub struct LpPlannerBuilder {
    planner: LpPlanner,
}

impl Default for LpPlanner {
    fn default() -> Self {
        LpPlanner {
            threads: 1,
            time_limit_s: None,
            ipm: false,
            placement: Placement::Fixed,
            relays: true,
            multicast: true,
        }
    }
}

impl LpPlannerBuilder {
    /// HiGHS threads (default 1, which keeps plans deterministic).
    pub fn threads(mut self, threads: u32) -> Self {
        self.planner.threads = threads.max(1);
        self
    }

    /// Give up after this many seconds of solving (default: no limit).
    pub fn time_limit_s(mut self, seconds: f64) -> Self {
        self.planner.time_limit_s = Some(seconds);
        self
    }

    /// Use HiGHS's simplex method (the default). On these LPs, now that
    /// large models start from a few holders per commodity, it is 1–2.5×
    /// faster than the interior-point method (GPT-3 175B on 1024 GPUs:
    /// 1.2 s against 2.0 s; LLaMA-2-70B on 512: 0.6 s against 1.0 s).
    pub fn simplex(mut self) -> Self {
        self.planner.ipm = false;
        self
    }

    /// Use HiGHS's interior-point method instead of the simplex method.
    pub fn interior_point(mut self) -> Self {
        self.planner.ipm = true;
        self
    }

    /// Whether copies may be relayed through another device of the source's
    /// or the destination's node (default: yes).
    pub fn relays(mut self, relays: bool) -> Self {
        self.planner.relays = relays;
        self
    }

    /// Whether a box that several devices of one node need may cross the
    /// network once and be forwarded within the node (default: yes).
    pub fn multicast(mut self, multicast: bool) -> Self {
        self.planner.multicast = multicast;
        self
    }

    /// Whether target ranks may move between the target's devices.
    pub fn placement(mut self, placement: Placement) -> Self {
        self.planner.placement = placement;
        self
    }

    /// The planner.
    pub fn build(self) -> LpPlanner {
        self.planner
    }
}

/// The LP's answer: the byte split and the certified bound.
#[derive(Clone, Debug)]
pub struct LpSolution {
    /// Makespan of the split under the cost model (max resource load), in seconds.
    pub objective_s: f64,
    /// The paths of each commodity the LP considered.
    pub paths: Vec<Vec<Path>>,
    /// Bytes of each commodity sent along each of its paths (before what
    /// multicasts deliver is taken off).
    pub split: Vec<Vec<u64>>,
    /// The multicast opportunities the LP considered.
    pub multicasts: Vec<Multicast>,
    /// Bytes of each multicast sent by each of its options (holder-major,
    /// leader-minor), then the bytes left to unicast.
    pub multicast_split: Vec<Vec<u64>>,
    /// Bound certified from the phase-1 prices (`None` when only the plan was asked for).
    pub bound: Option<LowerBound>,
}

/// Which parts of the LP to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phases {
    /// Phase 1 and the certified bound (no plan).
    BoundOnly,
    /// Phases 1 and 2 (a plan, no bound).
    PlanOnly,
    /// Everything.
    Both,
}

/// What a row of the LP limits: a link of the cost model, or a device's
/// time spent issuing messages (each costs the cluster's latency, one at a
/// time). Issue time is a heuristic that keeps plans from shattering into
/// many small messages; only links enter the certified bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Row {
    Link(Resource),
    Issue(DeviceId),
}

struct Resources {
    ids: BTreeMap<Row, usize>,
    list: Vec<Row>,
}

impl Resources {
    fn id(&mut self, r: Row) -> usize {
        *self.ids.entry(r).or_insert_with(|| {
            self.list.push(r);
            self.list.len() - 1
        })
    }
}

/// Rounds of column generation for relayed paths.
const MAX_RELAY_ROUNDS: usize = 6;

/// One way to deliver a commodity: from a holder, directly or relayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Path {
    /// The holder that sends.
    pub src: DeviceId,
    /// The devices that forward, in order (empty: direct).
    pub via: Vec<DeviceId>,
}

impl Path {
    /// The devices the data visits on its way to `dst`.
    fn stops(&self, dst: DeviceId) -> Vec<DeviceId> {
        std::iter::once(self.src)
            .chain(self.via.iter().copied())
            .chain(std::iter::once(dst))
            .collect()
    }
}

/// Row prices in dense arrays (devices, NICs), for pricing columns: a round
/// of column generation looks up millions of prices.
struct DensePrices {
    send: Vec<f64>,
    recv: Vec<f64>,
    mem: Vec<f64>,
    issue: Vec<f64>,
    nic_out: Vec<f64>,
    nic_in: Vec<f64>,
}

impl DensePrices {
    fn new(cluster: &Cluster, rows: &[Row], price: &[f64]) -> DensePrices {
        let n = cluster.num_devices() as usize;
        let nics = (cluster.nodes() * cluster.nics_per_node()) as usize;
        let mut p = DensePrices {
            send: vec![0.0; n],
            recv: vec![0.0; n],
            mem: vec![0.0; n],
            issue: vec![0.0; n],
            nic_out: vec![0.0; nics],
            nic_in: vec![0.0; nics],
        };
        for (&row, &y) in rows.iter().zip(price) {
            match row {
                Row::Issue(d) => p.issue[d as usize] = y,
                Row::Link(Resource::Send(d)) => p.send[d as usize] = y,
                Row::Link(Resource::Recv(d)) => p.recv[d as usize] = y,
                Row::Link(Resource::Memory(d)) => p.mem[d as usize] = y,
                Row::Link(Resource::NicOut(i)) => p.nic_out[i as usize] = y,
                Row::Link(Resource::NicIn(i)) => p.nic_in[i as usize] = y,
                Row::Link(Resource::Issue(d)) => p.issue[d as usize] = y,
            }
        }
        p
    }

    /// Price of the direct path from `src` to `dst`.
    fn direct(&self, cluster: &Cluster, src: DeviceId, dst: DeviceId, bytes: f64, issue: f64) -> f64 {
        let (s, d) = (src as usize, dst as usize);
        let links = if src == dst {
            self.mem[s]
        } else if cluster.node_of(src) == cluster.node_of(dst) {
            self.send[s] + self.recv[d]
        } else {
            self.nic_out[cluster.nic_of(src) as usize] + self.nic_in[cluster.nic_of(dst) as usize]
        };
        links * bytes + self.issue[s] * issue
    }

    /// The cheapest way out of `src`'s node: through its own NIC, or
    /// through a peer's (an intra-node hop, a forward, the peer's NIC).
    fn way_out(&self, cluster: &Cluster, src: DeviceId, bytes: f64, issue: f64) -> (f64, DeviceId) {
        let g = cluster.gpus_per_node();
        let node = cluster.node_of(src);
        let mut out = (self.nic_out[cluster.nic_of(src) as usize] * bytes, src);
        for v in (node * g..(node + 1) * g).filter(|&v| v != src && cluster.is_live(v)) {
            let c = (self.send[src as usize] + self.recv[v as usize] + self.nic_out[cluster.nic_of(v) as usize])
                * bytes
                + self.issue[v as usize] * issue;
            if c < out.0 {
                out = (c, v);
            }
        }
        out
    }

    /// The cheapest way into `dst`'s node: through its own NIC, or through
    /// a peer's (the peer's NIC, a forward, an intra-node hop).
    fn way_in(&self, cluster: &Cluster, dst: DeviceId, bytes: f64, issue: f64) -> (f64, DeviceId) {
        let g = cluster.gpus_per_node();
        let node = cluster.node_of(dst);
        let mut inn = (self.nic_in[cluster.nic_of(dst) as usize] * bytes, dst);
        for v in (node * g..(node + 1) * g).filter(|&v| v != dst && cluster.is_live(v)) {
            let c = (self.nic_in[cluster.nic_of(v) as usize] + self.send[v as usize] + self.recv[dst as usize]) * bytes
                + self.issue[v as usize] * issue;
            if c < inn.0 {
                inn = (c, v);
            }
        }
        inn
    }
}

/// The cheapest path from `src` to `dst` on another node under row prices,
/// given the cheapest way into `dst`'s node (`inn`, from
/// [`DensePrices::way_in`], the same for every holder).
///
/// Under the cost model a relay on a third node only adds NIC traffic, and a
/// second intra-node hop only adds link traffic, so the cheapest route has at
/// most two relays: a peer on the source's node (to use its NIC) and a peer
/// on the destination's node. Their costs separate, so each side is chosen
/// on its own in O(devices per node).
fn cheapest_relay_path(
    cluster: &Cluster,
    prices: &DensePrices,
    src: DeviceId,
    dst: DeviceId,
    inn: (f64, DeviceId),
    bytes: f64,
    issue: f64,
) -> (f64, Path) {
    let out = prices.way_out(cluster, src, bytes, issue);
    let via: Vec<DeviceId> = [out.1, inn.1].into_iter().filter(|&v| v != src && v != dst).collect();
    (prices.issue[src as usize] * issue + out.0 + inn.0, Path { src, via })
}

/// Holders whose direct paths each commodity starts with: all of them when
/// there are at most [`INITIAL_HOLDERS`], else those on the destination's
/// node and [`INITIAL_HOLDERS`] others. Commodities with the same holders
/// (the receivers of one replicated shard) take consecutive blocks of them
/// in turn, so that the starting columns spread the sending evenly over the
/// replicas: the k-th such commodity starts at holder `k · INITIAL_HOLDERS`.
/// Replicated state has one holder per data-parallel rank and, for small
/// tensors, per tensor-parallel rank too: hundreds of columns per commodity
/// that column generation would mostly leave at zero.
fn initial_holders(cluster: &Cluster, comms: &[Commodity]) -> Vec<Vec<DeviceId>> {
    let mut turn: BTreeMap<&[DeviceId], usize> = BTreeMap::new();
    comms
        .iter()
        .map(|c| {
            if c.holders.len() <= INITIAL_HOLDERS {
                return c.holders.to_vec();
            }
            let node = cluster.node_of(c.dst);
            let (mut near, far): (Vec<DeviceId>, Vec<DeviceId>) =
                c.holders.iter().partition(|&&h| cluster.node_of(h) == node);
            if !far.is_empty() {
                let k = turn.entry(&c.holders).or_insert(0);
                let first = *k * INITIAL_HOLDERS;
                *k += 1;
                near.extend((0..INITIAL_HOLDERS.min(far.len())).map(|j| far[(first + j) % far.len()]));
            }
            near
        })
        .collect()
}

/// Direct paths (one per commodity and holder) above which commodities
/// start from [`initial_holders`]: below, the LP takes every holder at once.
const RESTRICT_ABOVE: usize = 50_000;

/// Off-node holders a commodity starts with (see [`initial_holders`]).
const INITIAL_HOLDERS: usize = 8;

/// The rows a path loads, for a whole commodity.
fn route_of(cluster: &Cluster, c: &Commodity, p: &Path, units: Units, res: &mut Resources) -> Route {
    let bytes = c.bytes as f64 / units.bytes;
    let issue = cluster.latency_s() * c.fragments.len() as f64 / units.seconds;
    let stops = p.stops(c.dst);
    let hops: Vec<(DeviceId, DeviceId)> = stops.windows(2).map(|w| (w[0], w[1])).collect();
    let mut route: Route = Vec::new();
    for &(a, z) in &hops {
        for r in hop(cluster, a, z) {
            route.push((res.id(Row::Link(r)), bytes));
        }
        if issue > 0.0 {
            route.push((res.id(Row::Issue(a)), issue));
        }
    }
    route
}

/// Capacity of every row, in LP units.
fn capacities(cluster: &Cluster, rows: &[Row], fastest: f64) -> Vec<f64> {
    rows.iter()
        .map(|&r| match r {
            Row::Link(r) => capacity(cluster, r) / fastest,
            Row::Issue(_) => 1.0,
        })
        .collect()
}

/// Cost weight of a route in phase 2: local copies are free, intra-node
/// copies cheaper than cross-node ones.
fn traffic_weight(cluster: &Cluster, s: DeviceId, d: DeviceId) -> f64 {
    if s == d {
        0.0
    } else if cluster.node_of(s) == cluster.node_of(d) {
        1.0
    } else {
        4.0
    }
}

impl LpPlanner {
    /// A builder with the default settings.
    pub fn builder() -> LpPlannerBuilder {
        LpPlannerBuilder {
            planner: LpPlanner::default(),
        }
    }

    fn configure(&self, model: good_lp::solvers::highs::HighsProblem) -> good_lp::solvers::highs::HighsProblem {
        self.configure_with(model, self.ipm)
    }

    fn configure_with(
        &self,
        model: good_lp::solvers::highs::HighsProblem,
        ipm: bool,
    ) -> good_lp::solvers::highs::HighsProblem {
        let mut m = model.set_threads(self.threads);
        if ipm {
            m = m.set_option("solver", "ipm");
        }
        if let Some(t) = self.time_limit_s {
            m = m.set_time_limit(t);
        }
        m
    }

    /// Solve the LP for a problem's fragments and their commodities.
    pub fn solve(&self, problem: &Problem, frags: &[Fragment], comms: &[Commodity]) -> Result<LpSolution> {
        self.run(problem, frags, comms, Phases::Both)
    }

    fn run(&self, problem: &Problem, frags: &[Fragment], comms: &[Commodity], phases: Phases) -> Result<LpSolution> {
        let cluster = problem.cluster();
        if comms.is_empty() {
            return Ok(LpSolution {
                objective_s: 0.0,
                paths: Vec::new(),
                split: Vec::new(),
                multicasts: Vec::new(),
                multicast_split: Vec::new(),
                bound: Some(LowerBound {
                    seconds: 0.0,
                    reason: "nothing to move".into(),
                }),
            });
        }
        let mut res = Resources {
            ids: BTreeMap::new(),
            list: Vec::new(),
        };
        // Variables are fractions of commodities; every coefficient is
        // scaled by `units` so that the LP stays well conditioned from
        // kilobytes to terabytes.
        let max_bytes = comms.iter().map(|c| c.bytes).max().unwrap_or(1).max(1) as f64;
        let b = cluster.bandwidth();
        let fastest = b.intra_node.max(b.nic).max(b.device_memory);
        let units = Units {
            bytes: max_bytes,
            seconds: max_bytes / fastest,
        };
        // Start with direct paths from a few holders (all of them where
        // there are few); column generation prices the others in.
        let restrict = comms.iter().map(|c| c.holders.len()).sum::<usize>() > RESTRICT_ABOVE;
        let starting = if restrict {
            initial_holders(cluster, comms)
        } else {
            comms.iter().map(|c| c.holders.to_vec()).collect()
        };
        let mut paths: Vec<Vec<Path>> = starting
            .into_iter()
            .map(|holders| holders.into_iter().map(|src| Path { src, via: Vec::new() }).collect())
            .collect();
        let restricted = paths.iter().zip(comms).any(|(p, c)| p.len() < c.holders.len());
        let mut routes: Vec<Vec<Route>> = comms
            .iter()
            .zip(&paths)
            .map(|(c, ps)| ps.iter().map(|p| route_of(cluster, c, p, units, &mut res)).collect())
            .collect();
        let mcasts = if self.multicast {
            prune_multicasts(cluster, comms, multicasts(cluster, frags, comms))
        } else {
            Vec::new()
        };
        let mroutes: Vec<Vec<Route>> = mcasts
            .iter()
            .map(|m| {
                m.options()
                    .map(|(src, k)| multicast_route(cluster, m, src, k, units, &mut res))
                    .collect()
            })
            .collect();
        // What each multicast delivers to a commodity, as a fraction of it.
        let mut shares: Vec<Vec<(usize, f64)>> = vec![Vec::new(); comms.len()];
        for (mi, m) in mcasts.iter().enumerate() {
            for &ci in &m.commodities {
                shares[ci].push((mi, m.bytes as f64 / comms[ci].bytes as f64));
            }
        }

        // Phase 1: minimise T, adding relayed paths that the prices say are
        // cheaper than every path a commodity has (column generation).
        let mut round = 0;
        let mut previous = f64::INFINITY;
        let mut cut_bound: Option<f64> = None;
        let (t_star, duals, phase1, mphase1) = loop {
            let caps = capacities(cluster, &res.list, fastest);
            let (t_star, duals, phase1, mphase1) = self.phase1_split(&Phase1Lp {
                routes: &routes,
                mroutes: &mroutes,
                shares: &shares,
                caps: &caps,
                nres: res.list.len(),
            })?;
            round += 1;
            // Stop when relays stopped paying: a round that gains less than
            // 0.1% is not worth another solve.
            let stalled = t_star >= previous * (1.0 - 1e-3);
            previous = t_star;
            if (!self.relays && !restricted) || round > MAX_RELAY_ROUNDS || stalled {
                break (t_star, duals, phase1, mphase1);
            }
            // Nor is one when the makespan is already within 0.1% of what
            // the cuts prove no plan can beat (large models, where a solve
            // costs a fraction of a second).
            if restricted {
                let cut = cut_bound.get_or_insert_with(|| crate::cost::cut_lower_bound(problem, frags).seconds);
                if t_star * units.seconds <= *cut * (1.0 + 1e-3) {
                    break (t_star, duals, phase1, mphase1);
                }
            }
            // Prices: the duals, plus a congestion price on every saturated
            // row. Many rows often tie at the makespan (a degenerate LP) while
            // the duals single out one; pricing all of them lets one round
            // route around every bottleneck at once.
            let loads = row_loads(&[(&routes, &phase1), (&mroutes, &mphase1)], res.list.len());
            let dual_of: Vec<f64> = (0..res.list.len())
                .map(|r| duals.get(comms.len() + r).copied().unwrap_or(0.0).abs())
                .collect();
            let price_of: Vec<f64> = (0..res.list.len())
                .map(|r| {
                    let tight = loads[r] >= caps[r] * t_star * (1.0 - 1e-6) && t_star > 0.0;
                    dual_of[r] + if tight { 1.0 / caps[r] } else { 0.0 }
                })
                .collect();
            let price = |r: usize| price_of[r];
            let dense = DensePrices::new(cluster, &res.list, &price_of);
            // The duals alone give the exact test for a holder's direct
            // path (a column with negative reduced cost), which the
            // congestion prices above may blur.
            let exact = DensePrices::new(cluster, &res.list, &dual_of);
            let mut new_paths = Vec::new();
            for (ci, c) in comms.iter().enumerate() {
                let cost = |route: &Route| -> f64 { route.iter().map(|&(r, k)| price(r) * k).sum() };
                let best = routes[ci].iter().map(cost).fold(f64::INFINITY, f64::min);
                let bytes = c.bytes as f64 / units.bytes;
                let issue = cluster.latency_s() * c.fragments.len() as f64 / units.seconds;
                let mut candidate: Option<(f64, Path)> = None;
                let mut direct: Option<(f64, Path)> = None;
                let mut reduced: Option<(f64, Path)> = None;
                let inn = dense.way_in(cluster, c.dst, bytes, issue);
                let some_left = paths[ci].len() < c.holders.len();
                let dual_best = if some_left {
                    let cost = |route: &Route| -> f64 { route.iter().map(|&(r, k)| dual_of[r] * k).sum() };
                    routes[ci].iter().map(cost).fold(f64::INFINITY, f64::min)
                } else {
                    0.0
                };
                for &src in c.holders.iter() {
                    if some_left {
                        let path = Path { src, via: Vec::new() };
                        let pc = dense.direct(cluster, src, c.dst, bytes, issue);
                        let rc = exact.direct(cluster, src, c.dst, bytes, issue);
                        let better = |x: &Option<(f64, Path)>, v: f64| x.as_ref().is_none_or(|x| v < x.0);
                        if (better(&direct, pc) || better(&reduced, rc)) && !paths[ci].contains(&path) {
                            if better(&direct, pc) {
                                direct = Some((pc, path.clone()));
                            }
                            if better(&reduced, rc) && rc < dual_best * (1.0 - 1e-6) {
                                reduced = Some((rc, path));
                            }
                        }
                    }
                    if !self.relays || cluster.node_of(src) == cluster.node_of(c.dst) {
                        continue;
                    }
                    let (pc, path) = cheapest_relay_path(cluster, &dense, src, c.dst, inn, bytes, issue);
                    if !path.via.is_empty() && !paths[ci].contains(&path) && candidate.as_ref().is_none_or(|x| pc < x.0)
                    {
                        candidate = Some((pc, path));
                    }
                }
                let mine = new_paths.len();
                for (pc, path) in direct.into_iter().chain(candidate) {
                    if pc < best * (1.0 - 1e-6) {
                        new_paths.push((ci, path));
                    }
                }
                if let Some((_, path)) = reduced {
                    if !new_paths[mine..].iter().any(|(_, p)| *p == path) {
                        new_paths.push((ci, path));
                    }
                }
            }
            let added = new_paths.len();
            for (ci, path) in new_paths {
                let route = route_of(cluster, &comms[ci], &path, units, &mut res);
                paths[ci].push(path);
                routes[ci].push(route);
            }
            if added == 0 {
                break (t_star, duals, phase1, mphase1);
            }
        };
        let caps = capacities(cluster, &res.list, fastest);
        let bound = (phases != Phases::PlanOnly).then(|| {
            let loads = row_loads(&[(&routes, &phase1), (&mroutes, &mphase1)], res.list.len());
            let peers = crate::cost::multicast_peers(cluster, frags);
            let duals = duals.get(comms.len()..).unwrap_or(&[]);
            certify(problem, frags, &peers, &res.list, &caps, duals, &loads, t_star)
        });
        if phases == Phases::BoundOnly {
            return Ok(LpSolution {
                objective_s: t_star * units.seconds,
                paths,
                split: Vec::new(),
                multicasts: mcasts,
                multicast_split: Vec::new(),
                bound,
            });
        }

        // Phase 2: least traffic at the optimal makespan, with a little slack
        // so that it stays feasible under the solver's tolerances. Should it
        // fail anyway, the phase-1 split is optimal for the makespan too.
        let phase2 = || -> Result<(Fractions, Fractions)> {
            let mut vars = ProblemVariables::new();
            let (x, y) = (add_columns(&mut vars, &routes), add_columns(&mut vars, &mroutes));
            let mut objective = Expression::with_capacity(x.iter().map(Vec::len).sum());
            for ((c, ps), xs) in comms.iter().zip(&paths).zip(&x) {
                for (p, &v) in ps.iter().zip(xs) {
                    let stops = p.stops(c.dst);
                    let w: f64 = stops.windows(2).map(|h| traffic_weight(cluster, h[0], h[1])).sum();
                    objective.add_mul(w * c.bytes as f64 / units.bytes, v);
                }
            }
            for (m, ys) in mcasts.iter().zip(&y) {
                for ((src, k), &v) in m.options().zip(ys) {
                    let l = m.members[k];
                    let w = traffic_weight(cluster, src, l)
                        + m.members.iter().map(|&e| traffic_weight(cluster, l, e)).sum::<f64>();
                    objective.add_mul(w * m.bytes as f64 / units.bytes, v);
                }
            }
            let mut model = self.configure(vars.minimise(objective).using(highs));
            add_demand_rows(&mut model, &x, &y, &shares);
            add_capacity_rows(
                &mut model,
                &[(&routes, &x), (&mroutes, &y)],
                &caps,
                None,
                t_star * (1.0 + 1e-6) + 1e-7,
                res.list.len(),
            );
            add_multicast_rows(&mut model, &y);
            let sol = model.solve().map_err(solver_error)?;
            check_status(&sol)?;
            Ok((values(&sol, &x), values(&sol, &y)))
        };
        let (chosen, mchosen) = phase2().unwrap_or((phase1, mphase1));
        let split: Vec<Vec<u64>> = comms
            .iter()
            .zip(&chosen)
            .map(|(c, fs)| integral_split(c.bytes, &fs.iter().map(|f| f * c.bytes as f64).collect::<Vec<_>>()))
            .collect();
        let multicast_split: Vec<Vec<u64>> = mcasts
            .iter()
            .zip(&mchosen)
            .map(|(m, ys)| {
                let b = m.bytes as f64;
                let sent: f64 = ys.iter().map(|y| y.max(0.0)).sum();
                let mut want: Vec<f64> = ys.iter().map(|y| y.max(0.0) * b).collect();
                want.push((1.0 - sent).max(0.0) * b);
                integral_split(m.bytes, &want)
            })
            .collect();
        let loads = row_loads(&[(&routes, &chosen), (&mroutes, &mchosen)], res.list.len());
        let objective_s = loads
            .iter()
            .zip(&caps)
            .zip(&res.list)
            .filter(|(_, r)| matches!(r, Row::Link(_)))
            .map(|((&l, &c), _)| l / c * units.seconds)
            .fold(0.0, f64::max);
        Ok(LpSolution {
            objective_s,
            paths,
            split,
            multicasts: mcasts,
            multicast_split,
            bound,
        })
    }

    /// Phase 1 solved one independent component at a time (in parallel):
    /// the makespan is the largest component's, and the duals are those of
    /// the components that reach it (the others' rows are slack in the
    /// whole LP, so its duals price them at zero too). Returned in the
    /// whole LP's numbering: demand rows, then capacity rows.
    fn phase1_split(&self, lp: &Phase1Lp<'_>) -> Result<Phase1> {
        use rayon::prelude::*;
        let comps = components(lp);
        if comps.len() <= 1 {
            return self.phase1(lp);
        }
        let solved: Vec<Phase1> = comps
            .par_iter()
            .map(|c| self.phase1(&SubLp::new(lp, c).lp()))
            .collect::<Result<_>>()?;
        let t_star = solved.iter().map(|p| p.0).fold(0.0, f64::max);
        let nc = lp.routes.len();
        let mut duals = vec![0.0; nc + lp.nres];
        let mut fractions: Fractions = vec![Vec::new(); nc];
        let mut mfractions: Fractions = vec![Vec::new(); lp.mroutes.len()];
        for (c, (t, d, f, mf)) in comps.iter().zip(solved) {
            for (&ci, v) in c.comms.iter().zip(f) {
                fractions[ci] = v;
            }
            for (&mi, v) in c.mcasts.iter().zip(mf) {
                mfractions[mi] = v;
            }
            // Only the components that set the makespan have priced rows;
            // their duals follow one demand row per commodity.
            if t >= t_star * (1.0 - 1e-9) {
                for (&r, &y) in c.rows.iter().zip(&d[c.comms.len()..]) {
                    duals[nc + r] = y;
                }
            }
        }
        Ok((t_star, duals, fractions, mfractions))
    }

    /// Phase 1: the makespan, the row duals and the fractions of the
    /// commodities' paths and of the multicasts' options.
    fn phase1(&self, lp: &Phase1Lp<'_>) -> Result<Phase1> {
        match self.phase1_with(lp, self.ipm) {
            // The interior-point method misreports some badly scaled
            // instances (message costs far above transfer times) as
            // infeasible, which this LP never is; the simplex method does not.
            Err(Error::Solver(SolverFailure::Infeasible | SolverFailure::Other(_))) if self.ipm => {
                self.phase1_with(lp, false)
            }
            other => other,
        }
    }

    fn phase1_with(&self, lp: &Phase1Lp<'_>, ipm: bool) -> Result<Phase1> {
        let Phase1Lp {
            routes,
            mroutes,
            shares,
            caps,
            nres,
        } = *lp;
        let mut vars = ProblemVariables::new();
        let t = vars.add(variable().min(0.0));
        let (x, y) = (add_columns(&mut vars, routes), add_columns(&mut vars, mroutes));
        let mut model = self.configure_with(vars.minimise(t).using(highs), ipm);
        add_demand_rows(&mut model, &x, &y, shares);
        add_capacity_rows(&mut model, &[(routes, &x), (mroutes, &y)], caps, Some(t), 1.0, nres);
        add_multicast_rows(&mut model, &y);
        let sol = model.solve().map_err(solver_error)?;
        check_status(&sol)?;
        let t_star = sol.value(t);
        let (fractions, mfractions) = (values(&sol, &x), values(&sol, &y));
        let duals = sol.into_inner().dual_rows().to_vec();
        Ok((t_star, duals, fractions, mfractions))
    }
}

/// Commodities and multicasts whose columns share no row with any outside
/// them, with the rows they use: the LP splits into one independent LP per
/// component (the rails and pipeline stages of a data-parallel change at
/// 16k GPUs are dozens of them), each far cheaper to solve than their sum.
struct Component {
    comms: Vec<usize>,
    mcasts: Vec<usize>,
    rows: Vec<usize>,
}

/// Union-find root with path halving.
fn root(parent: &mut [usize], mut x: usize) -> usize {
    while parent[x] != x {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    x
}

/// The independent components of an LP's columns, ordered by their first
/// commodity (so plans stay deterministic).
fn components(lp: &Phase1Lp<'_>) -> Vec<Component> {
    let (nc, nm, nres) = (lp.routes.len(), lp.mroutes.len(), lp.nres);
    // Vertices: rows, then commodities, then multicasts.
    let mut parent: Vec<usize> = (0..nres + nc + nm).collect();
    let join = |parent: &mut Vec<usize>, a: usize, b: usize| {
        let (ra, rb) = (root(parent, a), root(parent, b));
        if ra != rb {
            parent[ra.max(rb)] = ra.min(rb);
        }
    };
    for (ci, opts) in lp.routes.iter().enumerate() {
        for &(r, _) in opts.iter().flatten() {
            join(&mut parent, nres + ci, r);
        }
        for &(mi, _) in &lp.shares[ci] {
            join(&mut parent, nres + ci, nres + nc + mi);
        }
    }
    for (mi, opts) in lp.mroutes.iter().enumerate() {
        for &(r, _) in opts.iter().flatten() {
            join(&mut parent, nres + nc + mi, r);
        }
    }
    let mut index: HashMap<usize, usize> = HashMap::new();
    let mut out: Vec<Component> = Vec::new();
    let mut of = |parent: &mut Vec<usize>, v: usize, out: &mut Vec<Component>| -> usize {
        let r = root(parent, v);
        *index.entry(r).or_insert_with(|| {
            out.push(Component {
                comms: Vec::new(),
                mcasts: Vec::new(),
                rows: Vec::new(),
            });
            out.len() - 1
        })
    };
    for ci in 0..nc {
        let k = of(&mut parent, nres + ci, &mut out);
        out[k].comms.push(ci);
    }
    for mi in 0..nm {
        let k = of(&mut parent, nres + nc + mi, &mut out);
        out[k].mcasts.push(mi);
    }
    for r in 0..nres {
        // A row no column uses has no component (and no load).
        if let Some(&k) = index.get(&root(&mut parent, r)) {
            out[k].rows.push(r);
        }
    }
    out
}

/// One component's LP, its rows renumbered from 0.
struct SubLp {
    routes: Vec<Vec<Route>>,
    mroutes: Vec<Vec<Route>>,
    shares: Vec<Vec<(usize, f64)>>,
    caps: Vec<f64>,
}

impl SubLp {
    fn new(lp: &Phase1Lp<'_>, c: &Component) -> SubLp {
        let local: HashMap<usize, usize> = c.rows.iter().enumerate().map(|(i, &r)| (r, i)).collect();
        let mlocal: HashMap<usize, usize> = c.mcasts.iter().enumerate().map(|(i, &m)| (m, i)).collect();
        let remap = |opts: &Vec<Route>| -> Vec<Route> {
            opts.iter()
                .map(|route| route.iter().map(|&(r, k)| (local[&r], k)).collect())
                .collect()
        };
        SubLp {
            routes: c.comms.iter().map(|&ci| remap(&lp.routes[ci])).collect(),
            mroutes: c.mcasts.iter().map(|&mi| remap(&lp.mroutes[mi])).collect(),
            shares: c
                .comms
                .iter()
                .map(|&ci| lp.shares[ci].iter().map(|&(m, k)| (mlocal[&m], k)).collect())
                .collect(),
            caps: c.rows.iter().map(|&r| lp.caps[r]).collect(),
        }
    }

    fn lp(&self) -> Phase1Lp<'_> {
        Phase1Lp {
            routes: &self.routes,
            mroutes: &self.mroutes,
            shares: &self.shares,
            caps: &self.caps,
            nres: self.caps.len(),
        }
    }
}

/// What phase 1 solves: the routes of the commodities' paths and of the
/// multicasts' options, what each multicast delivers to each commodity, and
/// the rows' capacities.
#[derive(Clone, Copy)]
struct Phase1Lp<'a> {
    routes: &'a [Vec<Route>],
    mroutes: &'a [Vec<Route>],
    shares: &'a [Vec<(usize, f64)>],
    caps: &'a [f64],
    nres: usize,
}

/// Phase 1's answer: makespan, row duals, path fractions, multicast fractions.
type Phase1 = (f64, Vec<f64>, Fractions, Fractions);

/// One non-negative variable per option of every commodity (or multicast).
fn add_columns(vars: &mut ProblemVariables, routes: &[Vec<Route>]) -> Vec<Vec<Variable>> {
    routes
        .iter()
        .map(|opts| vars.add_vector(variable().min(0.0), opts.len()))
        .collect()
}

/// The solved value of every variable, per commodity (or multicast).
fn values(sol: &impl Solution, vars: &[Vec<Variable>]) -> Fractions {
    vars.iter()
        .map(|xs| xs.iter().map(|&v| sol.value(v)).collect())
        .collect()
}

/// Every commodity is delivered whole: its paths' fractions plus what the
/// multicasts it belongs to deliver (as fractions of it) add up to 1.
fn add_demand_rows(
    model: &mut impl SolverModel,
    x: &[Vec<Variable>],
    y: &[Vec<Variable>],
    shares: &[Vec<(usize, f64)>],
) {
    for (xs, share) in x.iter().zip(shares) {
        let mut e = Expression::with_capacity(xs.len());
        for &v in xs {
            e.add_mul(1.0, v);
        }
        for &(m, k) in share {
            for &v in &y[m] {
                e.add_mul(k, v);
            }
        }
        model.add_constraint(e.eq(1.0));
    }
}

/// A multicast delivers at most its bytes (rows after the capacity rows, so
/// that the duals of those keep their indices).
fn add_multicast_rows(model: &mut impl SolverModel, y: &[Vec<Variable>]) {
    for ys in y {
        let mut e = Expression::with_capacity(ys.len());
        for &v in ys {
            e.add_mul(1.0, v);
        }
        model.add_constraint(e.leq(1.0));
    }
}

/// One row per resource: `load ≤ cap · T` (phase 1, `t` given) or
/// `load ≤ cap · bound` (phase 2), added after the demand rows. Returns the
/// row index of each resource (HiGHS numbers rows in insertion order).
fn add_capacity_rows(
    model: &mut impl SolverModel,
    columns: &[Columns<'_, Variable>],
    caps: &[f64],
    t: Option<Variable>,
    bound: f64,
    nres: usize,
) -> Vec<usize> {
    let mut loads: Vec<Expression> = (0..nres).map(|_| Expression::default()).collect();
    for &(routes, x) in columns {
        for (opts, xs) in routes.iter().zip(x) {
            for (route, &v) in opts.iter().zip(xs) {
                for &(r, k) in route {
                    loads[r].add_mul(k, v);
                }
            }
        }
    }
    let first = columns.first().map_or(0, |c| c.0.len());
    for (r, mut load) in loads.into_iter().enumerate() {
        match t {
            Some(t) => {
                load.add_mul(-caps[r], t);
                model.add_constraint(load.leq(0.0));
            }
            None => {
                model.add_constraint(load.leq(caps[r] * bound));
            }
        }
    }
    (first..first + nres).collect()
}

fn check_status(sol: &impl Solution) -> Result<()> {
    match sol.status() {
        good_lp::SolutionStatus::Optimal => Ok(()),
        good_lp::SolutionStatus::TimeLimit => Err(Error::Solver(SolverFailure::TimeLimit)),
        good_lp::SolutionStatus::GapLimit => Ok(()),
    }
}

fn solver_error(e: good_lp::ResolutionError) -> Error {
    Error::Solver(match e {
        good_lp::ResolutionError::Infeasible => SolverFailure::Infeasible,
        good_lp::ResolutionError::Unbounded => SolverFailure::Unbounded,
        good_lp::ResolutionError::Other(s) => SolverFailure::Other(s.to_string()),
        good_lp::ResolutionError::Str(s) => SolverFailure::Other(s),
    })
}

/// Round an LP split (in bytes) to whole bytes that add up to `total`
/// exactly (largest remainder).
fn integral_split(total: u64, bytes: &[f64]) -> Vec<u64> {
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

/// Load of every row (in LP units) under fractions of columns (commodity
/// paths, multicast options).
fn row_loads(columns: &[Columns<'_, f64>], nres: usize) -> Vec<f64> {
    let mut loads = vec![0.0; nres];
    for &(routes, fractions) in columns {
        for (opts, fs) in routes.iter().zip(fractions) {
            for (route, &f) in opts.iter().zip(fs) {
                for &(r, k) in route {
                    loads[r] += k * f.max(0.0);
                }
            }
        }
    }
    loads
}

/// The rows an option loads, with its coefficient for the whole commodity.
type Route = Vec<(usize, f64)>;

/// Per commodity (or multicast), a value for each of its options.
type Fractions = Vec<Vec<f64>>;

/// A set of LP columns: the routes of each item's options, with a variable
/// or a value for each.
type Columns<'a, T> = (&'a [Vec<Route>], &'a [Vec<T>]);

/// The certified bound from a phase-1 solution: the better of its capacity
/// rows' duals (`duals`, one per row) and uniform prices on its saturated
/// links. Any non-negative prices give a valid bound; the duals of a
/// degenerate LP may leave one of several saturated links free, which a
/// relay-aware route then uses at no cost, and pricing every saturated link
/// alike does not.
#[allow(clippy::too_many_arguments)]
fn certify(
    problem: &Problem,
    frags: &[Fragment],
    peers: &[Vec<DeviceId>],
    rows: &[Row],
    caps: &[f64],
    duals: &[f64],
    loads: &[f64],
    t_star: f64,
) -> LowerBound {
    let cluster = problem.cluster();
    let mut links = Vec::new();
    let (mut duals_p, mut tight_p) = (Vec::new(), Vec::new());
    for (i, &r) in rows.iter().enumerate() {
        if let Row::Link(link) = r {
            links.push(link);
            duals_p.push(duals.get(i).copied().unwrap_or(0.0).abs());
            let tight = t_star > 0.0 && loads[i] >= caps[i] * t_star * (1.0 - 1e-3);
            tight_p.push(if tight { 1.0 / capacity(cluster, link) } else { 0.0 });
        }
    }
    let by_duals = certified_bound(problem, frags, peers, &links, &duals_p);
    let by_tight = certified_bound(problem, frags, peers, &links, &tight_p);
    if by_tight.seconds > by_duals.seconds {
        by_tight
    } else {
        by_duals
    }
}

/// Per-byte prices of the links a route may use, by device or NIC.
#[derive(Clone, Copy)]
struct RoutePrices<'a> {
    send: &'a [f64],
    recv: &'a [f64],
    nic_out: &'a [f64],
    nic_in: &'a [f64],
}

/// Cheapest route prices between devices, any relays included: shortest
/// paths in a compact graph with a vertex per device, one NVSwitch vertex
/// per node and one network vertex. Device a reaches device b of its node
/// through the switch (send a + recv b) and any device through the network
/// (egress of a's NIC + ingress of b's); only live devices forward. A real
/// route's price is never below its path in this graph (the network path
/// between two devices of one node is cheaper than any real route through
/// another node), so bounds priced by it stay valid.
///
/// The graph's shape makes the distances to a device `d` cheap: a device
/// off `d`'s node reaches it only through the network, so its distance is
/// its cheapest way onto the network (its own NIC, or the switch and the
/// cheapest peer's NIC: the same for every `d`) plus the network's
/// distance to `d`, which a shortest-path search over `d`'s node alone
/// gives. So the distances to all devices cost O(devices per node²), not a
/// search over the whole cluster.
struct RouteCosts<'a> {
    prices: RoutePrices<'a>,
    gpus_per_node: u32,
    nics: Vec<usize>,
    live: Vec<bool>,
    /// Cheapest way from each live device onto the network.
    onto_network: Vec<f64>,
}

/// The distances to one device: from each device of its node, and from the
/// network vertex.
struct Distances {
    node: u32,
    local: Vec<f64>,
    network: f64,
}

impl<'a> RouteCosts<'a> {
    fn new(cluster: &Cluster, prices: RoutePrices<'a>) -> RouteCosts<'a> {
        let n = cluster.num_devices();
        let gpn = cluster.gpus_per_node();
        let nics: Vec<usize> = (0..n).map(|d| cluster.nic_of(d) as usize).collect();
        let live: Vec<bool> = (0..n).map(|d| cluster.is_live(d)).collect();
        // Per node: the cheapest switch-to-network hop (recv b + egress of b's NIC).
        let through_peer: Vec<f64> = (0..cluster.nodes())
            .map(|m| {
                (m * gpn..(m + 1) * gpn)
                    .filter(|&b| live[b as usize])
                    .map(|b| prices.recv[b as usize] + prices.nic_out[nics[b as usize]])
                    .fold(f64::INFINITY, f64::min)
            })
            .collect();
        let onto_network = (0..n as usize)
            .map(|a| {
                if !live[a] {
                    return f64::INFINITY;
                }
                let peer = prices.send[a] + through_peer[a / gpn as usize];
                prices.nic_out[nics[a]].min(peer)
            })
            .collect();
        RouteCosts {
            prices,
            gpus_per_node: gpn,
            nics,
            live,
            onto_network,
        }
    }

    /// Distances to `d`: Dijkstra over `d`'s node, its switch and the network.
    fn to(&self, d: DeviceId) -> Distances {
        let g = self.gpus_per_node as usize;
        let node = d / self.gpus_per_node;
        let first = node as usize * g;
        let p = &self.prices;
        // Vertices: the node's devices 0..g, its switch g, the network g + 1.
        let (switch, network) = (g, g + 1);
        let mut dist = vec![f64::INFINITY; g + 2];
        let mut done = vec![false; g + 2];
        dist[d as usize - first] = 0.0;
        while let Some(x) = (0..g + 2)
            .filter(|&v| !done[v] && dist[v].is_finite())
            .min_by(|&a, &b| dist[a].total_cmp(&dist[b]).then(a.cmp(&b)))
        {
            done[x] = true;
            let dx = dist[x];
            let mut relax = |y: usize, w: f64| {
                if dx + w < dist[y] {
                    dist[y] = dx + w;
                }
            };
            if x < g {
                // Into a device: from the switch or from the network.
                relax(switch, p.recv[first + x]);
                relax(network, p.nic_in[self.nics[first + x]]);
            } else {
                // Into the switch or the network: from the node's live
                // devices (the network's other senders are off the node,
                // covered by `onto_network`).
                for a in (0..g).filter(|&a| self.live[first + a]) {
                    let w = if x == switch {
                        p.send[first + a]
                    } else {
                        p.nic_out[self.nics[first + a]]
                    };
                    relax(a, w);
                }
            }
        }
        Distances {
            node,
            network: dist[network],
            local: dist[..g].to_vec(),
        }
    }

    /// The cheapest route's price from `s` to the device of `dist`.
    fn from(&self, dist: &Distances, s: DeviceId) -> f64 {
        if s / self.gpus_per_node == dist.node {
            dist.local[(s % self.gpus_per_node) as usize]
        } else {
            self.onto_network[s as usize] + dist.network
        }
    }
}

/// A lower bound on the makespan of every plan, by weak duality.
///
/// For any prices `y ≥ 0` on the resources, normalised so that
/// `Σ_r cap_r · y_r = 1`, and any plan with loads `L_r`:
/// `T ≥ max_r L_r / cap_r ≥ Σ_r y_r · L_r = Σ_copies bytes · price(route)`
/// `≥ Σ_f bytes(f) · u(f)`, where `u(f)` is at most the price of every
/// route a plan may deliver a byte of fragment `f` by: a local copy, a
/// direct copy, a copy through any list of relays (shortest paths), or a
/// share of a multicast. A multicast from holder `s` through leader `ℓ` to
/// the set `S` of devices of one node costs `P(s→ℓ) + Σ_{e∈S∖ℓ} (send ℓ +
/// recv e)` per byte for all of `S`; giving each member at most the
/// cheapest such cost divided by `|S|`, over every `S` it may share with
/// (its [`crate::cost::multicast_peers`]), keeps `Σ_{d∈S} u ≤ cost` for
/// every multicast a plan can make. The bound is therefore valid whatever
/// the solver's accuracy; with the optimal prices of the phase-1 LP (whose
/// paths include the relays column generation found worth having) it
/// equals the LP's optimum when no multicast is involved.
pub fn certified_bound(
    problem: &Problem,
    frags: &[Fragment],
    peers: &[Vec<DeviceId>],
    resources: &[Resource],
    prices: &[f64],
) -> LowerBound {
    let cluster = problem.cluster();
    let norm: f64 = resources
        .iter()
        .zip(prices)
        .map(|(&r, &y)| capacity(cluster, r) * y)
        .sum();
    if !(norm > 0.0 && norm.is_finite()) {
        return LowerBound {
            seconds: 0.0,
            reason: "LP prices are all zero".into(),
        };
    }
    // Prices per resource kind, in arrays indexed by device or NIC.
    let n = cluster.num_devices() as usize;
    let nics = (cluster.nodes() * cluster.nics_per_node()) as usize;
    let (mut send, mut recv, mut mem) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    let (mut nic_out, mut nic_in) = (vec![0.0; nics], vec![0.0; nics]);
    for (&r, &y) in resources.iter().zip(prices) {
        let y = y / norm;
        match r {
            Resource::Send(d) => send[d as usize] = y,
            Resource::Recv(d) => recv[d as usize] = y,
            Resource::Memory(d) => mem[d as usize] = y,
            Resource::NicOut(i) => nic_out[i as usize] = y,
            Resource::NicIn(i) => nic_in[i as usize] = y,
            // Message issue is not a flow resource: the issue bound covers it.
            Resource::Issue(_) => {}
        }
    }
    let routes = RouteCosts::new(
        cluster,
        RoutePrices {
            send: &send,
            recv: &recv,
            nic_out: &nic_out,
            nic_in: &nic_in,
        },
    );
    let mut cache: BTreeMap<DeviceId, Distances> = BTreeMap::new();
    // Cheapest route from any of `holders` to `d`.
    let mut reach = |d: DeviceId, holders: &[DeviceId]| -> f64 {
        let dist = cache.entry(d).or_insert_with(|| routes.to(d));
        holders
            .iter()
            .map(|&s| if s == d { mem[s as usize] } else { routes.from(dist, s) })
            .fold(f64::INFINITY, f64::min)
    };
    // Fragments with the same destination, holders and peers price alike.
    let mut bytes: BTreeMap<(DeviceId, &[DeviceId], &[DeviceId]), u64> = BTreeMap::new();
    for (f, p) in frags.iter().zip(peers) {
        *bytes.entry((f.dst, &f.holders, p)).or_default() += f.bytes;
    }
    let mut total = 0.0;
    for ((d, holders, peers), b) in bytes {
        let mut u = reach(d, holders);
        if !peers.is_empty() {
            // The cheapest multicast share of d: over every leader of d's
            // node, the best ratio of cost to members, the members being d
            // and the leader's cheapest forwards (a prefix of them sorted).
            let forward = |l: DeviceId, e: DeviceId| send[l as usize] + recv[e as usize];
            for &l in std::iter::once(&d).chain(peers) {
                let (mut cost, mut size) = (reach(l, holders), 1.0);
                if l != d {
                    cost += forward(l, d);
                    size += 1.0;
                    u = u.min(cost / size);
                }
                let mut hops: Vec<f64> = std::iter::once(d)
                    .chain(peers.iter().copied())
                    .filter(|&e| e != l && e != d)
                    .map(|e| forward(l, e))
                    .collect();
                hops.sort_by(f64::total_cmp);
                for h in hops {
                    cost += h;
                    size += 1.0;
                    u = u.min(cost / size);
                }
            }
        }
        total += b as f64 * u;
    }
    LowerBound {
        seconds: total,
        reason: "LP dual prices (weak duality, relays and multicasts included)".into(),
    }
}

/// The LP lower bound of a problem together with the trivial one: the larger
/// of the two, both valid for every plan.
pub fn lower_bound(problem: &Problem) -> Result<LowerBound> {
    lower_bound_below(problem, f64::INFINITY)
}

/// How close the trivial bound must come to a known plan's load for the LP
/// bound to be skipped, as a fraction of that load.
pub const BOUND_SLACK: f64 = 1e-3;

/// [`lower_bound`] given the load `upper_s` of some valid plan (its busiest
/// resource, in seconds): no bound can exceed it, so when the trivial bound
/// is within [`BOUND_SLACK`] of it the LP (seconds at thousands of GPUs)
/// could raise the bound by less than that and is not solved. The result is
/// always a valid bound, within `BOUND_SLACK` of what [`lower_bound`] gives.
pub fn lower_bound_below(problem: &Problem, upper_s: f64) -> Result<LowerBound> {
    let frags = fragments(problem)?;
    let trivial = crate::trivial_lower_bound(problem, &frags);
    if trivial.seconds >= upper_s * (1.0 - BOUND_SLACK) {
        return Ok(trivial);
    }
    let comms = commodities(&frags);
    // Interior-point duals sit inside the optimal face, where the simplex
    // method's vertex duals often price all but one bottleneck at zero: the
    // bound they certify is far tighter.
    let lp = LpPlanner::builder()
        .interior_point()
        .build()
        .run(problem, &frags, &comms, Phases::BoundOnly)?
        .bound
        .expect("asked for the bound");
    Ok(if lp.seconds >= trivial.seconds { lp } else { trivial })
}

impl Planner for LpPlanner {
    fn name(&self) -> &'static str {
        match self.placement {
            Placement::Fixed => "lp",
            Placement::Optimize => "lp-placed",
        }
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        let placed;
        let problem = match self.placement {
            Placement::Fixed => problem,
            Placement::Optimize => {
                placed = crate::placement::optimize_placement(problem)?.0;
                &placed
            }
        };
        let frags = fragments(problem)?;
        let comms = commodities(&frags);
        let solution = self.run(problem, &frags, &comms, Phases::PlanOnly)?;
        let mut copies = Vec::new();
        // Elements of each fragment delivered by multicasts (a prefix).
        let mut start = vec![0u64; frags.len()];
        for (m, split) in solution.multicasts.iter().zip(&solution.multicast_split) {
            multicast_copies(problem, &frags, m, split, &mut start, &mut copies);
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
            disaggregate(problem, &frags, &start, c, paths, &split, &mut copies);
        }
        Ok(crate::schedule::finish(self.name(), problem, copies))
    }
}

/// Split a commodity's fragments among its holders so that holder `i` sends
/// `split[i]` bytes, up to one element. Holders with the smallest quotas are
/// served first, from the largest fragments, so that a minor source sends a
/// few large messages rather than many small ones; a fragment is cut in its
/// own row-major order (at most 2·ndim−1 boxes per side of a cut).
fn disaggregate(
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
    order.sort_by_key(|&i| (std::cmp::Reverse(left(i)), i));
    let last = quotas.len() - 1;
    let mut q = 0;
    let mut pieces: Vec<(usize, Copy)> = Vec::new();
    for (rank, &fi) in order.iter().enumerate() {
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
                    pieces.push((rank, f.copy(path.src, path.via.clone(), region)));
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
    let position: BTreeMap<usize, usize> = order.iter().enumerate().map(|(r, &fi)| (r, fi)).collect();
    pieces.sort_by_key(|(rank, _)| position[rank]);
    out.extend(pieces.into_iter().map(|(_, copy)| copy));
}

/// Emit a multicast's copies: option `k` carries `split[k]` bytes, up to
/// one element, taken from the front of its boxes in order; the last entry
/// of `split` is left to unicast. Records in `start` how many elements of
/// each member's fragment the multicast delivered.
fn multicast_copies(
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

#[cfg(test)]
mod tests {
    use super::{integral_split, RouteCosts, RoutePrices};
    use crate::OrdF64;
    use tenplan_ptc::{Cluster, DeviceId};

    /// The whole compact graph searched from `d` (what [`RouteCosts`] shortcuts).
    fn dijkstra(cluster: &Cluster, p: RoutePrices<'_>, d: DeviceId) -> Vec<f64> {
        let n = cluster.num_devices() as usize;
        let gpn = cluster.gpus_per_node();
        let nodes = cluster.nodes() as usize;
        let core = n + nodes;
        let mut dist = vec![f64::INFINITY; n + nodes + 1];
        let mut heap = std::collections::BinaryHeap::new();
        dist[d as usize] = 0.0;
        heap.push(std::cmp::Reverse((OrdF64(0.0), d as usize)));
        while let Some(std::cmp::Reverse((OrdF64(dx), x))) = heap.pop() {
            if dx > dist[x] {
                continue;
            }
            let mut relax = |y: usize, w: f64| {
                if dx + w < dist[y] {
                    dist[y] = dx + w;
                    heap.push(std::cmp::Reverse((OrdF64(dx + w), y)));
                }
            };
            if x < n {
                let b = x as DeviceId;
                relax(n + (b / gpn) as usize, p.recv[x]);
                relax(core, p.nic_in[cluster.nic_of(b) as usize]);
            } else if x < core {
                let node = (x - n) as u32;
                for a in (node * gpn..(node + 1) * gpn).filter(|&a| cluster.is_live(a)) {
                    relax(a as usize, p.send[a as usize]);
                }
            } else {
                for a in (0..n as DeviceId).filter(|&a| cluster.is_live(a)) {
                    relax(a as usize, p.nic_out[cluster.nic_of(a) as usize]);
                }
            }
        }
        dist.truncate(n);
        dist
    }

    #[test]
    fn route_costs_equal_a_search_of_the_whole_graph() {
        let mut seed = 7u64;
        let mut next = || {
            seed = tenplan_ptc::rng::mix(seed.wrapping_add(0x9e37_79b9_7f4a_7c15));
            seed
        };
        for spec in ["3x4", "4x8", "2x1", "5x8"] {
            let mut cluster = Cluster::parse(spec).unwrap();
            let n = cluster.num_devices();
            cluster = cluster.with_dead([next() as u32 % n]).unwrap();
            let nics = (cluster.nodes() * cluster.nics_per_node()) as usize;
            for _ in 0..20 {
                // Some prices zero, the rest spread over three orders of magnitude.
                let mut price = |len: usize| -> Vec<f64> {
                    (0..len)
                        .map(|_| match next() % 4 {
                            0 => 0.0,
                            k => (next() % 1000) as f64 * 10f64.powi(k as i32 - 3),
                        })
                        .collect()
                };
                let (send, recv) = (price(n as usize), price(n as usize));
                let (nic_out, nic_in) = (price(nics), price(nics));
                let p = RoutePrices {
                    send: &send,
                    recv: &recv,
                    nic_out: &nic_out,
                    nic_in: &nic_in,
                };
                let routes = RouteCosts::new(&cluster, p);
                for d in 0..n {
                    let want = dijkstra(&cluster, p, d);
                    let dist = routes.to(d);
                    for s in (0..n).filter(|&s| s != d) {
                        let got = routes.from(&dist, s);
                        let w = want[s as usize];
                        assert!(
                            (got == w) || (got - w).abs() <= 1e-9 * w.abs().max(1.0),
                            "{spec}: {s} -> {d}: {got} vs {w}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn splits_add_up_exactly() {
        assert_eq!(integral_split(10, &[3.0, 7.0]), vec![3, 7]);
        assert_eq!(integral_split(10, &[0.0, 0.0]), vec![10, 0]);
        let s = integral_split(1001, &[330.0, 330.0, 340.0]);
        assert_eq!(s.iter().sum::<u64>(), 1001);
    }
}
