//! Unit tests of the LP's parts against slow oracles.

use super::certify::{RouteCosts, RoutePrices};
use super::disaggregate::integral_split;
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
