//! A flow-level simulator: links shared max-min fairly, plus per-message costs.
//!
//! Model:
//! - A device issues its messages one at a time in plan order, each costing
//!   the cluster's message latency: message k of a device is issued at
//!   `(k + 1) · latency`.
//! - Messages from one device to one peer (through one relay, if any) travel
//!   in order over one stream, as over one NCCL channel or TCP connection. A
//!   stream starts when its first message is issued and ends when its bytes
//!   have arrived, and no earlier than its last message's issue time.
//! - A relayed copy is pipelined (forwarded chunk by chunk): its stream uses
//!   the resources of both hops at once. So is a multicast: its stream uses
//!   the hops to its destination and from there to every forwarded-to
//!   device at once, and the destination issues one message per forward.
//! - Active streams share every resource max-min fairly (progressive filling).
//!   Streams with the same route always get the same rate, so they are
//!   simulated as one group with a virtual clock; each event costs
//!   O(active groups · log resources).
//! - A stream the plan paces (`Plan::paces`) never exceeds its pace: it is
//!   its own group, with its pace as one more capacity in the filling, so
//!   paces that oversubscribe a link degrade to fair sharing rather than
//!   being trusted.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use tenplan_ptc::{Copy, DeviceId, Plan, StreamKey};

use crate::cost::{capacity, copy_bytes, hop, hops, Resource};
use crate::OrdF64;

/// What the simulator measured.
#[derive(Clone, Debug, PartialEq)]
pub struct SimReport {
    /// Time until the last byte lands, in seconds.
    pub makespan_s: f64,
    /// Messages (copies) simulated.
    pub messages: usize,
    /// Streams (distinct source, relay, destination) simulated.
    pub streams: usize,
}

struct Stream {
    bytes: f64,
    start: f64,
    last_issue: f64,
    group: usize,
}

struct Group {
    resources: Vec<usize>,
    /// Rate limit of each stream of the group (paced streams).
    pace: Option<f64>,
    /// Bytes served to each active stream so far.
    virtual_bytes: f64,
    /// Active streams: (virtual bytes at which they finish, stream).
    active: BinaryHeap<Reverse<(OrdF64, usize)>>,
    rate: f64,
}

/// Simulate a plan; the plan is assumed to be valid (run the checker first).
/// Staging rounds run one after another, each from a clean start.
pub fn simulate(plan: &Plan) -> SimReport {
    let last = plan.copies.iter().map(|c| c.round).max().unwrap_or(0);
    if last == 0 {
        return simulate_copies(plan, &plan.copies.iter().collect::<Vec<_>>());
    }
    let mut by_round: BTreeMap<u32, Vec<&Copy>> = BTreeMap::new();
    for c in &plan.copies {
        by_round.entry(c.round).or_default().push(c);
    }
    let mut total = SimReport {
        makespan_s: 0.0,
        messages: 0,
        streams: 0,
    };
    for copies in by_round.values() {
        let r = simulate_copies(plan, copies);
        total.makespan_s += r.makespan_s;
        total.messages += r.messages;
        total.streams += r.streams;
    }
    total
}

