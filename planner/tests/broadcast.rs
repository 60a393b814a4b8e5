//! checkpoint-engine's bucketed broadcast as a plan (`broadcast`): chains
//! through every engine device, on which the devices that need a box keep
//! it as it passes. Held to the checker's rules, exact, never below the
//! floor of such broadcasts, and what it moves is what the policy moves.

use std::collections::BTreeMap;

use tenplan_models::{find, ModelState, StateKind};
use tenplan_planner::{broadcast_floor, planner, simulate, Loads, BUCKET_BYTES};
use tenplan_proofs::{check, run_and_compare, Violation};
use tenplan_ptc::{Cluster, DType, DeviceId, Forwarding, Plan, Problem};

/// A model's bf16 weights from a trainer layout to engines, forwarding
/// across the cluster (as `tenplan sync` poses it).
fn sync(model: &str, from: &str, to: &str, cluster: &str) -> Problem {
    let state = ModelState::new(find(model).unwrap(), StateKind::Weights(DType::BF16));
    Problem::new(
        state.layout(&from.parse().unwrap()).unwrap(),
        state.serving_layout(&to.parse().unwrap()).unwrap(),
        Cluster::parse(cluster).unwrap(),
    )
    .unwrap()
    .with_forwarding(Forwarding::Cluster)
}

/// A tiny MoE trainer (tp=2, dp=2) on node 0, four tp=2 engines on nodes 1
/// and 2.
fn tiny() -> Problem {
    sync("mixtral-tiny", "tp=2,dp=2", "tp=2,dp=4,devices=4-11", "3x4")
}

fn broadcast(problem: &Problem) -> Plan {
    planner("broadcast").unwrap().plan(problem).unwrap()
}

/// Bytes each device receives from others: at every hop of a copy's route
/// and at each device its destination forwards to.
fn received(plan: &Plan) -> BTreeMap<DeviceId, u64> {
    let mut out = BTreeMap::new();
    for c in &plan.copies {
        let bytes = c.region.volume() * plan.problem.tensors()[c.tensor as usize].dtype.size();
        for &d in &c.route()[1..] {
            *out.entry(d).or_default() += bytes;
        }
        for f in c.forwarded() {
            *out.entry(f.dst).or_default() += bytes;
        }
    }
    out
}

#[test]
fn every_engine_device_receives_every_weight_once_and_keeps_its_part() {
    let problem = tiny();
    let plan = broadcast(&problem);
    check(&plan).unwrap();
    run_and_compare(&plan, 3).unwrap();
    assert!(
        plan.copies.iter().any(|c| c.fanout.iter().any(|f| f.in_passing)),
        "no device keeps a box in passing"
    );
    // None of the engines holds anything: each takes in the whole model,
    // once, whatever part of it it keeps.
    let total: u64 = problem.tensors().iter().map(|t| t.bytes()).sum();
    let got = received(&plan);
    for d in problem.target().devices() {
        assert_eq!(got.get(&d).copied(), Some(total), "device {d}");
    }
    // Each copy leaves its owner once, through no trainer device but the
    // relay onto the rail of the ring's first node.
    for c in &plan.copies {
        let trainer: Vec<_> = c.route().into_iter().filter(|&d| d < 4).collect();
        assert!(trainer.len() <= 2 && trainer[0] == c.src, "{c:?}");
    }
    let floor = broadcast_floor(&problem).seconds;
    let sim = simulate(&plan).makespan_s;
    assert!(sim >= floor * (1.0 - 1e-9), "{sim} below the floor {floor}");
}

#[test]
fn the_plan_is_the_same_every_time() {
    let problem = tiny();
    assert_eq!(broadcast(&problem).to_json(), broadcast(&problem).to_json());
}

#[test]
fn owners_broadcast_their_buckets_round_by_round() {
    // 13.5 GB of weights from two trainer ranks: several buckets each.
    let problem = sync("llama2-7b", "tp=2", "tp=4,dp=2,devices=8-15", "2x8");
    let plan = broadcast(&problem);
    check(&plan).unwrap();
    let mut per: BTreeMap<(u32, DeviceId), u64> = BTreeMap::new();
    for c in &plan.copies {
        let bytes = c.region.volume() * problem.tensors()[c.tensor as usize].dtype.size();
        *per.entry((c.round, c.src)).or_default() += bytes;
    }
    let rounds = plan.copies.iter().map(|c| c.round).max().unwrap() + 1;
    assert!(rounds >= 3, "{rounds} rounds");
    for ((round, owner), bytes) in per {
        // A box is in one bucket: a bucket exceeds the size only by it.
        assert!(
            bytes <= BUCKET_BYTES + (1 << 28),
            "round {round}, owner {owner}: {bytes} B"
        );
    }
    // Every engine device takes in every weight, so each engine node's NICs
    // carry the model: the plan is no faster than the floor.
    let floor = broadcast_floor(&problem).seconds;
    assert!(simulate(&plan).makespan_s >= floor * (1.0 - 1e-9));
}

#[test]
fn a_relay_keeps_only_what_passes_through_it() {
    let base = broadcast(&tiny());
    let (i, k) = base
        .copies
        .iter()
        .enumerate()
        .find_map(|(i, c)| c.fanout.iter().position(|f| f.in_passing).map(|k| (i, k)))
        .expect("a relay that keeps");

    // Not a relay of the copy: it could not have kept anything.
    let mut p = base.clone();
    let kept = p.copies[i].fanout[k].dst;
    p.copies[i].via.retain(|&d| d != kept);
    match check(&p) {
        Err(Violation::BadFanout { device, why, .. }) => {
            assert_eq!(device, kept);
            assert!(why.contains("not a relay"), "{why}");
        }
        other => panic!("{other:?}"),
    }

    // Kept twice: once in passing, once from the destination.
    let mut p = base.clone();
    let again = p.copies[i].fanout[k].clone();
    p.copies[i].fanout.push(tenplan_ptc::Forward {
        in_passing: false,
        ..again
    });
    assert!(matches!(check(&p), Err(Violation::BadFanout { .. })));

    // A relay that drops what it needed leaves it unwritten.
    let mut p = base.clone();
    p.copies[i].fanout.remove(k);
    assert!(matches!(check(&p), Err(Violation::NotWritten { .. })));

    // A relay that keeps the box and passes it on to another node forwards
    // across nodes: refused where forwarding is confined to nodes, and the
    // planner says so rather than plan it.
    let mut p = base.clone();
    p.problem = p.problem.clone().with_forwarding(Forwarding::Node);
    match check(&p) {
        Err(Violation::BadFanout { why, .. }) => assert!(why.contains("is not on node"), "{why}"),
        other => panic!("{other:?}"),
    }
    let err = planner("broadcast").unwrap().plan(&p.problem).unwrap_err();
    assert!(err.to_string().contains("cluster forwarding"), "{err}");
}

#[test]
fn unicast_copies_of_a_chain_write_the_same_and_cross_more() {
    let plan = broadcast(&tiny());
    let mut unicast = plan.clone();
    unicast.copies = plan.copies.iter().flat_map(|c| c.unicast()).collect();
    assert!(unicast.copies.iter().all(|c| c.fanout.is_empty()));
    check(&unicast).unwrap();
    run_and_compare(&unicast, 4).unwrap();
    assert!(Loads::of(&unicast).cross_node > Loads::of(&plan).cross_node);
}
