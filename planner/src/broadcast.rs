//! The yardstick for weight syncs (RL post-training) that broadcast:
//! MoonshotAI's checkpoint-engine packs weights into buckets, each on the
//! rank that owns it, and broadcasts each bucket to every inference rank,
//! and each keeps its part. Every engine device then receives every weight,
//! needed or not.
//!
//! Two faces of it:
//! - [`Broadcast`], the policy as a plan (`broadcast`), which the checker
//!   judges and the simulator times like any other: each box goes from the
//!   trainer rank that owns it along a chain of every engine device, as
//!   NCCL's ring broadcast pipelines it; a device that needs
//!   the box keeps it as it passes ([`Forward::in_passing`]), the others
//!   only relay it.
//! - [`broadcast_floor`], a floor under any broadcast of this kind,
//!   however pipelined: it must push every byte a device does not already
//!   hold into each engine device and each engine node.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use tenplan_ptc::{BoxCopy, DeviceId, Forward, Forwarding, Plan, Problem};

use crate::intersect::{fragments, padding_fills, Fragment};
use crate::trees::trees_of;
use crate::{Error, Planner, Result};

/// Bytes per bucket: checkpoint-engine gathers and broadcasts buckets of a
/// few GiB, sized to the GPU memory it may borrow.
pub const BUCKET_BYTES: u64 = 2 << 30;

/// checkpoint-engine's bucketed broadcast (`broadcast`). Each box is
/// owned by one of its holders (the one that owns the fewest bytes so
/// far); each owner packs its boxes, in tensor order, into buckets of
/// [`BUCKET_BYTES`]. Round `i` (a staging round) broadcasts every owner's
/// `i`-th bucket side by side (checkpoint-engine sends one bucket at a
/// time, but as one message, where the simulator charges each box its
/// latency at the sender), every box of a bucket from its owner along a chain of every
/// engine device that does not hold it, in node order, each node entered
/// once. The chain ends on a device that needs the box; the others that
/// need it keep it as it passes. The boxes of a bucket are spread over one
/// ring per device of a node, as NCCL's channels spread a broadcast over
/// the NICs; the owner reaches a ring's first node through the device of
/// its own node on that ring's rail. Boxes an engine device already holds
/// are copied locally, not broadcast (generous to the policy, as the floor
/// is). The problem must allow forwarding across the cluster
/// ([`Forwarding::Cluster`], as weight syncs pose it).
#[derive(Clone, Copy, Debug, Default)]
pub struct Broadcast;

impl Planner for Broadcast {
    fn name(&self) -> &'static str {
        "broadcast"
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        // Every engine node passes each box on to the next.
        if problem.forwarding() != Forwarding::Cluster {
            return Err(Error::NeedsClusterForwarding { planner: self.name() });
        }
        let frags = fragments(problem)?;
        Ok(broadcast_plan(problem, &frags, self.name()))
    }
}