/// Simulate some of a plan's copies (one round, or all of them).
fn simulate_copies(plan: &Plan, copies: &[&Copy]) -> SimReport {
    let cluster = plan.problem.cluster();
    let latency = cluster.latency_s();
    let mut resource_ids: BTreeMap<Resource, usize> = BTreeMap::new();
    let mut caps: Vec<f64> = Vec::new();
    let mut groups: Vec<Group> = Vec::new();
    let mut group_of: BTreeMap<Vec<usize>, usize> = BTreeMap::new();
    let mut streams: Vec<Stream> = Vec::new();
    let mut stream_of: BTreeMap<StreamKey, usize> = BTreeMap::new();
    let mut issued: BTreeMap<DeviceId, f64> = BTreeMap::new();
    let paces: BTreeMap<StreamKey, f64> = plan
        .paces
        .iter()
        .filter(|p| p.bytes_per_s.is_finite() && p.bytes_per_s > 0.0)
        .map(|p| {
            let key = StreamKey {
                src: p.src,
                via: p.via.clone(),
                dst: p.dst,
                fanout: p.fanout.clone(),
            };
            (key, p.bytes_per_s)
        })
        .collect();
    for &c in copies {
        let at = issued.entry(c.src).or_insert(0.0);
        *at += latency;
        let at = *at;
        // A multicast's destination issues one forward per device; the
        // stream cannot end before the last of them.
        let forwarded = if c.fanout.is_empty() {
            at
        } else {
            let f = issued.entry(c.dst).or_insert(0.0);
            *f += latency * c.fanout.len() as f64;
            *f
        };
        let bytes = copy_bytes(plan, c) as f64;
        let key = c.stream();
        let next = streams.len();
        let s = *stream_of.entry(key.clone()).or_insert(next);
        if s == next {
            let mut route = Vec::new();
            for (a, b) in hops(c) {
                for r in hop(cluster, a, b) {
                    let id = *resource_ids.entry(r).or_insert_with(|| {
                        caps.push(capacity(cluster, r));
                        caps.len() - 1
                    });
                    if !route.contains(&id) {
                        route.push(id);
                    }
                }
            }
            route.sort_unstable();
            let pace = paces.get(&key).copied();
            let new_group = |route: Vec<usize>, groups: &mut Vec<Group>| {
                groups.push(Group {
                    resources: route,
                    pace,
                    virtual_bytes: 0.0,
                    active: BinaryHeap::new(),
                    rate: 0.0,
                });
                groups.len() - 1
            };
            // A paced stream is a group of its own.
            let g = match pace {
                Some(_) => new_group(route, &mut groups),
                None => *group_of
                    .entry(route.clone())
                    .or_insert_with(|| new_group(route, &mut groups)),
            };
            streams.push(Stream {
                bytes: 0.0,
                start: at,
                last_issue: at,
                group: g,
            });
        }
        streams[s].bytes += bytes;
        streams[s].last_issue = streams[s].last_issue.max(at.max(forwarded));
    }
    let mut releases: Vec<usize> = (0..streams.len()).collect();
    releases.sort_by(|&a, &b| streams[a].start.total_cmp(&streams[b].start).then(a.cmp(&b)));
    let mut next_release = 0;
    let mut now = 0.0f64;
    let mut makespan = 0.0f64;
    let mut active_groups: Vec<usize> = Vec::new();
    let mut filler = Filler::new(caps);
    loop {
        while next_release < releases.len() && streams[releases[next_release]].start <= now {
            let s = releases[next_release];
            next_release += 1;
            let g = &mut groups[streams[s].group];
            if g.active.is_empty() {
                active_groups.push(streams[s].group);
            }
            g.active.push(Reverse((OrdF64(g.virtual_bytes + streams[s].bytes), s)));
        }
        if active_groups.is_empty() {
            match releases.get(next_release) {
                Some(&s) => {
                    now = streams[s].start;
                    continue;
                }
                None => break,
            }
        }
        filler.rates(&mut groups, &active_groups);
        let mut dt = f64::INFINITY;
        for &gi in &active_groups {
            let g = &groups[gi];
            let Reverse((OrdF64(fin), _)) = *g.active.peek().expect("active groups have streams");
            dt = dt.min((fin - g.virtual_bytes).max(0.0) / g.rate);
        }
        if let Some(&s) = releases.get(next_release) {
            dt = dt.min(streams[s].start - now);
        }
        now += dt;
        active_groups.retain(|&gi| {
            let g = &mut groups[gi];
            g.virtual_bytes += g.rate * dt;
            while let Some(&Reverse((OrdF64(fin), s))) = g.active.peek() {
                if fin - g.virtual_bytes > 1e-9 * fin.max(1.0) {
                    break;
                }
                g.active.pop();
                makespan = makespan.max(now.max(streams[s].last_issue));
            }
            !g.active.is_empty()
        });
    }
    SimReport {
        makespan_s: makespan,
        messages: copies.len(),
        streams: streams.len(),
    }
}

