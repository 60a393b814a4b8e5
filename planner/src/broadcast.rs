//! The yardstick for weight syncs (RL post-training) that broadcast:
//! MoonshotAI's checkpoint-engine gathers each bucket of weights on one
//! trainer rank and broadcasts it to every inference rank, and each keeps
//! its part. Every engine device then receives every weight, needed or not.
//!
//! A plan cannot say "receive and discard" (a copy's destinations are
//! pieces of the target layout), so this policy is not a [`Plan`] the
//! checker could judge. What it can be given is a floor: no broadcast of
//! this kind, however pipelined, is faster, because it must push every byte
//! it does not already hold into each engine device and each engine node.
//!
//! [`Plan`]: tenplan_ptc::Plan

use std::collections::BTreeSet;

use serde::Serialize;
use tenplan_ptc::{DeviceId, Problem};

/// The least time a bucketed broadcast of all weights to every target
/// device takes on a problem's cluster, and what forces it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BroadcastFloor {
    /// Seconds.
    pub seconds: f64,
    /// Bytes of weights the broadcast delivers to each engine device.
    pub bytes: u64,
    /// The cut that forces it.
    pub reason: String,
}

/// The floor of a bucketed broadcast (see the module documentation): the
/// largest of, over the target's devices, the weights a device does not
/// hold over its ingress (intra-node link plus its NIC), and over the
/// target's nodes, the weights the node does not hold over its NICs'
/// ingress. Bytes held are counted generously (a replica or padding counts
/// as held) so that the floor stays below any broadcast's time.
pub fn broadcast_floor(problem: &Problem) -> BroadcastFloor {
    let cluster = problem.cluster();
    let bw = cluster.bandwidth();
    let total: u64 = problem.tensors().iter().map(|t| t.bytes()).sum();
    let source = problem.source();
    let held = |d: DeviceId| if cluster.is_live(d) { source.device_bytes(d) } else { 0 };
    let mut worst = BroadcastFloor {
        seconds: 0.0,
        bytes: total,
        reason: "every engine device already holds the weights".to_string(),
    };
    let mut consider = |seconds: f64, reason: &dyn Fn() -> String| {
        if seconds > worst.seconds {
            worst.seconds = seconds;
            worst.reason = reason();
        }
    };
    let mut nodes = BTreeSet::new();
    for d in problem.target().devices() {
        let need = total.saturating_sub(held(d));
        let ingress = bw.intra_node + bw.nic;
        consider(need as f64 / ingress, &|| format!("ingress of device {d}"));
        nodes.insert(cluster.node_of(d));
    }
    let per_node = cluster.gpus_per_node();
    for &node in &nodes {
        let on_node: u64 = (node * per_node..(node + 1) * per_node).map(held).sum();
        let need = total.saturating_sub(on_node);
        let ingress = f64::from(cluster.nics_per_node()) * bw.nic;
        consider(need as f64 / ingress, &|| format!("NIC ingress of node {node}"));
    }
    if worst.seconds > 0.0 {
        worst.seconds += cluster.latency_s();
    }
    worst
}

#[cfg(test)]
mod tests {
    use tenplan_models::{find, ModelState, StateKind};
    use tenplan_ptc::{Cluster, DType};

    use super::*;
    use crate::{lower_bound, planner, simulate};

    fn sync(from: &str, to: &str, cluster: &str) -> Problem {
        let state = ModelState::new(find("llama2-7b").unwrap(), StateKind::Weights(DType::BF16));
        let source = state.layout(&from.parse().unwrap()).unwrap();
        let target = state.serving_layout(&to.parse().unwrap()).unwrap();
        Problem::new(source, target, Cluster::parse(cluster).unwrap()).unwrap()
    }

    #[test]
    fn every_engine_node_receives_every_weight() {
        // Trainer on node 0, two tp=4 engines on node 1: the node must take
        // in all 13.5 GB over its NICs whatever the plan.
        let p = sync("tp=8", "tp=4,dp=2,devices=8-15", "dgx-h100:2");
        let f = broadcast_floor(&p);
        let total: u64 = p.tensors().iter().map(|t| t.bytes()).sum();
        assert_eq!(f.bytes, total);
        let c = p.cluster();
        let node = total as f64 / (f64::from(c.nics_per_node()) * c.bandwidth().nic) + c.latency_s();
        assert!((f.seconds - node).abs() < 1e-9, "{} vs {node}", f.seconds);
        assert_eq!(f.reason, "NIC ingress of node 1");
    }

    #[test]
    fn a_broadcast_is_never_faster_than_what_the_engines_need() {
        // One tp=8 engine over two nodes of four, fed by two trainer nodes:
        // each engine node needs half the weights, the broadcast sends them
        // all, so the floor sits twice above the plan's bound and the
        // optimal plan beats it.
        let p = sync("tp=4,dp=2", "tp=8,devices=8-15", "4x4");
        let f = broadcast_floor(&p);
        let bound = lower_bound(&p).unwrap();
        assert!(f.seconds >= bound.seconds * 1.9, "{} vs {}", f.seconds, bound.seconds);
        let plan = planner("lp").unwrap().plan(&p).unwrap();
        let sim = simulate(&plan).makespan_s;
        assert!(sim < f.seconds, "{sim} vs {f:?} bound {bound:?}");
    }

    #[test]
    fn engines_on_the_trainers_devices_receive_over_nvlink_only() {
        let p = sync("tp=8", "tp=4,dp=2", "dgx-h100:1");
        let f = broadcast_floor(&p);
        assert!(f.reason.starts_with("ingress of device"), "{}", f.reason);
        assert!(f.seconds > 0.0);
    }
}
