//! Broadcast trees: a box that several devices need goes once from a
//! holder to one of them, its *leader*, which forwards it to the others as
//! it arrives (a multicast copy, see [`tenplan_ptc::BoxCopy::fanout`]).
//!
//! It is how the engine replicas of a weight sync should share the weights:
//! sending every replica its own copy from the trainer makes the trainer's
//! NICs carry the weights once per replica, while a tree carries them out
//! of the trainer once and spreads the forwarding over the receivers, whose
//! links would otherwise idle. With 64 engines of 8 GPUs fed by 32 trainer
//! nodes, the trainer's egress took 7.4 s where each engine's ingress needs
//! 3.4 s.
//!
//! Where the problem allows forwarding across the cluster
//! ([`Forwarding::Cluster`]) a tree spans the devices that need the box
//! and are alone on their node (devices that share a node take it in once,
//! by a copy of their own forwarded within the node); otherwise only the devices of
//! one node that no holder sits on (the multicasts the checker accepts
//! there). Leaders and senders are chosen
//! greedily, largest trees first, each the device that has sent least so
//! far, so that forwarding spreads evenly over a box's receivers.

use std::hash::{Hash, Hasher};

use tenplan_ptc::{BoxCopy, DeviceId, Forward, Forwarding, Plan, Problem};

use crate::intersect::{fragments, Fragment, HolderNodes};
use crate::{Planner, Result};

/// The broadcast-tree planner (`trees`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Trees;

impl Planner for Trees {
    fn name(&self) -> &'static str {
        "trees"
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        let frags = fragments(problem)?;
        Ok(tree_plan(problem, &frags, self.name()))
    }
}

/// The fragments that one multicast copy may serve: the same box of the
/// same datum from the same holders (and, forwarding within nodes only,
/// destinations on one node that no holder sits on). Each list is in
/// fragment order; lists are in order of their first fragment. `wide`:
/// trees may span nodes (the problem's forwarding, or a policy of relays).
pub(crate) fn trees_of(problem: &Problem, frags: &[Fragment], wide: bool) -> Vec<Vec<u32>> {
    let cluster = problem.cluster();
    let mut nodes_of = HolderNodes::new(cluster);
    // The node a tree is confined to (`u32::MAX`: none), or `None` where
    // the fragment is served by a copy of its own: a holder's own copy, or
    // within nodes, a holder on the destination's node. (Every fragment
    // has a live holder: `fragments` says so otherwise.)
    let scope = |f: &Fragment, nodes_of: &mut HolderNodes<'_>| -> Option<u32> {
        let n = cluster.node_of(f.dst);
        let holder_nodes = nodes_of.of(&f.holders);
        let local = holder_nodes.binary_search(&n).is_ok() && f.holders.contains(&f.dst);
        if local {
            None
        } else if wide {
            Some(u32::MAX)
        } else if holder_nodes.binary_search(&n).is_err() {
            Some(n)
        } else {
            None
        }
    };
    // Grouped by sorting on a hash of the key, then split by the key
    // itself within a run (millions of fragments).
    let mut keyed: Vec<(u64, u32, u32)> = Vec::with_capacity(frags.len());
    let mut single: Vec<u32> = Vec::new();
    for (i, f) in frags.iter().enumerate() {
        match scope(f, &mut nodes_of) {
            Some(node) => {
                let mut h = std::hash::DefaultHasher::new();
                (node, f.tensor, f.reduce, &f.region, &f.holders[..]).hash(&mut h);
                keyed.push((h.finish(), i as u32, node));
            }
            None => single.push(i as u32),
        }
    }
    keyed.sort_unstable();
    let mut out: Vec<Vec<u32>> = single.into_iter().map(|i| vec![i]).collect();
    let same_box = |f: &Fragment, g: &Fragment| {
        g.tensor == f.tensor && g.reduce == f.reduce && g.region == f.region && g.holders == f.holders
    };
    let mut dsts: Vec<DeviceId> = Vec::new();
    for run in keyed.chunk_by(|a, b| a.0 == b.0) {
        // Hash collisions aside, a run is one tree (checked in one pass
        // over it: runs of a thousand members are common).
        let first = &frags[run[0].1 as usize];
        dsts.clear();
        dsts.extend(run.iter().map(|&(_, i, _)| frags[i as usize].dst));
        dsts.sort_unstable();
        if dsts.windows(2).all(|w| w[0] != w[1])
            && run
                .iter()
                .all(|&(_, i, node)| node == run[0].2 && same_box(first, &frags[i as usize]))
        {
            out.push(run.iter().map(|&(_, i, _)| i).collect());
            continue;
        }
        // Otherwise one tree per key; a destination needs a box once, so a
        // repeated one starts a tree of its own.
        let mut trees: Vec<(u32, Vec<u32>)> = Vec::new();
        for &(_, i, node) in run {
            let f = &frags[i as usize];
            let same = |t: &(u32, Vec<u32>)| {
                t.0 == node
                    && same_box(f, &frags[t.1[0] as usize])
                    && t.1.iter().all(|&j| frags[j as usize].dst != f.dst)
            };
            match trees.iter_mut().find(|t| same(t)) {
                Some(t) => t.1.push(i),
                None => trees.push((node, vec![i])),
            }
        }
        out.extend(trees.into_iter().map(|t| t.1));
    }
    out.sort_unstable_by_key(|t| t[0]);
    out
}

