//! The LP's columns: the paths a commodity may take (direct or relayed)
//! and the options of a multicast, the rows each loads, where column
//! generation starts, and how it prices new columns in.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use rayon::prelude::*;

use tenplan_ptc::{Cluster, DeviceId, FabricLink};

use super::certify::{RoutePrices, SwitchPaths};
use super::commodities::{Commodity, Multicast};
use super::model::{capacities, row_loads, traffic_weight, Fractions, LpData, Phase1, Route};
use super::{Resources, Row, Units};
use crate::cost::{hop, Resource};

/// The rows one multicast option loads, for the whole multicast: the hop
/// from the holder to the leader, and from the leader to every other member.
pub(super) fn multicast_route(
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

/// Rounds of column generation for relayed paths.
pub(super) const MAX_RELAY_ROUNDS: usize = 6;

/// Rounds of column generation towards the bound's duals (on a fabric).
pub(super) const MAX_BOUND_ROUNDS: usize = 40;

/// One way to deliver a commodity: from a holder, directly or relayed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Path {
    /// The holder that sends.
    pub src: DeviceId,
    /// The devices that forward, in order (empty: direct).
    pub via: Vec<DeviceId>,
}

impl Path {
    /// The devices the data visits on its way to `dst`.
    pub(super) fn stops(&self, dst: DeviceId) -> Vec<DeviceId> {
        std::iter::once(self.src)
            .chain(self.via.iter().copied())
            .chain(std::iter::once(dst))
            .collect()
    }
}

/// Row prices in dense arrays (devices, NICs), for pricing columns: a round
/// of column generation looks up millions of prices.
pub(super) struct DensePrices {
    pub(super) send: Vec<f64>,
    pub(super) recv: Vec<f64>,
    pub(super) mem: Vec<f64>,
    pub(super) issue: Vec<f64>,
    pub(super) nic_out: Vec<f64>,
    pub(super) nic_in: Vec<f64>,
    /// Per switch of the fabric: its uplink and downlink.
    pub(super) up: Vec<f64>,
    pub(super) down: Vec<f64>,
    /// Cheapest ways between switches, bridges included (on a fabric).
    paths: Option<SwitchPaths>,
}

/// The cheapest ways out of (or into) a node through each switch its NICs
/// attach to: (switch, cost, the device whose NIC is used). Without a
/// fabric, one way with no switch.
pub(super) type Ways = Vec<(Option<u32>, f64, DeviceId)>;