/// Max-min fair rates by progressive filling: repeatedly saturate the
/// resource with the smallest fair share and freeze the groups through it.
/// Dense arrays and a lazy min-heap keep one call near-linear.
struct Filler {
    caps: Vec<f64>,
    left: Vec<f64>,
    count: Vec<f64>,
    users: Vec<Vec<usize>>,
    touched: Vec<usize>,
}

impl Filler {
    fn new(caps: Vec<f64>) -> Filler {
        let n = caps.len();
        Filler {
            caps,
            left: vec![0.0; n],
            count: vec![0.0; n],
            users: vec![Vec::new(); n],
            touched: Vec::new(),
        }
    }

    fn rates(&mut self, groups: &mut [Group], active: &[usize]) {
        for &r in &self.touched {
            self.count[r] = 0.0;
            self.users[r].clear();
        }
        self.touched.clear();
        for &gi in active {
            let n = groups[gi].active.len() as f64;
            groups[gi].rate = -1.0;
            for &r in &groups[gi].resources {
                if self.users[r].is_empty() {
                    self.touched.push(r);
                    self.left[r] = self.caps[r];
                }
                self.count[r] += n;
                self.users[r].push(gi);
            }
        }
        let mut heap: BinaryHeap<Reverse<(OrdF64, usize)>> = self
            .touched
            .iter()
            .map(|&r| Reverse((OrdF64(self.left[r] / self.count[r]), r)))
            .collect();
        // A paced group's pace is one more capacity, its own: entry nres + gi.
        let nres = self.caps.len();
        for &gi in active {
            if let Some(p) = groups[gi].pace {
                heap.push(Reverse((OrdF64(p), nres + gi)));
            }
        }
        while let Some(Reverse((OrdF64(share), r))) = heap.pop() {
            if r >= nres {
                let gi = r - nres;
                if groups[gi].rate < 0.0 {
                    self.freeze(groups, gi, share, None, &mut heap);
                }
                continue;
            }
            if self.count[r] <= 0.0 || share != self.left[r] / self.count[r] {
                continue; // stale entry, or nothing left to freeze here
            }
            let share = share.max(0.0);
            let users = std::mem::take(&mut self.users[r]);
            for &gi in &users {
                if groups[gi].rate < 0.0 {
                    self.freeze(groups, gi, share, Some(r), &mut heap);
                }
            }
            self.users[r] = users;
        }
    }