/// A plan of one copy per tree: from the holder that has sent least, to
/// the member that has sent least, forwarded to the other members; its
/// streams paced to end together (see [`crate::issue::paces`]).
///
/// Across the cluster, the members that share a node with another member
/// get a copy of their own per node, forwarded within it: a leader that
/// sent the box to each of them would bring it into their node once per
/// member, where the node needs it once (the kv heads that two ranks of a
/// tensor-parallel engine share). The tree keeps the members alone on
/// their node.
pub(crate) fn tree_plan(problem: &Problem, frags: &[Fragment], name: &str) -> Plan {
    let cluster = problem.cluster();
    let wide = problem.forwarding() == Forwarding::Cluster;
    let trees = trees_of(problem, frags, wide);
    // Largest forwarding first (longest-processing-time order), ties in
    // fragment order: the plan is deterministic.
    let mut order: Vec<usize> = (0..trees.len()).collect();
    let weight = |t: &[u32]| frags[t[0] as usize].bytes * t.len() as u64;
    order.sort_by_key(|&k| (std::cmp::Reverse(weight(&trees[k])), trees[k][0]));
    // Bytes each device has sent or forwarded so far.
    let mut sent = vec![0u64; cluster.num_devices() as usize];
    let least = |devices: &mut dyn Iterator<Item = DeviceId>, sent: &[u64]| {
        devices
            .min_by_key(|&d| (sent[d as usize], d))
            .expect("a tree has members and holders")
    };
    let mut copies = Vec::with_capacity(trees.len());
    // One copy from a holder to the members' leader, forwarded to the rest.
    let emit = |members: &[u32], sent: &mut [u64], copies: &mut Vec<BoxCopy>| {
        let first = &frags[members[0] as usize];
        let bytes = first.bytes;
        let leader = least(&mut members.iter().map(|&i| frags[i as usize].dst), sent);
        let src = least(&mut first.holders.iter().copied(), sent);
        sent[src as usize] += bytes;
        sent[leader as usize] += bytes * (members.len() as u64 - 1);
        let lead = members
            .iter()
            .map(|&i| &frags[i as usize])
            .find(|f| f.dst == leader)
            .expect("the leader is a member");
        let mut copy = lead.copy(src, Vec::new(), lead.region.clone());
        copy.fanout = members
            .iter()
            .map(|&i| &frags[i as usize])
            .filter(|f| f.dst != leader)
            .map(|f| Forward::new(f.dst, f.buffer, f.offset))
            .collect();
        copies.push(copy);
    };
    let mut by_node: Vec<(u32, u32)> = Vec::new();
    let mut alone: Vec<u32> = Vec::new();
    for k in order {
        let tree = &trees[k];
        let first = &frags[tree[0] as usize];
        if first.holders.contains(&first.dst) && tree.len() == 1 {
            copies.push(first.copy(first.dst, Vec::new(), first.region.clone()));
            continue;
        }
        if !wide {
            emit(tree, &mut sent, &mut copies);
            continue;
        }
        by_node.clear();
        by_node.extend(tree.iter().map(|&i| (cluster.node_of(frags[i as usize].dst), i)));
        by_node.sort_unstable();
        alone.clear();
        let mut shared: Vec<Vec<u32>> = Vec::new();
        for run in by_node.chunk_by(|a, b| a.0 == b.0) {
            match run {
                [(_, i)] => alone.push(*i),
                _ => shared.push(run.iter().map(|&(_, i)| i).collect()),
            }
        }
        if !alone.is_empty() {
            emit(&alone, &mut sent, &mut copies);
        }
        for members in &shared {
            emit(members, &mut sent, &mut copies);
        }
    }
    // Issued round-robin over the streams and paced so that they end
    // together, as the `lp` planner's copies are.
    crate::issue::finish(name, problem, copies)
}

