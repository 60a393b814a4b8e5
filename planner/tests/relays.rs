//! Relays: where one GPU's NIC is the bottleneck, `lp` routes through its
//! peers' NICs, and the plan reaches the certified bound.

use tenplan_models::{find, ModelState, StateKind};
use tenplan_planner::{lower_bound, planner, Loads};
use tenplan_ptc::{Cluster, DType, Problem};

#[test]
fn expert_parallel_change_uses_relays_and_reaches_the_bound() {
    let state = ModelState::new(find("mixtral-8x7b").unwrap(), StateKind::Weights(DType::BF16));
    let from = state.layout(&"tp=2,pp=4,dp=8,ep=8".parse().unwrap()).unwrap();
    let to = state.layout(&"tp=2,pp=4,dp=8,ep=4".parse().unwrap()).unwrap();
    let problem = Problem::new(from, to, Cluster::parse("dgx-h100:8").unwrap()).unwrap();
    let bound = lower_bound(&problem).unwrap().seconds;
    let lp = planner("lp").unwrap().plan(&problem).unwrap();
    assert!(lp.copies.iter().any(|c| !c.via.is_empty()), "no relayed copy");
    let (load, _) = Loads::of(&lp).max_time(problem.cluster());
    assert!(load <= bound * 1.001, "load {load} vs bound {bound}");
    tenplan_proofs::check(&lp).expect("relayed plans verify");
    // Without relays the destination NICs bind at twice the bound.
    let direct = planner("hotspa").unwrap().plan(&problem).unwrap();
    let (direct_load, _) = Loads::of(&direct).max_time(problem.cluster());
    assert!(direct_load > 1.5 * load);
}
