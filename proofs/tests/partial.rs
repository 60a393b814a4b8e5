//! Partial state: gradients held as per-rank addends, reduced by the plan.
//! Every planner's plan must add exactly one addend from every holder into
//! every target element (checker), and the sums must come out right
//! (interpreter); tampered plans are named.

use tenplan_models::{find, ModelState, StateKind};
use tenplan_planner::{planner, Error, PLANNERS};
use tenplan_proofs::{check, run_and_compare, Violation};
use tenplan_ptc::{Cluster, Problem};

fn grads_problem(from: &str, to: &str, dead: &[u32]) -> Problem {
    let state = ModelState::new(find("gpt-tiny").unwrap(), StateKind::WeightsAndGrads);
    let source = state.layout(&from.parse().unwrap()).unwrap();
    let grads = |t: u32| state.tensors()[t as usize].name.starts_with("grad.");
    let source = source.with_partial(grads).unwrap();
    let target = state.layout(&to.parse().unwrap()).unwrap();
    let cluster = Cluster::parse("2x4").unwrap().with_dead(dead.iter().copied()).unwrap();
    Problem::new(source, target, cluster).unwrap()
}

#[test]
fn every_planner_reduces_partial_gradients() {
    let problem = grads_problem("tp=2,dp=4", "tp=4,dp=2", &[]);
    for name in PLANNERS {
        let plan = planner(name).unwrap().plan(&problem).unwrap();
        let cert = check(&plan);
        assert!(cert.is_ok(), "{name}: {}", cert.unwrap_err());
        assert!(plan.copies.iter().any(|c| c.reduce), "{name}");
        run_and_compare(&plan, 7).unwrap_or_else(|e| panic!("{name}: {e}"));
        for c in &plan.copies {
            let grad = problem.tensors()[c.tensor as usize].name.starts_with("grad.");
            assert_eq!(c.reduce, grad, "{name}: only gradients are reduced");
        }
    }
}

#[test]
fn tampered_reductions_are_named() {
    let problem = grads_problem("tp=2,dp=2", "tp=2,dp=1", &[]);
    let plan = planner("lp").unwrap().plan(&problem).unwrap();
    check(&plan).unwrap();
    let i = plan.copies.iter().position(|c| c.reduce).unwrap();

    let mut dropped = plan.clone();
    dropped.copies.remove(i);
    assert!(
        matches!(check(&dropped), Err(Violation::AddendMissing { .. })),
        "{:?}",
        check(&dropped)
    );

    let mut twice = plan.clone();
    twice.copies.push(plan.copies[i].clone());
    assert!(
        matches!(check(&twice), Err(Violation::DoubleWrite { .. })),
        "{:?}",
        check(&twice)
    );

    let mut overwrite = plan.clone();
    overwrite.copies[i].reduce = false;
    let e = check(&overwrite).unwrap_err();
    assert!(matches!(e, Violation::ReduceMismatch { .. }), "{e}");
    assert!(e.to_string().contains("partial sums in the source"), "{e}");

    let j = plan.copies.iter().position(|c| !c.reduce).unwrap();
    let mut adds = plan.clone();
    adds.copies[j].reduce = true;
    assert!(matches!(check(&adds), Err(Violation::ReduceMismatch { .. })));
}

#[test]
fn a_dead_holder_loses_its_addend() {
    // Device 3 holds an addend of every gradient of tp rank 1: it is lost.
    let problem = grads_problem("tp=2,dp=2", "tp=2,dp=1,devices=4-5", &[3]);
    match planner("lp").unwrap().plan(&problem) {
        Err(Error::Infeasible(inf)) => {
            assert!(inf.missing.iter().all(|m| m.tensor.starts_with("grad.")), "{inf}");
            assert!(inf.missing.iter().all(|m| m.dead_holders == vec![3]), "{inf}");
        }
        other => panic!("expected infeasible, got {other:?}"),
    }
}

#[test]
fn targets_cannot_be_partial() {
    let state = ModelState::new(find("gpt-tiny").unwrap(), StateKind::WeightsAndGrads);
    let layout = state.layout(&"tp=2".parse().unwrap()).unwrap();
    let partial = layout
        .with_partial(|t| state.tensors()[t as usize].name.starts_with("grad."))
        .unwrap();
    let e = Problem::new(layout, partial, Cluster::parse("1x4").unwrap()).unwrap_err();
    assert!(e.to_string().contains("partial sums"), "{e}");
}