#[cfg(test)]
mod tests {
    use tenplan_models::{find, ModelState, StateKind};
    use tenplan_proofs::{run_and_compare, verify, Violation};
    use tenplan_ptc::{Cluster, DType, Forwarding, Problem};

    use super::Trees;
    use crate::{cut_lower_bound, fragments, simulate, trivial_lower_bound, Loads, Planner};

    /// LLaMA-tiny's weights from a tp=4 trainer to four engine replicas
    /// (tp=2) on `cluster` (devices 4-11).
    fn sync_on(cluster: &str, forwarding: Forwarding) -> Problem {
        let state = ModelState::new(find("llama-tiny").unwrap(), StateKind::Weights(DType::BF16));
        Problem::new(
            state.layout(&"tp=4".parse().unwrap()).unwrap(),
            state
                .serving_layout(&"tp=2,dp=4,devices=4-11".parse().unwrap())
                .unwrap(),
            Cluster::parse(cluster).unwrap(),
        )
        .unwrap()
        .with_forwarding(forwarding)
    }

    /// One engine replica per node, on four nodes of two devices.
    fn sync(forwarding: Forwarding) -> Problem {
        sync_on("6x2", forwarding)
    }

    #[test]
    fn members_that_share_a_node_take_the_box_into_it_once() {
        // Two replicas on each of two nodes: each node needs each box
        // twice, and takes it in once, forwarded within the node.
        let problem = sync_on("3x4", Forwarding::Cluster);
        let plan = Trees.plan(&problem).unwrap();
        verify(&plan).unwrap();
        run_and_compare(&plan, 5).unwrap();
        let cluster = problem.cluster();
        for c in &plan.copies {
            assert!(c
                .fanout
                .iter()
                .all(|f| cluster.node_of(f.dst) == cluster.node_of(c.dst)));
        }
        let total: u64 = problem.tensors().iter().map(|t| t.bytes()).sum();
        assert_eq!(Loads::of(&plan).cross_node, 2 * total);
    }

    #[test]
    fn trees_forward_across_nodes_only_where_the_problem_allows_it() {
        let wide = Trees.plan(&sync(Forwarding::Cluster)).unwrap();
        verify(&wide).unwrap();
        run_and_compare(&wide, 3).unwrap();
        let cluster = wide.problem.cluster();
        let across = |c: &tenplan_ptc::BoxCopy| {
            c.fanout
                .iter()
                .any(|f| cluster.node_of(f.dst) != cluster.node_of(c.dst))
        };
        assert!(wide.copies.iter().any(across), "no tree spans two nodes");
        // The same copies where forwarding stays within nodes: refused.
        let mut narrow = wide.clone();
        narrow.problem = sync(Forwarding::Node);
        assert!(matches!(verify(&narrow), Err(Violation::BadFanout { .. })));
        // Planned within nodes, trees stay there and the plan is valid.
        let inside = Trees.plan(&sync(Forwarding::Node)).unwrap();
        verify(&inside).unwrap();
        assert!(!inside.copies.iter().any(across));
    }

