//! The checker rejects tampered plans, naming what is wrong; the interpreter
//! catches the same tampering on concrete bytes.

use tenplan_models::{find, ModelState, StateKind};
use tenplan_planner::{planner, Planner, Tenplex};
use tenplan_proofs::{check, run_and_compare, Violation};
use tenplan_ptc::{Cluster, Plan, Problem, Region};

fn plan() -> Plan {
    let state = ModelState::new(find("gpt-tiny").unwrap(), StateKind::Training);
    let from = state.layout(&"tp=2,pp=2,dp=2".parse().unwrap()).unwrap();
    let to = state.layout(&"tp=4,pp=1,dp=1".parse().unwrap()).unwrap();
    let problem = Problem::new(from, to, Cluster::parse("2x4").unwrap()).unwrap();
    Tenplex.plan(&problem).unwrap()
}

#[test]
fn the_untampered_plan_verifies() {
    let p = plan();
    let cert = check(&p).unwrap();
    assert!(cert.elements > 0);
    run_and_compare(&p, 7).unwrap();
}

#[test]
fn a_dropped_copy_leaves_elements_unwritten() {
    let mut p = plan();
    p.copies.remove(3);
    assert!(matches!(check(&p), Err(Violation::NotWritten { .. })));
    assert!(run_and_compare(&p, 1).is_err());
}

#[test]
fn a_duplicated_copy_writes_twice() {
    let mut p = plan();
    let c = p.copies[5].clone();
    p.copies.push(c);
    assert!(matches!(check(&p), Err(Violation::DoubleWrite { .. })));
}

#[test]
fn a_source_that_does_not_hold_the_box_is_caught() {
    let mut p = plan();
    // Device 1 holds tp rank 1 of stage 0; the embedding's first rows live on tp rank 0.
    let i = p
        .copies
        .iter()
        .position(|c| c.tensor == 0 && c.region.range(0).start == 0)
        .unwrap();
    p.copies[i].src = 1;
    assert!(matches!(check(&p), Err(Violation::SourceLacksData { device: 1, .. })));
    assert!(run_and_compare(&p, 1).is_err());
}

#[test]
fn a_box_outside_its_target_piece_is_caught() {
    let mut p = plan();
    let tensors = p.problem.tensors().clone();
    // A copy that does not span its tensor's first dimension: grow it by a row.
    let i = p
        .copies
        .iter()
        .position(|c| c.region.range(0).end < tensors[c.tensor as usize].shape[0])
        .unwrap();
    let c = &mut p.copies[i];
    let r0 = c.region.range(0);
    c.region = c.region.with_range(0, r0.start..r0.end + 1);
    assert!(matches!(
        check(&p),
        Err(Violation::OutOfPiece { .. } | Violation::SourceLacksData { .. })
    ));
}

#[test]
fn shifted_offsets_are_caught() {
    let mut p = plan();
    p.copies[0].offset += 1;
    assert!(matches!(check(&p), Err(Violation::NoSuchPiece { .. })));
}

#[test]
fn dead_sources_and_relays_are_caught() {
    let p = plan();
    let src = p.copies[0].src;
    let dead = p.problem.with_cluster(p.problem.cluster().with_dead([src]).unwrap());
    // The target layout uses devices 0-3; kill a source-only device instead when needed.
    if let Ok(problem) = dead {
        let q = Plan { problem, ..p.clone() };
        assert!(matches!(check(&q), Err(Violation::DeadSource { .. })));
    }
    let mut r = p.clone();
    r.problem = p
        .problem
        .with_cluster(p.problem.cluster().with_dead([7]).unwrap())
        .unwrap();
    r.copies[0].via = vec![7];
    assert!(matches!(check(&r), Err(Violation::DeadRelay { device: 7, .. })));
}

#[test]
fn fills_must_cover_exactly_the_padding() {
    let p = plan();
    assert!(!p.fills.is_empty(), "the padded vocabulary needs fills");
    let mut missing = p.clone();
    missing.fills.pop();
    assert!(matches!(check(&missing), Err(Violation::PaddingNotZeroed { .. })));
    assert!(run_and_compare(&missing, 3).is_err());
    let mut over = p.clone();
    over.fills[0].offset = 0;
    assert!(matches!(check(&over), Err(Violation::BadFill { .. })));
}

#[test]
fn unknown_tensors_and_targets_are_caught() {
    let mut p = plan();
    p.copies[0].tensor = 9999;
    assert!(matches!(check(&p), Err(Violation::UnknownTensor { .. })));
    let mut q = plan();
    q.copies[0].dst = 6;
    assert!(matches!(check(&q), Err(Violation::NotATarget { device: 6, .. })));
    let mut r = plan();
    r.copies[0].region = Region::new([0..0, 0..1]).unwrap();
    assert!(check(&r).is_err());
}

#[test]
fn every_baseline_verifies_a_failure_recovery() {
    let state = ModelState::new(find("gpt-tiny").unwrap(), StateKind::Training);
    let from = state.layout(&"tp=2,pp=2,dp=2".parse().unwrap()).unwrap();
    let to = state.layout(&"tp=2,pp=2,dp=1,devices=4-7".parse().unwrap()).unwrap();
    let cluster = Cluster::parse("2x4").unwrap().with_dead([0, 1]).unwrap();
    let problem = Problem::new(from, to, cluster).unwrap();
    for name in tenplan_planner::PLANNERS {
        let plan = planner(name).unwrap().plan(&problem).unwrap();
        check(&plan).unwrap();
        run_and_compare(&plan, 11).unwrap();
        assert!(plan.copies.iter().all(|c| c.src > 1));
    }
}
