//! Fabrics: on a rail-optimized cluster with its spine oversubscribed 2:1,
//! `lp` stays at its certified bound while a fabric-blind policy pays for
//! the spine; the bound is below every plan's makespan; plans verify.

use tenplan_models::{find, ModelState, StateKind};
use tenplan_planner::{lower_bound, planner, simulate, Loads, Resource};
use tenplan_ptc::{Cluster, Problem};

fn problem(cluster: &str) -> Problem {
    let state = ModelState::new(find("llama3-8b").unwrap(), StateKind::Training);
    let from = state.layout(&"tp=8,dp=8".parse().unwrap()).unwrap();
    let to = state.layout(&"tp=4,pp=2,dp=6".parse().unwrap()).unwrap();
    Problem::new(from, to, Cluster::parse(cluster).unwrap()).unwrap()
}

#[test]
fn oversubscribed_spine_is_priced_and_lp_reaches_its_bound() {
    // Halving tensor parallelism moves shards between rails: traffic
    // between different rails crosses the spine unless relayed onto the
    // right rail over NVLink first.
    let rail = problem("dgx-h100-rail-2to1:8");
    let flat = problem("dgx-h100:8");
    let bound = lower_bound(&rail).unwrap().seconds;
    let lp = planner("lp").unwrap().plan(&rail).unwrap();
    tenplan_proofs::check(&lp).expect("lp verifies on a fabric");
    let (load, _) = Loads::of(&lp).max_time(rail.cluster());
    assert!(load <= bound * 1.01, "lp load {load} vs bound {bound}");
    let made = simulate(&lp).makespan_s;
    assert!(made >= bound * (1.0 - 1e-9), "simulated {made} below the bound {bound}");
    // The spine's links are resources of the plan, and the fabric-blind
    // least-loaded plan is slower on the fabric than on the flat network.
    let ll_rail = planner("least-loaded").unwrap().plan(&rail).unwrap();
    let ll_flat = planner("least-loaded").unwrap().plan(&flat).unwrap();
    tenplan_proofs::check(&ll_rail).expect("least-loaded verifies");
    let loads = Loads::of(&ll_rail);
    assert!(
        loads.bytes.keys().any(|r| matches!(r, Resource::SwitchUp(_))),
        "no spine traffic"
    );
    assert!(simulate(&ll_rail).makespan_s > simulate(&ll_flat).makespan_s);
    assert!(simulate(&ll_rail).makespan_s >= bound * (1.0 - 1e-9));
}

#[test]
fn an_lp_too_large_for_memory_says_so_before_solving() {
    let p = problem("dgx-h100:8");
    let lp = tenplan_planner::LpPlanner::builder().memory_limit(1_000_000).build();
    let e = tenplan_planner::Planner::plan(&lp, &p).unwrap_err();
    assert!(matches!(e, tenplan_planner::Error::TooLarge { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("the LP would need about") && msg.contains("0.001 GB available"),
        "{msg}"
    );
    // With room, the same planner plans.
    let roomy = tenplan_planner::LpPlanner::builder().memory_limit(1 << 40).build();
    tenplan_planner::Planner::plan(&roomy, &p).unwrap();
}

#[test]
fn gb200_racks_are_one_nvlink_domain_each() {
    let state = ModelState::new(find("llama3-8b").unwrap(), StateKind::Training);
    let from = state.layout(&"tp=8,dp=18".parse().unwrap()).unwrap();
    let to = state.layout(&"tp=4,pp=2,dp=18".parse().unwrap()).unwrap();
    let problem = Problem::new(from, to, Cluster::parse("gb200-nvl72:2").unwrap()).unwrap();
    let bound = lower_bound(&problem).unwrap().seconds;
    let lp = planner("lp").unwrap().plan(&problem).unwrap();
    tenplan_proofs::check(&lp).expect("lp verifies on GB200 racks");
    let (load, _) = Loads::of(&lp).max_time(problem.cluster());
    assert!(load <= bound * 1.02, "lp load {load} vs bound {bound}");
    // Most of the state moves within a rack, over NVLink.
    let loads = Loads::of(&lp);
    assert!(
        loads.cross_node < loads.moved / 2,
        "{} of {} bytes cross racks",
        loads.cross_node,
        loads.moved
    );
}