    /// Random problems (partial sums, dead devices, uneven layouts) under
    /// both forwardings: the trees', `lp`'s and (across the cluster) the
    /// broadcast's plans pass the checker, the interpreter agrees, and no
    /// plan beats the bound.
    #[test]
    fn random_problems_are_planned_validly_under_either_forwarding() {
        let (mut planned, mut across) = (0, 0);
        for seed in 0..40 {
            for forwarding in [Forwarding::Node, Forwarding::Cluster] {
                let problem = tenplan_proofs::random_problem(seed).with_forwarding(forwarding);
                let Ok(frags) = fragments(&problem) else {
                    continue; // no plan exists
                };
                let bound = crate::lower_bound(&problem).unwrap().seconds;
                assert!(bound >= trivial_lower_bound(&problem, &frags).seconds);
                // The broadcast forwards across nodes: cluster forwarding only.
                let broadcast = crate::planner("broadcast").unwrap().plan(&problem);
                assert_eq!(broadcast.is_ok(), forwarding == Forwarding::Cluster);
                let plans = [
                    Trees.plan(&problem).unwrap(),
                    crate::planner("lp").unwrap().plan(&problem).unwrap(),
                ];
                for plan in plans.into_iter().chain(broadcast) {
                    let what = format!("seed {seed} {forwarding:?} {}", plan.planner);
                    verify(&plan).unwrap_or_else(|v| panic!("{what}: {v}"));
                    run_and_compare(&plan, seed).unwrap_or_else(|m| panic!("{what}: {m}"));
                    let makespan = simulate(&plan).makespan_s;
                    assert!(makespan >= bound * (1.0 - 1e-9), "{what}: {makespan} below {bound}");
                    let cluster = problem.cluster();
                    planned += 1;
                    across += plan
                        .copies
                        .iter()
                        .filter(|c| {
                            c.fanout
                                .iter()
                                .any(|f| cluster.node_of(f.dst) != cluster.node_of(c.dst))
                        })
                        .count();
                }
            }
        }
        // Most are plannable, and some trees cross nodes.
        assert!(
            planned >= 100 && across > 0,
            "{planned} plans, {across} trees across nodes"
        );
    }

    #[test]
    fn forwarding_across_the_cluster_lowers_the_bound_and_trees_reach_it() {
        // GPT-3 1.3B (bandwidth, not message latency, dominates) from one
        // node of two devices to four replicas of two, a node each.
        let state = ModelState::new(find("gpt3-1.3b").unwrap(), StateKind::Weights(DType::BF16));
        let narrow = Problem::new(
            state.layout(&"tp=2".parse().unwrap()).unwrap(),
            state.serving_layout(&"tp=2,dp=4,devices=2-9".parse().unwrap()).unwrap(),
            Cluster::parse("5x2").unwrap(),
        )
        .unwrap();
        let wide = narrow.clone().with_forwarding(Forwarding::Cluster);
        let frags = fragments(&wide).unwrap();
        let within_nodes = cut_lower_bound(&narrow, &frags).seconds;
        let bound = trivial_lower_bound(&wide, &frags).seconds;
        // Four replicas' weights out of one node, or one replica's into one.
        assert!(bound < within_nodes / 3.0, "{bound} vs {within_nodes}");
        for plan in [
            Trees.plan(&wide).unwrap(),
            crate::planner("lp").unwrap().plan(&wide).unwrap(),
        ] {
            verify(&plan).unwrap();
            let makespan = simulate(&plan).makespan_s;
            let load = Loads::of(&plan).max_time(wide.cluster()).0;
            assert!(makespan >= bound * (1.0 - 1e-9) && load >= bound * (1.0 - 1e-9));
            assert!(
                makespan < within_nodes,
                "{}: {makespan} s, no faster than within nodes ({within_nodes} s)",
                plan.planner
            );
        }
    }
}
