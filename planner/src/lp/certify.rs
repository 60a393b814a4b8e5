//! Step 3: the certified lower bound, by weak duality from any non-negative
//! row prices, over every route a plan may take (relays and multicasts
//! included); it never trusts the solver.

use std::collections::{BTreeMap, HashMap};

use tenplan_ptc::{Cluster, DeviceId, Forwarding, Problem};

use super::commodities::commodities;
use super::Row;
use super::{LpPlanner, Phases};
use crate::cost::{capacity, Resource};
use crate::intersect::{fragments, Fragment};
use crate::{LowerBound, Result};

/// The certified bound from a phase-1 solution: the better of its capacity
/// rows' duals (`duals`, one per row) and uniform prices on its saturated
/// links. Any non-negative prices give a valid bound; the duals of a
/// degenerate LP may leave one of several saturated links free, which a
/// relay-aware route then uses at no cost, and pricing every saturated link
/// alike does not.
#[allow(clippy::too_many_arguments)]
pub(super) fn certify(
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
pub(super) struct RoutePrices<'a> {
    pub(super) send: &'a [f64],
    pub(super) recv: &'a [f64],
    pub(super) nic_out: &'a [f64],
    pub(super) nic_in: &'a [f64],
    /// Per fabric switch: its uplink and downlink (empty without a fabric).
    pub(super) up: &'a [f64],
    pub(super) down: &'a [f64],
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
pub(super) struct RouteCosts<'a> {
    pub(super) prices: RoutePrices<'a>,
    pub(super) gpus_per_node: u32,
    pub(super) nics: Vec<usize>,
    pub(super) live: Vec<bool>,
    /// Cheapest way from each live device onto the network.
    pub(super) onto_network: Vec<f64>,
    /// On a fabric, the network vertex becomes the fabric's switches.
    fabric: Option<FabricRoutes>,
}

/// Route prices over a fabric. The network vertex of the flat graph
/// becomes one vertex per switch, joined by the tree's links and by
/// *bridges* (see [`SwitchPaths`]).
struct FabricRoutes {
    paths: SwitchPaths,
    /// The switch of each device's NIC.
    switch_of: Vec<u32>,
}

/// The two devices of a bridge through a node (in, out), if a step is one.
type Bridge = Option<(DeviceId, DeviceId)>;

/// Cheapest prices between the switches of a fabric under link prices:
/// the tree's links, and *bridges* through a node (in through a NIC on one
/// switch, the NVSwitch, out through a NIC on another: two relays on that
/// node), which a plan may use to change rails off the spine. Column
/// pricing and the certified bound search the same graph.
pub(super) struct SwitchPaths {
    pub(super) n: usize,
    /// Price per byte from switch `a` to switch `b`, at `a * n + b`.
    pub(super) dist: Vec<f64>,
    /// The last step into `b` from `a`: the switch before it and the
    /// bridge's two devices, if it is a bridge.
    step: Vec<(u32, Bridge)>,
    /// Per node: the cheapest way from its NVSwitch onto each switch of its
    /// NICs (receive, then NIC out), over its live devices.
    out_of_node: Vec<Vec<(u32, f64)>>,
}

