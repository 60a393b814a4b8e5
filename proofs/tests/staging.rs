//! Staging rounds: a staged plan writes the same state, and within each round
//! no device receives more than the budget from other devices.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tenplan_models::{find, ModelState, StateKind};
use tenplan_planner::issue::{stage, staged_bytes, StagingError};
use tenplan_planner::{planner, simulate, PLANNERS};
use tenplan_proofs::strategies::healthy_problems;
use tenplan_proofs::{check, run_and_compare};
use tenplan_ptc::{Cluster, DeviceId, Plan, Problem};

/// Bytes each device receives from other devices in each round, counted
/// from every hop of every copy (not from the planner's own accounting):
/// each device a copy's route enters, and each device its destination
/// forwards to.
fn received(plan: &Plan) -> BTreeMap<(u32, DeviceId), u64> {
    let tensors = plan.problem.tensors();
    let mut out = BTreeMap::new();
    for c in &plan.copies {
        let bytes = c.region.volume() * tensors[c.tensor as usize].dtype.size();
        let route = c.route();
        let mut on: Vec<DeviceId> = route.windows(2).filter(|h| h[0] != h[1]).map(|h| h[1]).collect();
        on.extend(c.forwarded().map(|f| f.dst).filter(|&d| d != c.dst));
        for d in on {
            *out.entry((c.round, d)).or_default() += bytes;
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn staged_plans_keep_their_meaning_and_their_budget(problem in healthy_problems(), budget in 1u64..400, seed in any::<u64>()) {
        for name in PLANNERS {
            let plan = planner(name).unwrap().plan(&problem).unwrap();
            let staged = match stage(&plan, budget) {
                Ok(p) => p,
                Err(StagingError::BudgetBelowElement { elem, .. }) => {
                    prop_assert!(elem > budget);
                    continue;
                }
                Err(e) => return Err(TestCaseError::fail(e.to_string())),
            };
            let cert = check(&staged);
            prop_assert!(cert.is_ok(), "{name}: {}", cert.unwrap_err());
            prop_assert!(run_and_compare(&staged, seed).is_ok(), "{name}");
            for ((round, device), bytes) in staged_bytes(&staged).into_iter().chain(received(&staged)) {
                prop_assert!(bytes <= budget, "{name}: round {round} device {device} stages {bytes} > {budget}");
            }
            // Rounds are listed in order, and only remote copies are staged.
            prop_assert!(staged.copies.windows(2).all(|w| w[0].round <= w[1].round));
            prop_assert!(staged.copies.iter().all(|c| !c.is_local() || c.round == 0));
            let r = simulate(&staged);
            prop_assert!(r.makespan_s.is_finite());
            prop_assert_eq!(r.messages, staged.copies.len());
        }
    }
}

/// A copy relayed through another device back to its source is staged like
/// any remote copy: the central planner routes every box through one node,
/// and before the fix devices received up to 42,784 B in round 0 of a plan
/// staged at 4 KiB.
#[test]
fn relayed_copies_back_to_their_source_respect_the_budget() {
    let state = ModelState::new(find("mixtral-tiny").unwrap(), StateKind::Training);
    let from = state.layout(&"tp=2,pp=2,dp=1,ep=1".parse().unwrap()).unwrap();
    let to = state.layout(&"tp=2,pp=2,dp=1,devices=0-3".parse().unwrap()).unwrap();
    let problem = Problem::new(from, to, Cluster::parse("2x2").unwrap()).unwrap();
    let plan = planner("central").unwrap().plan(&problem).unwrap();
    assert!(
        plan.copies.iter().any(|c| c.src == c.dst && !c.is_local()),
        "the case needs a copy relayed back to its source"
    );
    let budget = 4096;
    let staged = stage(&plan, budget).unwrap();
    check(&staged).unwrap();
    run_and_compare(&staged, 7).unwrap();
    let worst = received(&staged).into_values().max().unwrap();
    assert!(worst <= budget, "a device receives {worst} B in one round");
}
