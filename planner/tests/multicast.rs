//! Multicast: a box that several devices of one node need crosses the
//! network once and is forwarded over the intra-node link; the bounds count
//! it, and the checker holds multicast copies to their rules.

use tenplan_models::{find, ModelState, StateKind};
use tenplan_planner::{lower_bound, planner, simulate, Loads, LpPlanner, Planner};
use tenplan_proofs::{check, random_problem, run_and_compare, Violation};
use tenplan_ptc::{Cluster, DType, Forward, Plan, Problem};

/// GPT-3 1.3B weights on one node's tp=2 pair, scaled to two data-parallel
/// replicas on the other node: each replica needs the whole model.
fn replicas_on_a_new_node() -> Problem {
    let state = ModelState::new(find("gpt3-1.3b").unwrap(), StateKind::Weights(DType::BF16));
    let from = state.layout(&"tp=2".parse().unwrap()).unwrap();
    let to = state.layout(&"tp=2,dp=2,devices=4-7".parse().unwrap()).unwrap();
    Problem::new(from, to, Cluster::parse("2x4").unwrap()).unwrap()
}

#[test]
fn replicas_on_a_new_node_share_one_network_crossing() {
    let problem = replicas_on_a_new_node();
    let bound = lower_bound(&problem).unwrap().seconds;
    let lp = planner("lp").unwrap().plan(&problem).unwrap();
    check(&lp).expect("multicast plans verify");
    assert!(lp.copies.iter().any(|c| !c.fanout.is_empty()), "no multicast copy");
    let loads = Loads::of(&lp);
    let (load, _) = loads.max_time(problem.cluster());
    assert!(load <= bound * 1.001, "load {load} vs bound {bound}");
    assert!(simulate(&lp).makespan_s <= bound * 1.05);

    // Every destination on its own: the data crosses twice, and takes twice as long.
    let unicast = LpPlanner::builder().multicast(false).build().plan(&problem).unwrap();
    assert!(unicast.copies.iter().all(|c| c.fanout.is_empty()));
    let uloads = Loads::of(&unicast);
    let (uload, _) = uloads.max_time(problem.cluster());
    assert!(uload > 1.9 * load, "unicast {uload} vs multicast {load}");
    let ratio = uloads.cross_node as f64 / loads.cross_node as f64;
    assert!((ratio - 2.0).abs() < 0.01, "cross-node bytes ratio {ratio}");
    // The bound knows multicast exists: it sits below every unicast plan.
    assert!(bound < 0.55 * uload);
}

#[test]
fn random_problems_exercise_multicast_and_stay_exact() {
    let mut multicast = 0;
    for seed in 0..300 {
        let problem = random_problem(seed);
        let Ok(plan) = planner("lp").unwrap().plan(&problem) else {
            continue;
        };
        if plan.copies.iter().all(|c| c.fanout.is_empty()) {
            continue;
        }
        multicast += 1;
        check(&plan).unwrap_or_else(|v| panic!("seed {seed}: {v}"));
        run_and_compare(&plan, seed).unwrap_or_else(|m| panic!("seed {seed}: {m}"));
        let bound = lower_bound(&plan.problem).unwrap().seconds;
        let (load, _) = Loads::of(&plan).max_time(plan.problem.cluster());
        assert!(load >= bound * (1.0 - 1e-9), "seed {seed}: load {load} < bound {bound}");
        assert!(simulate(&plan).makespan_s >= load * (1.0 - 1e-9));
    }
    // The property suites draw from the same problems: make sure they meet multicasts.
    assert!(
        multicast >= 10,
        "only {multicast} of 300 random problems had a multicast plan"
    );
}

/// A small plan with multicast copies (replicated boxes of gpt-tiny into
/// the second node), small enough for the element-level interpreter.
fn tiny() -> Plan {
    let state = ModelState::new(find("gpt-tiny").unwrap(), StateKind::Training);
    let from = state.layout(&"tp=2,pp=2,dp=2".parse().unwrap()).unwrap();
    let to = state.layout(&"tp=4,dp=2,zero=1".parse().unwrap()).unwrap();
    let problem = Problem::new(from, to, Cluster::parse("2x4").unwrap()).unwrap();
    // The LP's own plan: with its portfolio, `lp` may keep a baseline's
    // faster plan, which has no multicast.
    let plan = LpPlanner::builder().portfolio(false).build().plan(&problem).unwrap();
    check(&plan).unwrap();
    run_and_compare(&plan, 5).unwrap();
    plan
}

fn first_multicast(plan: &Plan) -> usize {
    plan.copies
        .iter()
        .position(|c| !c.fanout.is_empty())
        .expect("a multicast copy")
}

fn bad_fanout(plan: &Plan) -> bool {
    matches!(check(plan), Err(Violation::BadFanout { .. }))
}

#[test]
fn a_dropped_forward_leaves_elements_unwritten() {
    let mut p = tiny();
    let i = first_multicast(&p);
    p.copies[i].fanout.pop();
    assert!(matches!(check(&p), Err(Violation::NotWritten { .. })));
    assert!(run_and_compare(&p, 1).is_err());
}

#[test]
fn forwards_must_stay_on_the_destination_node_and_name_each_device_once() {
    let base = tiny();
    let i = first_multicast(&base);
    let c = &base.copies[i];
    let cluster = base.problem.cluster();

    let mut p = base.clone();
    let elsewhere = (0..cluster.num_devices())
        .find(|&d| cluster.node_of(d) != cluster.node_of(c.dst))
        .unwrap();
    p.copies[i].fanout[0].dst = elsewhere;
    assert!(bad_fanout(&p));

    let mut p = base.clone();
    let again = p.copies[i].fanout[0].clone();
    p.copies[i].fanout.push(again);
    assert!(bad_fanout(&p));

    let mut p = base.clone();
    p.copies[i].fanout[0].dst = c.dst;
    assert!(bad_fanout(&p));

    let mut p = base.clone();
    p.copies[i].fanout[0].offset += 1;
    assert!(matches!(check(&p), Err(Violation::NoSuchPiece { .. })));
}

#[test]
fn a_copy_within_a_node_cannot_fan_out() {
    let mut p = tiny();
    let cluster = p.problem.cluster().clone();
    // An intra-node copy, forwarded to a third device of its node (the
    // fanout rules are checked before what the forward writes).
    let (i, extra) = p
        .copies
        .iter()
        .enumerate()
        .filter(|(_, c)| c.src != c.dst && cluster.node_of(c.src) == cluster.node_of(c.dst))
        .find_map(|(i, c)| {
            let node = cluster.node_of(c.dst);
            (0..cluster.num_devices())
                .find(|&d| d != c.src && d != c.dst && cluster.node_of(d) == node)
                .map(|d| (i, Forward::new(d, c.buffer, c.offset)))
        })
        .expect("an intra-node copy on a node of three or more devices");
    p.copies[i].fanout.push(extra);
    assert!(bad_fanout(&p));
}