impl SwitchPaths {
    pub(super) fn new(cluster: &Cluster, p: &RoutePrices<'_>) -> SwitchPaths {
        let n = cluster.num_switches() as usize;
        let mut edges: BTreeMap<(u32, u32), (f64, Bridge)> = BTreeMap::new();
        let mut edge = |a: u32, b: u32, w: f64, via: Bridge| {
            let e = edges.entry((a, b)).or_insert((w, via));
            if w < e.0 {
                *e = (w, via);
            }
        };
        for s in 0..n as u32 {
            if let Some(parent) = cluster.parent_switch(s) {
                edge(s, parent, p.up[s as usize], None);
                edge(parent, s, p.down[s as usize], None);
            }
        }
        let g = cluster.gpus_per_node();
        let mut out_of_node = Vec::with_capacity(cluster.nodes() as usize);
        for node in 0..cluster.nodes() {
            // Cheapest way in from each switch (NIC in, then send) and out
            // to each (receive, then NIC out), over the node's live devices.
            let mut into: BTreeMap<u32, (f64, DeviceId)> = BTreeMap::new();
            let mut out: BTreeMap<u32, (f64, DeviceId)> = BTreeMap::new();
            for x in (node * g..(node + 1) * g).filter(|&x| cluster.is_live(x)) {
                let nic = cluster.nic_of(x);
                let Some(s) = cluster.switch_of_nic(nic) else { continue };
                let i = into.entry(s).or_insert((f64::INFINITY, x));
                let w = p.nic_in[nic as usize] + p.send[x as usize];
                if w < i.0 {
                    *i = (w, x);
                }
                let o = out.entry(s).or_insert((f64::INFINITY, x));
                let w = p.recv[x as usize] + p.nic_out[nic as usize];
                if w < o.0 {
                    *o = (w, x);
                }
            }
            for (&a, &(wa, x)) in &into {
                for (&b, &(wb, y)) in out.iter().filter(|(&b, _)| b != a) {
                    edge(a, b, wa + wb, Some((x, y)));
                }
            }
            out_of_node.push(out.into_iter().map(|(s, (w, _))| (s, w)).collect());
        }
        let mut adjacency: Vec<Vec<(u32, f64, Bridge)>> = vec![Vec::new(); n];
        for ((a, b), (w, via)) in edges {
            adjacency[a as usize].push((b, w, via));
        }
        let mut dist = vec![f64::INFINITY; n * n];
        let mut step = vec![(u32::MAX, None); n * n];
        for from in 0..n {
            let row = from * n;
            dist[row + from] = 0.0;
            let mut heap = std::collections::BinaryHeap::new();
            heap.push(std::cmp::Reverse((crate::OrdF64(0.0), from as u32)));
            while let Some(std::cmp::Reverse((crate::OrdF64(dx), x))) = heap.pop() {
                if dx > dist[row + x as usize] {
                    continue;
                }
                for &(y, w, via) in &adjacency[x as usize] {
                    if dx + w < dist[row + y as usize] {
                        dist[row + y as usize] = dx + w;
                        step[row + y as usize] = (x, via);
                        heap.push(std::cmp::Reverse((crate::OrdF64(dx + w), y)));
                    }
                }
            }
        }
        SwitchPaths {
            n,
            dist,
            step,
            out_of_node,
        }
    }

    /// Price per byte from switch `a` to switch `b`.
    pub(super) fn between(&self, a: u32, b: u32) -> f64 {
        self.dist[a as usize * self.n + b as usize]
    }

    /// The relays of the cheapest way from switch `a` to switch `b`.
    pub(super) fn relays(&self, a: u32, mut b: u32) -> Vec<DeviceId> {
        let mut out = Vec::new();
        while b != a {
            let (prev, via) = self.step[a as usize * self.n + b as usize];
            if let Some((x, y)) = via {
                out.push(y);
                out.push(x);
            }
            b = prev;
        }
        out.reverse();
        out
    }
}

/// The distances to one device: from each device of its node, and from the
/// network vertex (on a fabric: from each switch, filled as asked).
pub(super) struct Distances {
    pub(super) node: u32,
    pub(super) local: Vec<f64>,
    pub(super) network: f64,
    /// From the switches of the node's NICs.
    at_switch: Vec<(u32, f64)>,
    /// From any switch (NaN: not computed yet).
    far: Vec<f64>,
    /// From each node's NVSwitch through the network (NaN: not yet).
    via_node: Vec<f64>,
}