    /// Fix a group's rate and take it out of its resources' remaining capacity.
    fn freeze(
        &mut self,
        groups: &mut [Group],
        gi: usize,
        share: f64,
        skip: Option<usize>,
        heap: &mut BinaryHeap<Reverse<(OrdF64, usize)>>,
    ) {
        groups[gi].rate = share;
        let n = groups[gi].active.len() as f64;
        for &q in &groups[gi].resources {
            self.left[q] -= share * n;
            self.count[q] -= n;
            if Some(q) != skip && self.count[q] > 0.0 {
                heap.push(Reverse((OrdF64(self.left[q] / self.count[q]), q)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tenplan_ptc::{
        Buffer, Cluster, ClusterData, Copy, DType, Layout, Piece, Plan, Problem, Region, Shard, TensorSpec,
    };

    use super::simulate;

    /// One u8 tensor of `n` elements per source device; devices 4.. receive.
    fn plan(copies: &[(u32, u32, Option<u32>)], n: u64, latency_s: f64) -> Plan {
        let k = copies.len();
        let tensors: Arc<[TensorSpec]> = (0..k)
            .map(|i| TensorSpec::new(format!("t{i}"), DType::U8, [n]))
            .collect();
        let buf = |i: usize| Buffer {
            name: format!("t{i}"),
            dtype: DType::U8,
            len: n,
            pieces: vec![Piece {
                tensor: i as u32,
                region: Region::full(&[n]),
                offset: 0,
            }],
            partial: false,
        };
        let layout = |devs: Vec<u32>| {
            let shards = devs
                .iter()
                .enumerate()
                .map(|(i, &d)| Shard {
                    name: format!("s{i}"),
                    devices: vec![d],
                    buffers: vec![buf(i)],
                })
                .collect();
            Layout::new(tensors.clone(), shards).unwrap()
        };
        let mut data: ClusterData = Cluster::parse("2x4").unwrap().data().clone();
        data.latency_s = latency_s;
        data.bandwidth.intra_node = 100.0;
        data.bandwidth.nic = 10.0;
        let problem = Problem::new(
            layout(copies.iter().map(|c| c.0).collect()),
            layout(copies.iter().map(|c| c.1).collect()),
            Cluster::new(data).unwrap(),
        )
        .unwrap();
        let copies = copies
            .iter()
            .enumerate()
            .map(|(i, &(src, dst, via))| Copy {
                src,
                dst,
                via: via.into_iter().collect(),
                tensor: i as u32,
                region: Region::full(&[n]),
                buffer: 0,
                offset: 0,
                reduce: false,
                round: 0,
                fanout: Vec::new(),
            })
            .collect();
        Plan {
            planner: "test".into(),
            problem,
            copies,
            fills: vec![],
            paces: vec![],
        }
    }

    #[test]
    fn one_copy_takes_bytes_over_bandwidth_plus_latency() {
        let r = simulate(&plan(&[(0, 1, None)], 1000, 0.5));
        assert!((r.makespan_s - (0.5 + 10.0)).abs() < 1e-9, "{}", r.makespan_s);
    }

    #[test]
    fn flows_through_one_nic_share_it() {
        // Devices 0 and 1 share node 0's NIC towards node 1: 2000 B at 10 B/s.
        let r = simulate(&plan(&[(0, 4, None), (1, 5, None)], 1000, 0.0));
        assert!((r.makespan_s - 200.0).abs() < 1e-6, "{}", r.makespan_s);
    }

    #[test]
    fn max_min_gives_leftover_capacity_to_unconstrained_flows() {
        // 0->4 crosses the NIC (10 B/s); 1->2 uses NVLink alone (100 B/s).
        let r = simulate(&plan(&[(0, 4, None), (1, 2, None)], 1000, 0.0));
        assert!((r.makespan_s - 100.0).abs() < 1e-6, "{}", r.makespan_s);
    }

    #[test]
    fn a_pace_caps_its_stream() {
        let mut p = plan(&[(0, 1, None)], 1000, 0.0);
        p.paces = vec![tenplan_ptc::Pace {
            src: 0,
            via: vec![],
            dst: 1,
            fanout: vec![],
            bytes_per_s: 2.0,
        }];
        let r = simulate(&p);
        assert!((r.makespan_s - 500.0).abs() < 1e-6, "{}", r.makespan_s);
    }

    #[test]
    fn oversubscribed_paces_fall_back_to_fair_sharing() {
        // Both paced at the NIC's full 10 B/s: they get 5 B/s each.
        let mut p = plan(&[(0, 4, None), (1, 5, None)], 1000, 0.0);
        p.paces = [(0, 4), (1, 5)]
            .iter()
            .map(|&(src, dst)| tenplan_ptc::Pace {
                src,
                via: vec![],
                dst,
                fanout: vec![],
                bytes_per_s: 10.0,
            })
            .collect();
        let r = simulate(&p);
        assert!((r.makespan_s - 200.0).abs() < 1e-6, "{}", r.makespan_s);
    }

    #[test]
    fn relays_use_both_hops_at_once() {
        // 0 -> 1 -> 5: NVLink then the NIC, pipelined: the NIC bounds it.
        let r = simulate(&plan(&[(0, 5, Some(1))], 1000, 0.0));
        assert!((r.makespan_s - 100.0).abs() < 1e-6, "{}", r.makespan_s);
        assert_eq!(r.streams, 1);
    }
}