impl DensePrices {
    /// Prices by device, NIC and switch; with `bridges`, also the cheapest
    /// ways between switches (see [`SwitchPaths`]), which only relayed
    /// paths on a fabric need.
    pub(super) fn new(cluster: &Cluster, rows: &[Row], price: &[f64], bridges: bool) -> DensePrices {
        let n = cluster.num_devices() as usize;
        let nics = (cluster.nodes() * cluster.nics_per_node()) as usize;
        let mut p = DensePrices {
            send: vec![0.0; n],
            recv: vec![0.0; n],
            mem: vec![0.0; n],
            issue: vec![0.0; n],
            nic_out: vec![0.0; nics],
            nic_in: vec![0.0; nics],
            up: vec![0.0; cluster.num_switches() as usize],
            down: vec![0.0; cluster.num_switches() as usize],
            paths: None,
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
                Row::Link(Resource::SwitchUp(s)) => p.up[s as usize] = y,
                Row::Link(Resource::SwitchDown(s)) => p.down[s as usize] = y,
            }
        }
        if bridges && cluster.has_fabric() {
            let prices = RoutePrices {
                send: &p.send,
                recv: &p.recv,
                nic_out: &p.nic_out,
                nic_in: &p.nic_in,
                up: &p.up,
                down: &p.down,
            };
            p.paths = Some(SwitchPaths::new(cluster, &prices));
        }
        p
    }

    /// Price per byte of the cheapest way between two switches, bridges
    /// included (see [`SwitchPaths`]).
    pub(super) fn bridged(&self, a: Option<u32>, b: Option<u32>) -> f64 {
        match (&self.paths, a, b) {
            (Some(p), Some(a), Some(b)) => p.between(a, b),
            _ => 0.0,
        }
    }

    /// Price per byte of the switch links between two switches.
    pub(super) fn between(&self, cluster: &Cluster, a: Option<u32>, b: Option<u32>) -> f64 {
        let (Some(a), Some(b)) = (a, b) else { return 0.0 };
        let mut sum = 0.0;
        cluster.fabric_walk(a, b, |l| {
            sum += match l {
                FabricLink::Up(s) => self.up[s as usize],
                FabricLink::Down(s) => self.down[s as usize],
            }
        });
        sum
    }

    /// Price per byte of the switch links between two NICs.
    fn fabric(&self, cluster: &Cluster, a: u32, b: u32) -> f64 {
        if !cluster.has_fabric() {
            return 0.0;
        }
        self.between(cluster, cluster.switch_of_nic(a), cluster.switch_of_nic(b))
    }

    /// Price of a whole path to `dst` (links and message issue), hop by hop.
    pub(super) fn path(&self, cluster: &Cluster, p: &Path, dst: DeviceId, bytes: f64, issue: f64) -> f64 {
        p.stops(dst)
            .windows(2)
            .map(|h| self.direct(cluster, h[0], h[1], bytes, issue))
            .sum()
    }

    /// The cheapest way into `dst`'s node through each switch (see
    /// [`Ways`]): its own NIC or a peer's (the peer's NIC, a forward, an
    /// intra-node hop).
    pub(super) fn ways_in(&self, cluster: &Cluster, dst: DeviceId, bytes: f64, issue: f64) -> Ways {
        if !cluster.has_fabric() {
            let (c, v) = self.way_in(cluster, dst, bytes, issue);
            return vec![(None, c, v)];
        }
        let g = cluster.gpus_per_node();
        let node = cluster.node_of(dst);
        let mut ways: Ways = Vec::new();
        let own = self.nic_in[cluster.nic_of(dst) as usize] * bytes;
        keep_cheapest(&mut ways, cluster.switch_of_nic(cluster.nic_of(dst)), own, dst);
        for v in (node * g..(node + 1) * g).filter(|&v| v != dst && cluster.is_live(v)) {
            let c = (self.nic_in[cluster.nic_of(v) as usize] + self.send[v as usize] + self.recv[dst as usize]) * bytes
                + self.issue[v as usize] * issue;
            keep_cheapest(&mut ways, cluster.switch_of_nic(cluster.nic_of(v)), c, v);
        }
        ways
    }

    /// Price of the direct path from `src` to `dst`.
    pub(super) fn direct(&self, cluster: &Cluster, src: DeviceId, dst: DeviceId, bytes: f64, issue: f64) -> f64 {
        let (s, d) = (src as usize, dst as usize);
        let links = if src == dst {
            self.mem[s]
        } else if cluster.node_of(src) == cluster.node_of(dst) {
            self.send[s] + self.recv[d]
        } else {
            let (a, b) = (cluster.nic_of(src), cluster.nic_of(dst));
            self.nic_out[a as usize] + self.nic_in[b as usize] + self.fabric(cluster, a, b)
        };
        links * bytes + self.issue[s] * issue
    }

    /// The cheapest way out of `src`'s node: through its own NIC, or
    /// through a peer's (an intra-node hop, a forward, the peer's NIC).
    pub(super) fn way_out(&self, cluster: &Cluster, src: DeviceId, bytes: f64, issue: f64) -> (f64, DeviceId) {
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
    pub(super) fn way_in(&self, cluster: &Cluster, dst: DeviceId, bytes: f64, issue: f64) -> (f64, DeviceId) {
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

/// Per node, per switch of its NICs: the cheapest and second cheapest
/// forwarding peer (receive, NIC out, issue) under one commodity's sizes,
/// so that a holder's way out through a peer costs O(switches), not
/// O(devices per node).
#[derive(Default)]
pub(super) struct OutWays {
    key: (f64, f64),
    nodes: BTreeMap<u32, Vec<PeerWays>>,
}

/// A node's two cheapest forwarding peers (cost, device) through one switch.
#[derive(Clone, Copy)]
pub(super) struct PeerWays {
    switch: Option<u32>,
    first: (f64, DeviceId),
    second: (f64, DeviceId),
}

/// The cheapest relayed path found so far: its cost, its holder, the peer
/// whose NIC it leaves by and that NIC's switch, the peer whose NIC it
/// enters by and that NIC's switch.
struct RelayChoice {
    cost: f64,
    src: DeviceId,
    out: (DeviceId, Option<u32>),
    inn: (DeviceId, Option<u32>),
}

/// The cheapest way from a switch into a destination: its cost, the
/// switch it enters the destination's node by, and the device whose NIC.
type Entry = (f64, Option<u32>, DeviceId);

impl DensePrices {
    /// The cheapest relayed path to `dst` from any of `holders` (all off
    /// `dst`'s node), as [`cheapest_relay_path`] finds per holder, in
    /// O(holders · switches per node + switches per node²).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn cheapest_relay_from(
        &self,
        cluster: &Cluster,
        cache: &mut OutWays,
        holders: &[DeviceId],
        dst: DeviceId,
        inn: &Ways,
        bytes: f64,
        issue: f64,
    ) -> Option<(f64, Path)> {
        if cache.key != (bytes, issue) {
            cache.key = (bytes, issue);
            cache.nodes.clear();
        }
        // The cheapest way from each switch into dst (bridges included).
        let mut into: BTreeMap<Option<u32>, Entry> = BTreeMap::new();
        let mut into_from = |t: Option<u32>| -> Entry {
            *into.entry(t).or_insert_with(|| {
                inn.iter()
                    .map(|&(si, ci, w)| (ci + self.bridged(t, si) * bytes, si, w))
                    .fold((f64::INFINITY, None, dst), |a, b| if b.0 < a.0 { b } else { a })
            })
        };
        let g = cluster.gpus_per_node();
        let mut best: Option<RelayChoice> = None;
        for &src in holders {
            let node = cluster.node_of(src);
            let ways = cache.nodes.entry(node).or_insert_with(|| {
                let mut w: Vec<PeerWays> = Vec::new();
                for v in (node * g..(node + 1) * g).filter(|&v| cluster.is_live(v)) {
                    let nic = cluster.nic_of(v);
                    let c =
                        (self.recv[v as usize] + self.nic_out[nic as usize]) * bytes + self.issue[v as usize] * issue;
                    let sw = cluster.switch_of_nic(nic);
                    match w.iter_mut().find(|e| e.switch == sw) {
                        Some(e) if c < e.first.0 => {
                            e.second = e.first;
                            e.first = (c, v);
                        }
                        Some(e) if c < e.second.0 => e.second = (c, v),
                        Some(_) => {}
                        None => w.push(PeerWays {
                            switch: sw,
                            first: (c, v),
                            second: (f64::INFINITY, v),
                        }),
                    }
                }
                w
            });
            let base = self.issue[src as usize] * issue;
            let own_nic = cluster.nic_of(src);
            let own_sw = cluster.switch_of_nic(own_nic);
            let mut consider = |cost: f64, v: DeviceId, t: Option<u32>, into: Entry| {
                let total = base + cost + into.0;
                if best.as_ref().is_none_or(|b| total < b.cost) {
                    best = Some(RelayChoice {
                        cost: total,
                        src,
                        out: (v, t),
                        inn: (into.2, into.1),
                    });
                }
            };
            consider(self.nic_out[own_nic as usize] * bytes, src, own_sw, into_from(own_sw));
            for e in ways.iter() {
                let (c, v) = if e.first.1 == src { e.second } else { e.first };
                if c.is_finite() {
                    consider(self.send[src as usize] * bytes + c, v, e.switch, into_from(e.switch));
                }
            }
        }
        let RelayChoice {
            cost,
            src,
            out: (v, so),
            inn: (w, si),
        } = best?;
        let bridges = match (&self.paths, so, si) {
            (Some(p), Some(a), Some(b)) => p.relays(a, b),
            _ => Vec::new(),
        };
        let mut via: Vec<DeviceId> = std::iter::once(v)
            .chain(bridges)
            .chain(std::iter::once(w))
            .filter(|&x| x != src && x != dst)
            .collect();
        via.dedup();
        Some((cost, Path { src, via }))
    }
}

/// Keep the cheapest way per switch (the first of equal ones).
fn keep_cheapest(ways: &mut Ways, switch: Option<u32>, cost: f64, v: DeviceId) {
    match ways.iter_mut().find(|w| w.0 == switch) {
        Some(w) if cost < w.1 => *w = (switch, cost, v),
        Some(_) => {}
        None => ways.push((switch, cost, v)),
    }
}

/// The cheapest path from `src` to `dst` on another node under row prices,
/// given the cheapest way into `dst`'s node (`inn`, from
/// [`DensePrices::way_in`], the same for every holder), on a network
/// without a fabric ([`DensePrices::cheapest_relay_from`] prices fabrics).
///
/// Under the cost model a relay on a third node only adds NIC traffic, and a
/// second intra-node hop only adds link traffic, so the cheapest route has at
/// most two relays: a peer on the source's node (to use its NIC) and a peer
/// on the destination's node. Their costs separate, so each side is chosen
/// on its own in O(devices per node).
pub(super) fn cheapest_relay_path(
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
pub(super) fn initial_holders(cluster: &Cluster, comms: &[Commodity]) -> Vec<Vec<DeviceId>> {
    // Per holder list (by address: commodities share their fragments'
    // lists), its positions by node and its slot in `turns`; lists with the
    // same holders share a slot. Replicated state at 16,384 GPUs has lists
    // of thousands of holders (Llama 3.1 405B: 82k commodities, 306M
    // holders in all), which a pass per commodity would read in full.
    let mut lists: FxHashMap<*const DeviceId, (ByNode, usize)> = FxHashMap::default();
    let mut slots: BTreeMap<&[DeviceId], usize> = BTreeMap::new();
    let mut turns: Vec<usize> = Vec::new();
    comms
        .iter()
        .map(|c| {
            let n = c.holders.len();
            if n <= INITIAL_HOLDERS {
                return c.holders.to_vec();
            }
            let (by_node, slot) = lists.entry(c.holders.as_ptr()).or_insert_with(|| {
                let mut by_node: ByNode = (0..n as u32)
                    .map(|p| (cluster.node_of(c.holders[p as usize]), p))
                    .collect();
                by_node.sort_unstable();
                let slot = *slots.entry(&c.holders).or_insert_with(|| {
                    turns.push(0);
                    turns.len() - 1
                });
                (by_node, slot)
            });
            // The holders on the destination's node, in holder order.
            let node = cluster.node_of(c.dst);
            let at = by_node.partition_point(|&(m, _)| m < node);
            let near: Vec<u32> = by_node[at..]
                .iter()
                .take_while(|&&(m, _)| m == node)
                .map(|&(_, p)| p)
                .collect();
            let mut start: Vec<DeviceId> = near.iter().map(|&p| c.holders[p as usize]).collect();
            let far = n - near.len();
            if far > 0 {
                let first = turns[*slot] * INITIAL_HOLDERS;
                turns[*slot] += 1;
                // The m-th holder off the node: skip the near positions
                // (ascending) at or before it.
                start.extend((0..INITIAL_HOLDERS.min(far)).map(|j| {
                    let mut p = (first + j) % far;
                    for &q in &near {
                        if q as usize <= p {
                            p += 1;
                        }
                    }
                    c.holders[p]
                }));
            }
            start
        })
        .collect()
}

/// A holder list's (node, position) pairs, ascending.
type ByNode = Vec<(u32, u32)>;

/// Multicast options (one per holder and leader) above which each
/// multicast keeps a block of [`INITIAL_HOLDERS`] holders. Replicated state
/// on every data-parallel rank with tensor parallelism 1 (DeepSeek-V3's
/// attention and dense layers) gives multicasts hundreds of holders: at
/// 4,096 GPUs 650k of the LP's 728k columns, at 16,384 GPUs more than the
/// machine's memory. Every LP of the paper and large suites has under 10k.
pub(super) const MULTICAST_OPTIONS_MAX: usize = 50_000;

/// Keep each multicast's holders to a block of [`INITIAL_HOLDERS`], the
/// multicasts with the same holders taking consecutive blocks in turn (as
/// [`initial_holders`] does for commodities), so that the sending stays
/// spread over the replicas. Plans stay exact; the bound still prices
/// every multicast a plan could make.
fn restrict_multicasts(mcasts: &mut [Multicast]) {
    let mut turn: BTreeMap<Vec<DeviceId>, usize> = BTreeMap::new();
    for m in mcasts.iter_mut().filter(|m| m.holders.len() > INITIAL_HOLDERS) {
        let k = turn.entry(m.holders.clone()).or_insert(0);
        let first = *k * INITIAL_HOLDERS;
        *k += 1;
        let n = m.holders.len();
        m.holders = (0..INITIAL_HOLDERS).map(|j| m.holders[(first + j) % n]).collect();
    }
}

/// Direct paths (one per commodity and holder) above which commodities
/// start from [`initial_holders`]: below, the LP takes every holder at once.
const RESTRICT_ABOVE: usize = 50_000;

/// Whether the LP of these commodities starts restricted (from a few
/// holders each, see [`RESTRICT_ABOVE`]), which asks for the cut bound as
/// its floor.
pub(super) fn starts_restricted(comms: &[Commodity]) -> bool {
    comms.iter().map(|c| c.holders.len()).sum::<usize>() > RESTRICT_ABOVE
}

/// Off-node holders a commodity starts with (see [`initial_holders`]).
pub(super) const INITIAL_HOLDERS: usize = 8;

/// The rows a path loads, for a whole commodity.
pub(super) fn route_of(cluster: &Cluster, c: &Commodity, p: &Path, units: Units, res: &mut Resources) -> Route {
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

/// The restricted master LP of column generation: the paths each commodity
/// may take so far, the multicasts' options, and the rows they load.
pub(super) struct RestrictedLp {
    pub(super) units: Units,
    /// The fastest link's bandwidth (capacities are relative to it).
    pub(super) fastest: f64,
    pub(super) res: Resources,
    pub(super) paths: Vec<Vec<Path>>,
    pub(super) routes: Vec<Vec<Route>>,
    pub(super) mcasts: Vec<Multicast>,
    pub(super) mroutes: Vec<Vec<Route>>,
    /// What each multicast delivers to a commodity, as a fraction of it.
    pub(super) shares: Vec<Vec<(usize, f64)>>,
    /// Phase 2's traffic cost of every path and every multicast option.
    pub(super) costs: Vec<Vec<f64>>,
    pub(super) mcosts: Vec<Vec<f64>>,
    /// Commodities sent whole along their one path, outside the LP.
    pub(super) pinned: Vec<bool>,
    /// Load of the pinned commodities on every row.
    pub(super) fixed: Vec<f64>,
    /// Whether some commodity started without all of its holders.
    pub(super) restricted: bool,
    /// Switch rows that a solve without the fabric's switch links found
    /// overloaded, and so keeps (see `LpPlanner::phase1_off_fabric`).
    pub(super) binding_switches: Vec<usize>,
}

impl RestrictedLp {
    /// Direct paths from a few holders (all of them where there are few);
    /// column generation prices the others in. On large problems, tiny
    /// commodities are pinned (see [`pin`]) given `floor_s`, a lower bound
    /// on the makespan; it is computed only then.
    pub(super) fn start(
        cluster: &Cluster,
        comms: &[Commodity],
        mcasts: Vec<Multicast>,
        floor_s: impl FnOnce() -> f64,
    ) -> RestrictedLp {
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
        let restrict = starts_restricted(comms);
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
        let mut mcasts = mcasts;
        let options: usize = mcasts.iter().map(|m| m.holders.len() * m.members.len()).sum();
        if options > MULTICAST_OPTIONS_MAX {
            restrict_multicasts(&mut mcasts);
        }
        let mroutes: Vec<Vec<Route>> = mcasts
            .iter()
            .map(|m| {
                m.options()
                    .map(|(src, k)| multicast_route(cluster, m, src, k, units, &mut res))
                    .collect()
            })
            .collect();
        let mut shares: Vec<Vec<(usize, f64)>> = vec![Vec::new(); comms.len()];
        for (mi, m) in mcasts.iter().enumerate() {
            for &ci in &m.commodities {
                shares[ci].push((mi, m.bytes as f64 / comms[ci].bytes as f64));
            }
        }
        let mut fixed = vec![0.0; res.list.len()];
        let pinned = if restrict {
            let floor = floor_s() / units.seconds;
            let caps = capacities(cluster, &res.list, fastest);
            pin(comms, &shares, &caps, floor, &mut paths, &mut routes, &mut fixed)
        } else {
            vec![false; comms.len()]
        };
        let costs = comms
            .iter()
            .zip(&paths)
            .map(|(c, ps)| ps.iter().map(|p| path_cost(cluster, c, p, units)).collect())
            .collect();
        let mcosts = mcasts.iter().map(|m| multicast_costs(cluster, m, units)).collect();
        RestrictedLp {
            units,
            fastest,
            res,
            paths,
            routes,
            mcasts,
            mroutes,
            shares,
            costs,
            mcosts,
            pinned,
            fixed,
            restricted,
            binding_switches: Vec::new(),
        }
    }

    /// For each direct path from a holder off the destination's node and
    /// its rail switch, the same path relayed through the GPU of the
    /// holder's node on the destination's rail (the same local index), where
    /// the commodity lacks it. On a rail-optimized fabric such a relay keeps
    /// the transfer on one rail (an NVLink hop, then the rail), which the
    /// dual prices find one commodity at a time: DeepSeek-V3's experts
    /// changing rails at 1,024 GPUs took 25 rounds of column generation from
    /// 56% above the cuts.
    pub(super) fn rail_relays(&self, cluster: &Cluster, comms: &[Commodity]) -> Vec<(usize, Path)> {
        let g = cluster.gpus_per_node();
        let mut out = Vec::new();
        for (ci, (c, paths)) in comms.iter().zip(&self.paths).enumerate() {
            if self.pinned[ci] {
                continue;
            }
            let rail = cluster.switch_of_nic(cluster.nic_of(c.dst));
            for p in paths.iter().filter(|p| p.via.is_empty()) {
                let h = p.src;
                let node = cluster.node_of(h);
                if node == cluster.node_of(c.dst) || cluster.switch_of_nic(cluster.nic_of(h)) == rail {
                    continue;
                }
                let v = node * g + c.dst % g;
                let relayed = Path { src: h, via: vec![v] };
                if v != h && cluster.is_live(v) && !paths.contains(&relayed) {
                    out.push((ci, relayed));
                }
            }
        }
        out
    }

    /// The load every row carries whatever the LP splits: the pinned
    /// commodities', and for each commodity (with no multicast share) what
    /// every one of its columns puts on a row, at the least of their
    /// coefficients there. A row whose forced load exceeds its capacity
    /// times a makespan proves the LP infeasible at that makespan.
    pub(super) fn forced_loads(&self) -> Vec<f64> {
        let mut forced = self.fixed.clone();
        for (routes, share) in self.routes.iter().zip(&self.shares) {
            let Some((first, rest)) = routes.split_first() else {
                continue;
            };
            if !share.is_empty() {
                continue;
            }
            // A route may load a row twice (hops through one link): what a
            // column puts on a row is the sum of its entries there.
            let on = |route: &Route, r: usize| -> f64 { route.iter().filter(|e| e.0 == r).map(|e| e.1).sum() };
            for (i, &(r, _)) in first.iter().enumerate() {
                if first[..i].iter().any(|e| e.0 == r) {
                    continue;
                }
                forced[r] += rest.iter().fold(on(first, r), |least, o| least.min(on(o, r)));
            }
        }
        forced
    }

    /// Relays into the destination's node through a sibling GPU's NIC, for
    /// the commodities every column of which enters through their
    /// destination's NIC where its forced load (see
    /// [`RestrictedLp::forced_loads`]) is past `floor` (LP units): the cuts
    /// count a node's ingress over all of its NICs, and the GPUs of a node
    /// need unequal shares. GPT-3 175B's ZeRO-1 shards on 16,384 GPUs of
    /// the flat network left 5,682 NICs 0.12% above the cuts, which the
    /// dual prices relieve one NIC per round. Each such commodity gets one
    /// relay: from its first off-node holder, through the siblings whose
    /// own NIC is not crowded, in turn. A flat network only: on a
    /// rail-optimized fabric a sibling's NIC sits on another rail, and
    /// there (the 2:1 fabric's ZeRO-1 row) every rail of the crowded pods
    /// is as crowded.
    pub(super) fn ingress_relays(
        &self,
        cluster: &Cluster,
        comms: &[Commodity],
        caps: &[f64],
        floor: f64,
    ) -> Vec<(usize, Path)> {
        let g = cluster.gpus_per_node();
        if cluster.has_fabric() || cluster.nics_per_node() != g || g < 2 || !(floor > 0.0 && floor.is_finite()) {
            return Vec::new();
        }
        // What must enter each NIC whatever the split (`forced_loads`);
        // a NIC crowded by that alone, and whether a relay's hop enters one.
        let forced = self.forced_loads();
        let row_of = |res: Resource| self.res.ids.get(&Row::Link(res)).copied().filter(|&r| r < caps.len());
        let nic_in = |d: DeviceId| row_of(Resource::NicIn(cluster.nic_of(d)));
        let crowded = |r: usize| forced[r] > caps[r] * floor;
        let crowded_on = |a: DeviceId, z: DeviceId| {
            hop(cluster, a, z)
                .into_iter()
                .any(|res| matches!(res, Resource::NicIn(_)) && row_of(res).is_some_and(crowded))
        };
        let mut out = Vec::new();
        let mut turn = vec![0u32; cluster.num_devices() as usize];
        for (ci, (c, routes)) in comms.iter().zip(&self.routes).enumerate() {
            let node = cluster.node_of(c.dst);
            // Commodities every column of which enters through their
            // destination's NIC (no holder on its node, no multicast share).
            let Some(r) = nic_in(c.dst) else {
                continue;
            };
            if routes.is_empty()
                || !self.shares[ci].is_empty()
                || self.paths[ci].iter().any(|p| cluster.node_of(p.src) == node)
                || !routes.iter().all(|o| o.iter().any(|e| e.0 == r))
                || !crowded(r)
            {
                continue;
            }
            let Some(src) = self.paths[ci].iter().find(|p| p.via.is_empty()).map(|p| p.src) else {
                continue;
            };
            let t = &mut turn[c.dst as usize];
            *t += 1;
            let via = (1..g)
                .map(|j| node * g + (c.dst % g + j + *t) % g)
                .find(|&v| v != c.dst && cluster.is_live(v) && !crowded_on(src, v));
            if let Some(v) = via {
                let relayed = Path { src, via: vec![v] };
                if !self.paths[ci].contains(&relayed) {
                    out.push((ci, relayed));
                }
            }
        }
        out
    }

    /// Pinned commodities go whole along their one path.
    pub(super) fn fill_pinned(&self, fractions: &mut Fractions) {
        for (f, _) in fractions.iter_mut().zip(&self.pinned).filter(|(_, &p)| p) {
            *f = vec![1.0];
        }
    }

    /// Every row's load (LP units) under fractions of the columns, pinned
    /// commodities included (their fractions filled or not).
    pub(super) fn loads(&self, fractions: &Fractions, mfractions: &Fractions) -> Vec<f64> {
        let mut loads = row_loads(
            &[(&self.routes, fractions), (&self.mroutes, mfractions)],
            self.res.list.len(),
        );
        for (l, f) in loads.iter_mut().zip(&self.fixed) {
            *l += f;
        }
        loads
    }

    /// The LP over the columns so far, with these capacities.
    pub(super) fn data<'a>(&'a self, caps: &'a [f64]) -> LpData<'a> {
        LpData {
            routes: &self.routes,
            mroutes: &self.mroutes,
            shares: &self.shares,
            caps,
            fixed: &self.fixed,
            costs: &self.costs,
            mcosts: &self.mcosts,
        }
    }

    /// Capacity of every row so far, in LP units.
    pub(super) fn capacities(&self, cluster: &Cluster) -> Vec<f64> {
        capacities(cluster, &self.res.list, self.fastest)
    }

    /// Add a path to commodity `ci`.
    pub(super) fn add_path(&mut self, cluster: &Cluster, c: &Commodity, ci: usize, path: Path) {
        let route = route_of(cluster, c, &path, self.units, &mut self.res);
        self.fixed.resize(self.res.list.len(), 0.0);
        self.costs[ci].push(path_cost(cluster, c, &path, self.units));
        self.paths[ci].push(path);
        self.routes[ci].push(route);
    }

    /// The columns worth adding after a phase-1 solve: per commodity, the
    /// cheapest direct path from a holder not yet tried and the cheapest
    /// relayed path, where cheaper than every path it has, and the direct
    /// path with the most negative reduced cost under the duals.
    pub(super) fn price(
        &self,
        cluster: &Cluster,
        comms: &[Commodity],
        caps: &[f64],
        solved: &Phase1,
        relays: bool,
        exact_only: bool,
    ) -> Vec<(usize, Path)> {
        let (t_star, duals, phase1, mphase1) = solved;
        let t_star = *t_star;
        let nres = self.res.list.len();
        let units = self.units;
        // Prices: the duals, plus a congestion price on every saturated
        // row. Many rows often tie at the makespan (a degenerate LP) while
        // the duals single out one; pricing all of them lets one round
        // route around every bottleneck at once.
        let dual_of: Vec<f64> = (0..nres).map(|r| duals.get(r).copied().unwrap_or(0.0).abs()).collect();
        if exact_only {
            return self.price_exact(cluster, comms, &dual_of, relays);
        }
        let loads = self.loads(phase1, mphase1);
        let price_of: Vec<f64> = (0..nres)
            .map(|r| {
                let tight = loads[r] >= caps[r] * t_star * (1.0 - 1e-6) && t_star > 0.0;
                dual_of[r] + if tight { 1.0 / caps[r] } else { 0.0 }
            })
            .collect();
        let dense = DensePrices::new(cluster, &self.res.list, &price_of, false);
        // The duals alone give the exact test for a holder's direct
        // path (a column with negative reduced cost), which the
        // congestion prices above may blur.
        let exact = DensePrices::new(cluster, &self.res.list, &dual_of, false);
        // Commodities are priced independently, in parallel; their columns
        // are gathered in commodity order (plans stay deterministic).
        let priced: Vec<(usize, Vec<Path>)> = (0..comms.len())
            .into_par_iter()
            .filter(|&ci| !self.pinned[ci])
            .map(|ci| {
                let c = &comms[ci];
                let mut new_paths = Vec::new();
                let (paths, routes) = (&self.paths[ci], &self.routes[ci]);
                let cost = |route: &Route| -> f64 { route.iter().map(|&(r, k)| price_of[r] * k).sum() };
                let best = routes.iter().map(cost).fold(f64::INFINITY, f64::min);
                let bytes = c.bytes as f64 / units.bytes;
                let issue = cluster.latency_s() * c.fragments.len() as f64 / units.seconds;
                let mut candidate: Option<(f64, Path)> = None;
                let mut direct: Option<(f64, Path)> = None;
                let mut reduced: Option<(f64, Path)> = None;
                let inn = dense.way_in(cluster, c.dst, bytes, issue);
                let some_left = paths.len() < c.holders.len();
                let dual_best = if some_left {
                    let cost = |route: &Route| -> f64 { route.iter().map(|&(r, k)| dual_of[r] * k).sum() };
                    routes.iter().map(cost).fold(f64::INFINITY, f64::min)
                } else {
                    0.0
                };
                for &src in c.holders.iter() {
                    if some_left {
                        let path = Path { src, via: Vec::new() };
                        let pc = dense.direct(cluster, src, c.dst, bytes, issue);
                        let rc = exact.direct(cluster, src, c.dst, bytes, issue);
                        let better = |x: &Option<(f64, Path)>, v: f64| x.as_ref().is_none_or(|x| v < x.0);
                        if (better(&direct, pc) || better(&reduced, rc)) && !paths.contains(&path) {
                            if better(&direct, pc) {
                                direct = Some((pc, path.clone()));
                            }
                            if better(&reduced, rc) && rc < dual_best * (1.0 - 1e-6) {
                                reduced = Some((rc, path));
                            }
                        }
                    }
                    if !relays || cluster.node_of(src) == cluster.node_of(c.dst) {
                        continue;
                    }
                    let (pc, path) = cheapest_relay_path(cluster, &dense, src, c.dst, inn, bytes, issue);
                    if !path.via.is_empty() && !paths.contains(&path) && candidate.as_ref().is_none_or(|x| pc < x.0) {
                        candidate = Some((pc, path));
                    }
                }
                for (pc, path) in direct.into_iter().chain(candidate) {
                    if pc < best * (1.0 - 1e-6) {
                        new_paths.push(path);
                    }
                }
                if let Some((_, path)) = reduced {
                    if !new_paths.contains(&path) {
                        new_paths.push(path);
                    }
                }
                (ci, new_paths)
            })
            .collect();
        by_commodity(priced)
    }

    /// The columns of column generation to convergence (on a fabric): per
    /// commodity, the direct path from a holder not yet tried with the most
    /// negative reduced cost under the duals, and the relayed path
    /// (bridges included) with the most negative one, where negative.
    fn price_exact(&self, cluster: &Cluster, comms: &[Commodity], dual_of: &[f64], relays: bool) -> Vec<(usize, Path)> {
        let units = self.units;
        let exact = DensePrices::new(cluster, &self.res.list, dual_of, relays);
        // In parallel, as in `price`; each thread keeps its own cache of
        // the nodes' ways out (a pure function of the prices and sizes).
        let priced: Vec<(usize, Vec<Path>)> = (0..comms.len())
            .into_par_iter()
            .filter(|&ci| !self.pinned[ci])
            .map_init(OutWays::default, |out_cache, ci| {
                let c = &comms[ci];
                let (paths, routes) = (&self.paths[ci], &self.routes[ci]);
                let bytes = c.bytes as f64 / units.bytes;
                let issue = cluster.latency_s() * c.fragments.len() as f64 / units.seconds;
                let cost = |route: &Route| -> f64 { route.iter().map(|&(r, k)| dual_of[r] * k).sum() };
                let dual_best = routes.iter().map(cost).fold(f64::INFINITY, f64::min);
                let negative = |rc: f64| rc < dual_best * (1.0 - 1e-6);
                let mut reduced: Option<(f64, Path)> = None;
                if paths.len() < c.holders.len() {
                    for &src in c.holders.iter() {
                        let path = Path { src, via: Vec::new() };
                        let rc = exact.direct(cluster, src, c.dst, bytes, issue);
                        if reduced.as_ref().is_none_or(|x| rc < x.0) && negative(rc) && !paths.contains(&path) {
                            reduced = Some((rc, path));
                        }
                    }
                }
                let mut add: Vec<Path> = reduced.map(|(_, p)| p).into_iter().collect();
                if relays {
                    let inn = exact.ways_in(cluster, c.dst, bytes, issue);
                    let off: Vec<DeviceId> = c
                        .holders
                        .iter()
                        .copied()
                        .filter(|&h| cluster.node_of(h) != cluster.node_of(c.dst))
                        .collect();
                    if let Some((_, path)) =
                        exact.cheapest_relay_from(cluster, out_cache, &off, c.dst, &inn, bytes, issue)
                    {
                        let rc = exact.path(cluster, &path, c.dst, bytes, issue);
                        if negative(rc) && !paths.contains(&path) && !add.contains(&path) {
                            add.push(path);
                        }
                    }
                }
                (ci, add)
            })
            .collect();
        by_commodity(priced)
    }
}

/// Each commodity's new paths, as (commodity, path) pairs in commodity order.
fn by_commodity(priced: Vec<(usize, Vec<Path>)>) -> Vec<(usize, Path)> {
    priced
        .into_iter()
        .flat_map(|(ci, paths)| paths.into_iter().map(move |p| (ci, p)))
        .collect()
}

/// Phase 2's cost of sending a whole commodity along a path.
fn path_cost(cluster: &Cluster, c: &Commodity, p: &Path, units: Units) -> f64 {
    let w: f64 = p
        .stops(c.dst)
        .windows(2)
        .map(|h| traffic_weight(cluster, h[0], h[1]))
        .sum();
    w * c.bytes as f64 / units.bytes
}

/// Phase 2's cost of each option of a multicast (holder-major).
fn multicast_costs(cluster: &Cluster, m: &Multicast, units: Units) -> Vec<f64> {
    m.options()
        .map(|(src, k)| {
            let l = m.members[k];
            let w =
                traffic_weight(cluster, src, l) + m.members.iter().map(|&e| traffic_weight(cluster, l, e)).sum::<f64>();
            w * m.bytes as f64 / units.bytes
        })
        .collect()
}

/// How much makespan pinning may cost, as a fraction of a lower bound on
/// it: no row's fixed load exceeds `PIN_SLACK · floor · capacity`, so the
/// LP's optimum with the pinned commodities is within `1 + PIN_SLACK` of
/// the optimum without.
const PIN_SLACK: f64 = 1e-3;

/// Pin tiny commodities to one path each, outside the LP, smallest first,
/// while every row's fixed load stays within [`PIN_SLACK`] of `floor` (LP
/// units). Replicated small state (layer norms on every tensor-parallel
/// rank, the dataset and RNG state on every device) has hundreds of
/// holders and links every replica group to every other: pinned, it no
/// longer does, and the LP falls apart into independent components (the
/// rails and pipeline stages of a data-parallel change). A pinned
/// commodity goes from a holder on its destination, else from its first
/// starting holder (see [`initial_holders`]). Commodities that multicasts
/// deliver to stay in the LP.
fn pin(
    comms: &[Commodity],
    shares: &[Vec<(usize, f64)>],
    caps: &[f64],
    floor: f64,
    paths: &mut [Vec<Path>],
    routes: &mut [Vec<Route>],
    fixed: &mut [f64],
) -> Vec<bool> {
    let mut pinned = vec![false; comms.len()];
    if !(floor > 0.0 && floor.is_finite()) {
        return pinned;
    }
    let budget = |r: usize| PIN_SLACK * floor * caps[r];
    let mut order: Vec<usize> = (0..comms.len()).filter(|&ci| shares[ci].is_empty()).collect();
    order.sort_by_key(|&ci| (comms[ci].bytes, ci));
    for ci in order {
        // The starting paths come from holders on the destination's node
        // first, then from a block of off-node holders that the receivers
        // of one holder set take in turn: the first one spreads the
        // pinned commodities over the holders.
        let c = &comms[ci];
        let choice = paths[ci].iter().position(|p| p.src == c.dst).unwrap_or(0);
        if routes[ci][choice].iter().all(|&(r, k)| fixed[r] + k <= budget(r)) {
            for &(r, k) in &routes[ci][choice] {
                fixed[r] += k;
            }
            paths[ci] = vec![paths[ci].swap_remove(choice)];
            routes[ci] = Vec::new();
            pinned[ci] = true;
        }
    }
    pinned
}
