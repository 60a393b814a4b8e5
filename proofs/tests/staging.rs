//! Staging rounds: a staged plan writes the same state, and within each round
//! no device receives more than the budget from other devices.

use proptest::prelude::*;
use tenplan_planner::schedule::{stage, staged_bytes, StagingError};
use tenplan_planner::{planner, simulate, PLANNERS};
use tenplan_proofs::strategies::healthy_problems;
use tenplan_proofs::{check, run_and_compare};

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
            for ((round, device), bytes) in staged_bytes(&staged) {
                prop_assert!(bytes <= budget, "{name}: round {round} device {device} stages {bytes} > {budget}");
            }
            // Rounds are listed in order, and only remote copies are staged.
            prop_assert!(staged.copies.windows(2).all(|w| w[0].round <= w[1].round));
            prop_assert!(staged.copies.iter().all(|c| c.src != c.dst || c.round == 0));
            let r = simulate(&staged);
            prop_assert!(r.makespan_s.is_finite());
            prop_assert_eq!(r.messages, staged.copies.len());
        }
    }
}
