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
//! - Active streams share every resource max-min fairly (progressive
//!   filling), exactly: the allocation after every start and end is the one
//!   progressive filling of all active streams gives (a property test
//!   compares the two).
//! - A stream the plan paces (`Plan::paces`) never exceeds its pace: its
//!   pace is one more resource, its own, so paces that oversubscribe a link
//!   degrade to fair sharing rather than being trusted.
//!
//! How (see `levels`): streams with the same route always get the same
//! rate and are simulated as one group; every group is held by a
//! bottleneck resource whose groups share one rate, its level, and advance
//! on its virtual clock. An event moves levels, not rates: it costs the
//! neighbourhood of the resources whose level moves, not the number of
//! groups they hold, which is what lets an all-to-all of millions of
//! streams (a greedy baseline's plan at 16,384 GPUs) be simulated exactly.

mod ends;
mod filling;
mod levels;

use std::collections::{BTreeMap, HashMap};

use tenplan_ptc::{BoxCopy, Plan, StreamKey};

use crate::cost::{capacity, copy_bytes, stream_resources, Resource};
use levels::{Group, Levels, Route};

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

/// Simulate a plan; the plan is assumed to be valid (run the checker first).
/// Staging rounds run one after another, each from a clean start.
pub fn simulate(plan: &Plan) -> SimReport {
    let last = plan.copies.iter().map(|c| c.round).max().unwrap_or(0);
    if last == 0 {
        return simulate_copies(plan, &plan.copies.iter().collect::<Vec<_>>());
    }
    let mut by_round: BTreeMap<u32, Vec<&BoxCopy>> = BTreeMap::new();
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

/// The streams of some copies, their groups and the resources' capacities
/// (a paced stream's pace is a resource of its own, after the cluster's).
fn streams_of(plan: &Plan, copies: &[&BoxCopy]) -> (Vec<Stream>, Vec<Group>, Vec<f64>) {
    let cluster = plan.problem.cluster();
    let latency = cluster.latency_s();
    let mut resource_ids: HashMap<Resource, usize> = HashMap::new();
    let mut caps: Vec<f64> = Vec::new();
    let mut groups: Vec<Group> = Vec::new();
    let mut group_of: HashMap<Route, usize> = HashMap::new();
    let mut streams: Vec<Stream> = Vec::new();
    // Streams numbered in order of first appearance, with no key built per
    // direct copy (millions at thousands of GPUs).
    let (stream_of, keys) = crate::issue::stream_ids(copies.iter().copied());
    let mut issued = vec![0.0; cluster.num_devices() as usize];
    let paces: HashMap<StreamKey, f64> = plan
        .paces
        .iter()
        .filter(|p| p.bytes_per_s.is_finite() && p.bytes_per_s > 0.0)
        .map(|p| (p.stream(), p.bytes_per_s))
        .collect();
    let mut paced: Vec<(usize, f64)> = Vec::new();
    for (&c, &s) in copies.iter().zip(&stream_of) {
        let at = &mut issued[c.src as usize];
        *at += latency;
        let at = *at;
        // A multicast's destination issues one forward per device; the
        // stream cannot end before the last of them.
        let forwards = c.forwarded().count();
        let forwarded = if forwards == 0 {
            at
        } else {
            let f = &mut issued[c.dst as usize];
            *f += latency * forwards as f64;
            *f
        };
        let bytes = copy_bytes(plan, c) as f64;
        let s = s as usize;
        if s == streams.len() {
            let mut route: Route = stream_resources(cluster, &keys[s])
                .into_iter()
                .map(|r| {
                    *resource_ids.entry(r).or_insert_with(|| {
                        caps.push(capacity(cluster, r));
                        caps.len() - 1
                    }) as u32
                })
                .collect();
            route.sort_unstable();
            // A paced stream is a group of its own; its pace is numbered
            // once the cluster's resources are.
            let g = match paces.get(&keys[s]) {
                Some(&pace) => {
                    paced.push((groups.len(), pace));
                    groups.push(Group::new(route));
                    groups.len() - 1
                }
                None => *group_of.entry(route.clone()).or_insert_with(|| {
                    groups.push(Group::new(route));
                    groups.len() - 1
                }),
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
    for (g, pace) in paced {
        groups[g].route.push(caps.len() as u32);
        caps.push(pace);
    }
    (streams, groups, caps)
}

/// Simulate some of a plan's copies (one round, or all of them).
///
/// Events are stream starts and stream ends; after the events of one
/// instant the levels settle ([`Levels::settle`]), and each holder's next
/// end sits in one heap.
fn simulate_copies(plan: &Plan, copies: &[&BoxCopy]) -> SimReport {
    let (streams, groups, caps) = streams_of(plan, copies);
    let levels = Levels::new(caps);
    run(&streams, groups, levels, copies.len())
}

fn run(streams: &[Stream], mut groups: Vec<Group>, mut levels: Levels, messages: usize) -> SimReport {
    let mut releases: Vec<usize> = (0..streams.len()).collect();
    releases.sort_by(|&a, &b| streams[a].start.total_cmp(&streams[b].start).then(a.cmp(&b)));
    let mut next_release = 0;
    let mut makespan = 0.0f64;
    loop {
        // The next event: a stream starts, or a holder's first stream ends.
        let next_end = levels.ends.peek().map(|(t, _)| t);
        let next_start = releases.get(next_release).map(|&s| streams[s].start);
        let Some(now) = [next_end, next_start].into_iter().flatten().reduce(f64::min) else {
            break;
        };
        while let Some((t, r)) = levels.ends.peek() {
            if t > now {
                break;
            }
            levels.ends.remove(r);
            levels.finish(&mut groups, r, now, |s| {
                makespan = makespan.max(now.max(streams[s].last_issue));
            });
        }
        while next_release < releases.len() && streams[releases[next_release]].start <= now {
            let s = releases[next_release];
            levels.start(&mut groups, streams[s].group, s, streams[s].bytes, now);
            next_release += 1;
        }
        levels.settle(&mut groups, now);
    }
    if levels.active > 0 {
        // Streams left with no rate (a resource rounded down to nothing):
        // never report a makespan that leaves bytes in flight.
        makespan = f64::INFINITY;
    }
    SimReport {
        makespan_s: makespan,
        messages,
        streams: streams.len(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tenplan_ptc::{
        BoxCopy, Buffer, Cluster, ClusterData, DType, Layout, Piece, Plan, Problem, Region, Shard, TensorSpec,
    };

    use proptest::prelude::*;

    use super::simulate;

    /// One u8 tensor of `n` elements per source device; devices 4.. receive.
    fn plan(copies: &[(u32, u32, Option<u32>)], n: u64, latency_s: f64) -> Plan {
        let sized: Vec<_> = copies.iter().map(|&(s, d, v)| (s, d, v, n)).collect();
        plan_sized(&sized, latency_s)
    }

    /// Copy i moves tensor i, of its own size, from its source to its destination.
    fn plan_sized(copies: &[(u32, u32, Option<u32>, u64)], latency_s: f64) -> Plan {
        plan_on("2x4", copies, latency_s)
    }

    /// Copies of their own tensors on a cluster (NVLink 10x the NIC).
    fn plan_on(cluster: &str, copies: &[(u32, u32, Option<u32>, u64)], latency_s: f64) -> Plan {
        let tensors: Arc<[TensorSpec]> = copies
            .iter()
            .enumerate()
            .map(|(i, c)| TensorSpec::new(format!("t{i}"), DType::U8, [c.3]))
            .collect();
        let buf = |i: usize| {
            let n = copies[i].3;
            Buffer {
                name: format!("t{i}"),
                dtype: DType::U8,
                len: n,
                pieces: vec![Piece {
                    tensor: i as u32,
                    region: Region::full(&[n]),
                    offset: 0,
                }],
                partial: false,
            }
        };
        // One shard per device, holding the tensors placed on it.
        let layout = |devs: Vec<u32>| {
            let mut on: std::collections::BTreeMap<u32, Vec<Buffer>> = Default::default();
            for (i, &d) in devs.iter().enumerate() {
                on.entry(d).or_default().push(buf(i));
            }
            let shards = on
                .into_iter()
                .map(|(d, buffers)| Shard {
                    name: format!("s{d}"),
                    devices: vec![d],
                    buffers,
                })
                .collect();
            Layout::new(tensors.clone(), shards).unwrap()
        };
        let mut data: ClusterData = Cluster::parse(cluster).unwrap().data().clone();
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
            .map(|(i, &(src, dst, via, n))| BoxCopy {
                src,
                dst,
                via: via.into_iter().collect(),
                tensor: i as u32,
                region: Region::full(&[n]),
                // The destination's buffers are its tensors in copy order.
                buffer: copies[..i].iter().filter(|c| c.1 == dst).count() as u32,
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

    /// The simulation as first written: every event refills every active
    /// group from scratch. Slow and plainly right; the simulator must agree
    /// with it.
    fn reference(plan: &Plan) -> f64 {
        let copies: Vec<&BoxCopy> = plan.copies.iter().collect();
        let (streams, groups, caps) = super::streams_of(plan, &copies);
        let mut releases: Vec<usize> = (0..streams.len()).collect();
        releases.sort_by(|&a, &b| streams[a].start.total_cmp(&streams[b].start).then(a.cmp(&b)));
        let (mut next_release, mut now, mut makespan) = (0, 0.0f64, 0.0f64);
        // Per group: bytes served per stream, and its active streams.
        let mut served = vec![0.0f64; groups.len()];
        let mut pending: Vec<Vec<(f64, usize)>> = vec![Vec::new(); groups.len()];
        let mut active: Vec<usize> = Vec::new();
        let mut filler = super::filling::Filler::new(caps);
        loop {
            while next_release < releases.len() && streams[releases[next_release]].start <= now {
                let s = releases[next_release];
                next_release += 1;
                let g = streams[s].group;
                if pending[g].is_empty() {
                    active.push(g);
                }
                pending[g].push((served[g] + streams[s].bytes, s));
            }
            if active.is_empty() {
                match releases.get(next_release) {
                    Some(&s) => {
                        now = streams[s].start;
                        continue;
                    }
                    None => break,
                }
            }
            let routes: Vec<&[u32]> = active.iter().map(|&g| groups[g].route.as_slice()).collect();
            let weights: Vec<f64> = active.iter().map(|&g| pending[g].len() as f64).collect();
            let rates: Vec<f64> = filler.rates(&routes, &weights).into_iter().map(|r| r.0).collect();
            let mut dt = f64::INFINITY;
            for (k, &g) in active.iter().enumerate() {
                let fin = pending[g].iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
                dt = dt.min((fin - served[g]).max(0.0) / rates[k]);
            }
            if let Some(&s) = releases.get(next_release) {
                dt = dt.min(streams[s].start - now);
            }
            now += dt;
            let mut k = 0;
            active.retain(|&g| {
                served[g] += rates[k] * dt;
                k += 1;
                pending[g].retain(|&(fin, s)| {
                    let done = fin - served[g] <= 1e-9 * fin.max(1.0);
                    if done {
                        makespan = makespan.max(now.max(streams[s].last_issue));
                    }
                    !done
                });
                !pending[g].is_empty()
            });
        }
        makespan
    }

    fn agrees_with_reference(plan: &Plan) {
        let fast = simulate(plan).makespan_s;
        let slow = reference(plan);
        assert!(
            (fast - slow).abs() <= 1e-9 * slow.max(1e-12),
            "incremental {fast} vs reference {slow}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Random copies on two nodes of four devices (NVLink 10x the NIC),
        /// relayed or not, some paced, with and without message latency.
        #[test]
        fn incremental_rates_match_refilling_everything(
            copies in prop::collection::vec((0u32..8, 0u32..8, prop::option::of(0u32..8), 1u64..5000), 1..40),
            latency in prop::sample::select(vec![0.0, 0.5, 3.0]),
            paced in prop::collection::vec((0usize..40, 1u32..40), 0..4),
        ) {
            let copies: Vec<_> = copies
                .into_iter()
                .map(|(s, d, v, n)| (s, d, v.filter(|&v| v != s && v != d && s != d), n))
                .collect();
            let mut p = plan_sized(&copies, latency);
            for (i, rate) in paced {
                if let Some(c) = p.copies.get(i) {
                    let key = c.stream();
                    p.paces.push(tenplan_ptc::Pace { src: key.src, via: key.via, dst: key.dst, fanout: key.fanout, bytes_per_s: f64::from(rate) });
                }
            }
            p.paces.sort_by(|a, b| (a.src, a.dst, &a.via).cmp(&(b.src, b.dst, &b.via)));
            p.paces.dedup_by(|a, b| (a.src, a.dst, &a.via) == (b.src, b.dst, &b.via));
            super::levels::VERIFY.with(|v| v.set(true));
            agrees_with_reference(&p);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Many streams on eight two-device nodes: levels move, holders
        /// change and groups move between them at most events.
        #[test]
        fn levels_match_refilling_everything_on_crowded_networks(
            copies in prop::collection::vec((0u32..16, 0u32..16, prop::option::of(0u32..16), 1u64..3000), 20..150),
            latency in prop::sample::select(vec![0.0, 0.2]),
        ) {
            let copies: Vec<_> = copies
                .into_iter()
                .map(|(s, d, v, n)| (s, d, v.filter(|&v| v != s && v != d && s != d), n))
                .collect();
            // Every settle checked against progressive filling, too.
            super::levels::VERIFY.with(|v| v.set(true));
            agrees_with_reference(&plan_on("8x2", &copies, latency));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(100))]
        /// Multicasts forwarded anywhere (a device sending once per
        /// forward) among plain copies: every settle agrees with
        /// progressive filling.
        #[test]
        fn levels_match_refilling_everything_with_multicasts(
            copies in prop::collection::vec((0u32..16, 0u32..16, prop::collection::vec(0u32..16, 0..4), 1u64..3000), 5..60),
        ) {
            let plain: Vec<_> = copies.iter().map(|&(s, d, _, n)| (s, d, None, n)).collect();
            let mut p = plan_on("8x2", &plain, 0.0);
            for (c, (s, d, fanout, _)) in p.copies.iter_mut().zip(&copies) {
                let mut seen = vec![*s, *d];
                for &f in fanout {
                    if !seen.contains(&f) {
                        seen.push(f);
                        c.fanout.push(tenplan_ptc::Forward::new(f, 0, 0));
                    }
                }
            }
            super::levels::VERIFY.with(|v| v.set(true));
            agrees_with_reference(&p);
        }
    }

    /// An all-to-all between 40 and 40 single-device nodes: 1,600 streams
    /// on routes of their own, and most rates move at every end. It agrees
    /// with the reference, and so does the fallback that refills everything
    /// (forced here after a few settling steps).
    #[test]
    fn an_all_to_all_agrees_with_the_reference() {
        let copies: Vec<_> = (0..40u32)
            .flat_map(|s| (0..40u32).map(move |d| (s, 40 + d, None, 1000 + u64::from((s * 7 + d * 13) % 97) * 10)))
            .collect();
        let plan = plan_on("80x1", &copies, 0.0);
        let slow = reference(&plan);
        let fast = simulate(&plan).makespan_s;
        assert!((fast - slow).abs() <= 1e-9 * slow, "{fast} vs {slow}");
        let refilled = with_step_limit(&plan, 3);
        assert!((refilled - slow).abs() <= 1e-9 * slow, "{refilled} vs {slow}");
    }

    /// The simulation with everything refilled after `limit` settling steps.
    fn with_step_limit(plan: &Plan, limit: u64) -> f64 {
        let copies: Vec<&BoxCopy> = plan.copies.iter().collect();
        let (streams, groups, caps) = super::streams_of(plan, &copies);
        let levels = super::Levels::new(caps).with_step_limit(limit);
        super::run(&streams, groups, levels, copies.len()).makespan_s
    }

    /// Every baseline's plan of a real reshard, and `lp`'s, `least-loaded`'s
    /// and `hotspa`'s of random problems (failures, storage, uneven layouts).
    fn baseline_plans() -> Vec<Plan> {
        let mut plans = Vec::new();
        let problem = crate::gpt3_reshard();
        for name in ["lp", "tenplex", "central", "least-loaded", "hotspa"] {
            plans.push(crate::planner(name).unwrap().plan(&problem).unwrap());
        }
        for seed in 0..20 {
            let problem = tenplan_proofs::random_problem(seed);
            for name in ["lp", "least-loaded", "hotspa"] {
                if let Ok(plan) = crate::planner(name).unwrap().plan(&problem) {
                    plans.push(plan);
                }
            }
        }
        plans
    }

    #[test]
    fn incremental_rates_match_refilling_everything_on_baseline_plans() {
        for plan in &baseline_plans() {
            agrees_with_reference(plan);
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
    fn a_device_that_forwards_to_k_others_sends_k_times() {
        // 0 -> 1, forwarded on to 2 and 3 (four single-device nodes): the
        // NIC of device 1 sends the 1000 B twice, at 10 B/s.
        let mut p = plan_on("4x1", &[(0, 1, None, 1000)], 0.0);
        p.copies[0].fanout = [2, 3]
            .into_iter()
            .map(|dst| tenplan_ptc::Forward::new(dst, 0, 0))
            .collect();
        let r = simulate(&p);
        assert!((r.makespan_s - 200.0).abs() < 1e-6, "{}", r.makespan_s);
        super::levels::VERIFY.with(|v| v.set(true));
        agrees_with_reference(&p);
    }

    #[test]
    fn relays_use_both_hops_at_once() {
        // 0 -> 1 -> 5: NVLink then the NIC, pipelined: the NIC bounds it.
        let r = simulate(&plan(&[(0, 5, Some(1))], 1000, 0.0));
        assert!((r.makespan_s - 100.0).abs() < 1e-6, "{}", r.makespan_s);
        assert_eq!(r.streams, 1);
    }
}