impl<'a> RouteCosts<'a> {
    pub(super) fn new(cluster: &Cluster, prices: RoutePrices<'a>) -> RouteCosts<'a> {
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
        let fabric = cluster.has_fabric().then(|| FabricRoutes {
            paths: SwitchPaths::new(cluster, &prices),
            switch_of: nics
                .iter()
                .map(|&k| cluster.switch_of_nic(k as u32).expect("a fabric attaches every NIC"))
                .collect(),
        });
        RouteCosts {
            prices,
            gpus_per_node: gpn,
            nics,
            live,
            onto_network,
            fabric,
        }
    }

    /// Distances to `d`: Dijkstra over `d`'s node, its switch and the network.
    pub(super) fn to(&self, d: DeviceId) -> Distances {
        if let Some(f) = &self.fabric {
            return self.to_on_fabric(f, d);
        }
        let g = self.gpus_per_node as usize;
        let node = d / self.gpus_per_node;
        let first = node as usize * g;
        let p = &self.prices;
        // Vertices: the node's devices 0..g, its switch g, the network g + 1.
        let (switch, network) = (g, g + 1);
        let dist = distances_to(g + 2, d as usize - first, |x, relax| {
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
        });
        Distances {
            node,
            network: dist[network],
            local: dist[..g].to_vec(),
            at_switch: Vec::new(),
            far: Vec::new(),
            via_node: Vec::new(),
        }
    }

    /// Distances to `d` on a fabric: Dijkstra over `d`'s node, its NVSwitch
    /// and the switches of its NICs (joined by their cheapest prices).
    fn to_on_fabric(&self, f: &FabricRoutes, d: DeviceId) -> Distances {
        let g = self.gpus_per_node as usize;
        let node = d / self.gpus_per_node;
        let first = node as usize * g;
        let p = &self.prices;
        let mut sw: Vec<u32> = (first..first + g).map(|x| f.switch_of[x]).collect();
        sw.sort_unstable();
        sw.dedup();
        let k = sw.len();
        // Vertices: devices 0..g, the NVSwitch g, the switches g + 1 + i.
        let nvswitch = g;
        let index = |s: u32| g + 1 + sw.binary_search(&s).expect("a switch of the node");
        let dist = distances_to(g + 1 + k, d as usize - first, |x, relax| {
            if x < g {
                relax(nvswitch, p.recv[first + x]);
                relax(index(f.switch_of[first + x]), p.nic_in[self.nics[first + x]]);
            } else if x == nvswitch {
                for a in (0..g).filter(|&a| self.live[first + a]) {
                    relax(a, p.send[first + a]);
                }
            } else {
                let s = sw[x - g - 1];
                for a in (0..g).filter(|&a| self.live[first + a] && f.switch_of[first + a] == s) {
                    relax(a, p.nic_out[self.nics[first + a]]);
                }
                for (i, &t) in sw.iter().enumerate() {
                    relax(g + 1 + i, f.paths.between(t, s));
                }
            }
        });
        Distances {
            node,
            network: f64::INFINITY,
            local: dist[..g].to_vec(),
            at_switch: sw.iter().enumerate().map(|(i, &s)| (s, dist[g + 1 + i])).collect(),
            far: vec![f64::NAN; f.paths.n],
            via_node: vec![f64::NAN; f.paths.out_of_node.len()],
        }
    }

    /// The cheapest route's price from `s` to the device of `dist`.
    pub(super) fn from(&self, dist: &mut Distances, s: DeviceId) -> f64 {
        if s / self.gpus_per_node == dist.node {
            return dist.local[(s % self.gpus_per_node) as usize];
        }
        let Some(f) = &self.fabric else {
            return self.onto_network[s as usize] + dist.network;
        };
        if !self.live[s as usize] {
            return f64::INFINITY;
        }
        // Out through its own NIC, or over the NVSwitch and a peer's NIC:
        // the latter is the same for every device of the node but its send.
        let far = |dist: &mut Distances, t: u32| -> f64 {
            let v = dist.far[t as usize];
            if !v.is_nan() {
                return v;
            }
            let v = dist
                .at_switch
                .iter()
                .map(|&(u, a)| f.paths.between(t, u) + a)
                .fold(f64::INFINITY, f64::min);
            dist.far[t as usize] = v;
            v
        };
        let own = self.prices.nic_out[self.nics[s as usize]] + far(dist, f.switch_of[s as usize]);
        let node = (s / self.gpus_per_node) as usize;
        if dist.via_node[node].is_nan() {
            let mut best = f64::INFINITY;
            for &(t, w) in &f.paths.out_of_node[node] {
                best = best.min(w + far(dist, t));
            }
            dist.via_node[node] = best;
        }
        own.min(self.prices.send[s as usize] + dist.via_node[node])
    }
}

/// Dijkstra towards `start` on a small dense graph of `n` vertices:
/// `into(x, relax)` calls `relax(y, w)` for every edge y → x of weight `w`.
/// O(n²), which beats a heap on a node's dozen vertices.
fn distances_to(n: usize, start: usize, mut into: impl FnMut(usize, &mut dyn FnMut(usize, f64))) -> Vec<f64> {
    let mut dist = vec![f64::INFINITY; n];
    let mut done = vec![false; n];
    dist[start] = 0.0;
    while let Some(x) = (0..n)
        .filter(|&v| !done[v] && dist[v].is_finite())
        .min_by(|&a, &b| dist[a].total_cmp(&dist[b]).then(a.cmp(&b)))
    {
        done[x] = true;
        let dx = dist[x];
        into(x, &mut |y, w| {
            if dx + w < dist[y] {
                dist[y] = dx + w;
            }
        });
    }
    dist
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
    let switches = cluster.num_switches() as usize;
    let (mut up, mut down) = (vec![0.0; switches], vec![0.0; switches]);
    for (&r, &y) in resources.iter().zip(prices) {
        let y = y / norm;
        match r {
            Resource::Send(d) => send[d as usize] = y,
            Resource::Recv(d) => recv[d as usize] = y,
            Resource::Memory(d) => mem[d as usize] = y,
            Resource::NicOut(i) => nic_out[i as usize] = y,
            Resource::NicIn(i) => nic_in[i as usize] = y,
            Resource::SwitchUp(s) => up[s as usize] = y,
            Resource::SwitchDown(s) => down[s as usize] = y,
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
            up: &up,
            down: &down,
        },
    );
    let mut cache: BTreeMap<DeviceId, Distances> = BTreeMap::new();
    // Groups of fragments (and multicast leaders) ask again for the same
    // destination and holder list: remembered by the list's address.
    let mut known: HashMap<(DeviceId, *const DeviceId, usize), f64> = HashMap::new();
    // Cheapest route from any of `holders` to `d`.
    let mut reach = |d: DeviceId, holders: &[DeviceId]| -> f64 {
        *known.entry((d, holders.as_ptr(), holders.len())).or_insert_with(|| {
            let dist = cache.entry(d).or_insert_with(|| routes.to(d));
            holders
                .iter()
                .map(|&s| {
                    if s == d {
                        mem[s as usize]
                    } else {
                        routes.from(&mut *dist, s)
                    }
                })
                .fold(f64::INFINITY, f64::min)
        })
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

/// The trivial bound, or `certified` where that is higher (a tie keeps the
/// trivial bound and its reason): how a report and the `lp` planner combine
/// the two.
pub(crate) fn raised(trivial: LowerBound, certified: Option<&LowerBound>) -> LowerBound {
    match certified {
        Some(c) if c.seconds > trivial.seconds => c.clone(),
        _ => trivial,
    }
}

/// The LP lower bound of a problem together with the trivial one: the larger
/// of the two, both valid for every plan. Where a large LP (thousands of
/// GPUs, on a flat network) meets the cuts within [`BOUND_SLACK`], the LP
/// could raise the bound by less than that and is not solved to the end:
/// the bound is then the cuts.
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
/// always a valid bound, within `BOUND_SLACK` of the LP's (on a fabric,
/// within 1%: there column generation stops at a stall that close to the
/// cuts, and a bound alone or a plan's load within 1% of them is taken as
/// it is).
pub fn lower_bound_below(problem: &Problem, upper_s: f64) -> Result<LowerBound> {
    lower_bound_given(problem, upper_s, None)
}

/// [`lower_bound_below`] given a bound already certified for the problem
/// (by the planner that made the plan, see
/// [`crate::Planner::plan_with_bound`]): where it, or the trivial bound,
/// is within [`BOUND_SLACK`] of `upper_s` (on a fabric, within the 1% at
/// which column generation there stops), no LP is solved.
pub fn lower_bound_given(problem: &Problem, upper_s: f64, known: Option<&LowerBound>) -> Result<LowerBound> {
    // The plan's load caps the LP's optimum and so every certificate: a
    // bound that close to it is as good as the LP would give, within the
    // slack. On a fabric that is the gap at which column generation stops
    // anyway, and the LP solved again would end at the bound `lp` handed
    // over (GPT-3 175B ZeRO-1 on the 2:1 rail fabric at 16,384 GPUs: its
    // plan's load 0.2% above the cuts, 3.5 s to find the cuts again).
    let slack = super::bound_gap(problem.cluster());
    // A known bound within the slack of the plan's load needs nothing more
    // (the `lp` planner's includes the trivial bound where it computed the
    // cuts: the same answer, without cutting millions of fragments again).
    if let Some(k) = known.filter(|k| k.seconds >= upper_s * (1.0 - slack)) {
        return Ok(k.clone());
    }
    // Forwarding across the cluster, a planner's bound is the cuts (the
    // LP's certificate does not hold there): nothing to add to them.
    if let Some(k) = known.filter(|_| problem.forwarding() == Forwarding::Cluster) {
        return Ok(k.clone());
    }
    let frags = fragments(problem)?;
    // The LP asks for the cuts again: computed once.
    let cut = crate::cost::cut_lower_bound(problem, &frags);
    let trivial = raised(crate::cost::trivial_given_cut(problem, &frags, cut.clone()), known);
    // The LP prices multicasts within a node: forwarding across the
    // cluster, its certificate does not hold and the cuts are the bound.
    if trivial.seconds >= upper_s * (1.0 - slack) || problem.forwarding() == Forwarding::Cluster {
        return Ok(trivial);
    }
    let comms = commodities(&frags);
    // Interior-point duals sit inside the optimal face, where the simplex
    // method's vertex duals often price all but one bottleneck at zero: the
    // bound they certify is far tighter. On a fabric column generation runs
    // until no column prices in, where any optimal duals certify the
    // optimum, and the simplex method's rounds are 3x faster.
    let mut builder = LpPlanner::builder();
    if !problem.cluster().has_fabric() {
        builder = builder.interior_point();
    }
    let lp = builder
        .build()
        .run(problem, &frags, &comms, Phases::BoundOnly, Some(cut))?
        .bound
        .expect("asked for the bound");
    Ok(if lp.seconds >= trivial.seconds { lp } else { trivial })
}
