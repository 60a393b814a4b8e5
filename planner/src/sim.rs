//! A flow-level simulator: links shared max-min fairly, plus per-message costs.
//!
//! Model: every hop of every copy is a flow over the resources of its route
//! (cost model, DESIGN §3). A device posts its messages one at a time in plan
//! order, each costing the cluster's message latency, so message k of a
//! device starts flowing at `(k + 1) · latency` at the earliest. A relayed
//! copy is store-and-forward: the relay posts the second hop when the first
//! has arrived. Active flows share every resource max-min fairly (progressive
//! filling). Flows with the same route always get the same rate, so they are
//! simulated as one group with a virtual clock, and each event costs
//! O(groups · resources) rather than O(flows).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use tenplan_ptc::{DeviceId, Plan};

use crate::cost::{capacity, copy_bytes, hop, hops, Resource};

/// What the simulator measured.
#[derive(Clone, Debug, PartialEq)]
pub struct SimReport {
    /// Time until the last byte lands, in seconds.
    pub makespan_s: f64,
    /// Messages simulated (hops of copies).
    pub messages: usize,
}

#[derive(Clone, Copy, PartialEq)]
struct Time(f64);
impl Eq for Time {}
impl PartialOrd for Time {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Time {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

struct Hop {
    src: DeviceId,
    dst: DeviceId,
    bytes: f64,
    next: Option<usize>,
}

#[derive(Default)]
struct Group {
    resources: Vec<Resource>,
    /// Bytes served to each active flow so far.
    virtual_bytes: f64,
    /// Active flows: (virtual bytes at which they finish, hop index).
    active: BinaryHeap<Reverse<(Time, usize)>>,
    rate: f64,
}

/// Simulate a plan; the plan is assumed to be valid (run the checker first).
pub fn simulate(plan: &Plan) -> SimReport {
    let cluster = plan.problem.cluster();
    let latency = cluster.latency_s();
    let mut hops_: Vec<Hop> = Vec::new();
    let mut first: Vec<usize> = Vec::new();
    for c in &plan.copies {
        let b = copy_bytes(plan, c) as f64;
        let hs = hops(c);
        let base = hops_.len();
        for (i, &(s, d)) in hs.iter().enumerate() {
            hops_.push(Hop {
                src: s,
                dst: d,
                bytes: b,
                next: (i + 1 < hs.len()).then_some(base + i + 1),
            });
        }
        first.push(base);
    }
    // Each device's message issue clock.
    let mut issue: BTreeMap<DeviceId, f64> = BTreeMap::new();
    let mut releases: BinaryHeap<Reverse<(Time, usize)>> = BinaryHeap::new();
    let mut post = |h: usize, ready: f64, hops_: &[Hop], releases: &mut BinaryHeap<Reverse<(Time, usize)>>| {
        let clock = issue.entry(hops_[h].src).or_insert(0.0);
        *clock = clock.max(ready) + latency;
        releases.push(Reverse((Time(*clock), h)));
    };
    for &h in &first {
        post(h, 0.0, &hops_, &mut releases);
    }
    let mut groups: Vec<Group> = Vec::new();
    let mut group_of: BTreeMap<Vec<Resource>, usize> = BTreeMap::new();
    let mut now = 0.0f64;
    let mut active_groups: Vec<usize> = Vec::new();
    loop {
        // Admit every flow released by now.
        while let Some(&Reverse((Time(t), h))) = releases.peek() {
            if t > now {
                break;
            }
            releases.pop();
            let route = hop(cluster, hops_[h].src, hops_[h].dst);
            let gi = *group_of.entry(route.clone()).or_insert_with(|| {
                groups.push(Group {
                    resources: route,
                    ..Group::default()
                });
                groups.len() - 1
            });
            let g = &mut groups[gi];
            if g.active.is_empty() {
                active_groups.push(gi);
            }
            g.active.push(Reverse((Time(g.virtual_bytes + hops_[h].bytes), h)));
        }
        if active_groups.is_empty() {
            match releases.peek() {
                Some(&Reverse((Time(t), _))) => {
                    now = t;
                    continue;
                }
                None => break,
            }
        }
        fair_rates(&mut groups, &active_groups, |r| capacity(cluster, r));
        // Next event: a completion or a release.
        let mut dt = f64::INFINITY;
        for &gi in &active_groups {
            let g = &groups[gi];
            let Reverse((Time(fin), _)) = *g.active.peek().expect("active groups have flows");
            dt = dt.min((fin - g.virtual_bytes).max(0.0) / g.rate);
        }
        if let Some(&Reverse((Time(t), _))) = releases.peek() {
            dt = dt.min(t - now);
        }
        now += dt;
        let mut still = Vec::with_capacity(active_groups.len());
        for &gi in &active_groups {
            let g = &mut groups[gi];
            g.virtual_bytes += g.rate * dt;
            // Finish flows within a relative tolerance of their size.
            while let Some(&Reverse((Time(fin), h))) = g.active.peek() {
                if fin - g.virtual_bytes > 1e-9 * fin.max(1.0) {
                    break;
                }
                g.active.pop();
                if let Some(n) = hops_[h].next {
                    post(n, now, &hops_, &mut releases);
                }
            }
            if !g.active.is_empty() {
                still.push(gi);
            }
        }
        active_groups = still;
    }
    SimReport {
        makespan_s: now,
        messages: hops_.len(),
    }
}

/// Max-min fair rates by progressive filling: repeatedly saturate the
/// resource with the smallest fair share and freeze the flows through it.
fn fair_rates(groups: &mut [Group], active: &[usize], cap: impl Fn(Resource) -> f64) {
    let mut left: BTreeMap<Resource, (f64, f64)> = BTreeMap::new();
    for &gi in active {
        let n = groups[gi].active.len() as f64;
        for &r in &groups[gi].resources {
            left.entry(r).or_insert((cap(r), 0.0)).1 += n;
        }
    }
    let mut unfrozen: Vec<usize> = active.to_vec();
    while !unfrozen.is_empty() {
        let (&bottleneck, &(c, n)) = left
            .iter()
            .filter(|(_, v)| v.1 > 0.0)
            .min_by(|a, b| (a.1 .0 / a.1 .1).total_cmp(&(b.1 .0 / b.1 .1)))
            .expect("unfrozen flows cross some resource");
        let share = (c / n).max(0.0);
        let mut rest = Vec::with_capacity(unfrozen.len());
        for gi in unfrozen {
            if groups[gi].resources.contains(&bottleneck) {
                groups[gi].rate = share;
                let n = groups[gi].active.len() as f64;
                for r in &groups[gi].resources {
                    let e = left.get_mut(r).expect("resource registered");
                    e.0 -= share * n;
                    e.1 -= n;
                }
            } else {
                rest.push(gi);
            }
        }
        left.get_mut(&bottleneck).expect("resource registered").1 = 0.0;
        unfrozen = rest;
    }
}