fn broadcast_plan(problem: &Problem, frags: &[Fragment], name: &str) -> Plan {
    let cluster = problem.cluster();
    let n = cluster.num_devices() as usize;
    // The engine devices, node by node, in ring order.
    let engines: Vec<(u32, DeviceId)> = problem
        .target()
        .devices()
        .filter(|&d| cluster.is_live(d))
        .map(|d| (cluster.node_of(d), d))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let nodes: Vec<Vec<DeviceId>> = engines
        .chunk_by(|a, b| a.0 == b.0)
        .map(|run| run.iter().map(|&(_, d)| d).collect())
        .collect();
    let mut engine = vec![false; n];
    for &(_, d) in &engines {
        engine[d as usize] = true;
    }
    // Owners, then each owner's buckets.
    let trees = trees_of(problem, frags, true);
    let mut copies: Vec<BoxCopy> = Vec::new();
    let mut owned = vec![0u64; n];
    // Per owner: its buckets, and the bytes of the last.
    let mut by_owner: BTreeMap<DeviceId, (Vec<Vec<usize>>, u64)> = BTreeMap::new();
    for (k, tree) in trees.iter().enumerate() {
        let first = &frags[tree[0] as usize];
        if tree.len() == 1 && first.holders.contains(&first.dst) {
            copies.push(first.copy(first.dst, Vec::new(), first.region.clone()));
            continue;
        }
        let owner = *first
            .holders
            .iter()
            .min_by_key(|&&h| (owned[h as usize], h))
            .expect("fragments have live holders");
        let (buckets, bytes) = by_owner.entry(owner).or_default();
        match buckets.last_mut() {
            Some(b) if *bytes + first.bytes <= BUCKET_BYTES => b.push(k),
            _ => {
                buckets.push(vec![k]);
                *bytes = 0;
            }
        }
        *bytes += first.bytes;
        owned[owner as usize] += first.bytes;
    }
    // Round `i`: every owner's `i`-th bucket, side by side.
    let mut buckets: Vec<(usize, DeviceId, Vec<usize>)> = by_owner
        .into_iter()
        .flat_map(|(owner, (list, _))| list.into_iter().enumerate().map(move |(i, b)| (i, owner, b)))
        .collect();
    buckets.sort_by_key(|b| (b.0, b.1));
    let (mut holds, mut needs) = (vec![false; n], vec![false; n]);
    let mut chain: Vec<DeviceId> = Vec::new();
    let gpn = cluster.gpus_per_node();
    for (round, owner, bucket) in buckets {
        for k in bucket {
            let tree = &trees[k];
            let first = &frags[tree[0] as usize];
            for &h in first.holders.iter() {
                holds[h as usize] = true;
            }
            for &i in tree {
                needs[frags[i as usize].dst as usize] = true;
            }
            // The last node (in node order) with a device that needs the
            // box, and its last such device.
            let (end, at) = nodes
                .iter()
                .enumerate()
                .rev()
                .find_map(|(e, devices)| {
                    devices
                        .iter()
                        .rposition(|&d| needs[d as usize] && !holds[d as usize])
                        .map(|at| (e, at))
                })
                .expect("a box that is broadcast has a receiver");
            // The chain starts on the node after it and ends there, on its
            // last device that needs the box, taking the ring that enters
            // that node on the device after that one. Ring `c` enters the node at
            // position `k` on its device `c - k` and leaves it from the
            // device before, whose NIC is on the rail of the next node's
            // entry. (A ring per destination keeps the distinct routes few;
            // destinations spread the boxes over the rings evenly.)
            let last = &nodes[end];
            let rings = last.len();
            let channel = (at + 1 + nodes.len()) % rings;
            chain.clear();
            for k in 1..=nodes.len() {
                let devices = &nodes[(end + k) % nodes.len()];
                let entry = (channel + devices.len() * k - k) % devices.len();
                let ring = devices[entry..].iter().chain(&devices[..entry]);
                chain.extend(ring.copied().filter(|&d| !holds[d as usize]));
            }
            let dst = last[at];
            chain.retain(|&x| x != dst);
            // The chain's first device: the owner reaches it on its rail.
            let first_hop = chain.first().copied().unwrap_or(dst);
            let rail = cluster.node_of(owner) * gpn + first_hop % gpn;
            // (An engine device that does not hold the box is on the chain.)
            let relay = (rail != owner
                && cluster.is_live(rail)
                && cluster.node_of(rail) != cluster.node_of(first_hop)
                && !holds[rail as usize]
                && !engine[rail as usize])
                .then_some(rail);
            let lead = tree
                .iter()
                .map(|&i| &frags[i as usize])
                .find(|f| f.dst == dst)
                .expect("the chain ends on a member");
            let via: Vec<DeviceId> = relay.into_iter().chain(chain.iter().copied()).collect();
            let mut copy = lead.copy(owner, via, lead.region.clone());
            copy.round = round as u32;
            copy.fanout = tree
                .iter()
                .map(|&i| &frags[i as usize])
                .filter(|f| f.dst != dst)
                .map(|f| Forward {
                    in_passing: true,
                    ..Forward::new(f.dst, f.buffer, f.offset)
                })
                .collect();
            copies.push(copy);
            for &h in first.holders.iter() {
                holds[h as usize] = false;
            }
            for &i in tree {
                needs[frags[i as usize].dst as usize] = false;
            }
        }
    }
    Plan {
        planner: name.to_string(),
        problem: problem.clone(),
        copies,
        fills: padding_fills(problem),
        paces: Vec::new(),
    }
}

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
