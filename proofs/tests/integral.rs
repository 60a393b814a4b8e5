//! The integer planner on small random problems: its plans pass the checker
//! and the interpreter, never beat the certified bound, and when branch and
//! bound finishes, no whole-fragment direct-path baseline has a lower load.

use proptest::prelude::*;
use tenplan_planner::{lower_bound, planner, Error, Loads, MipPlanner};
use tenplan_proofs::strategies::healthy_problems;
use tenplan_proofs::{check, run_and_compare};

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn integral_plans_are_valid_and_no_worse_than_baselines(problem in healthy_problems(), seed in any::<u64>()) {
        let mip = MipPlanner { time_limit_s: 5.0, ..MipPlanner::default() };
        let (plan, report) = match mip.plan_with_report(&problem) {
            Ok(x) => x,
            Err(Error::Infeasible(_)) => return Ok(()),
            Err(e) => return Err(TestCaseError::fail(e.to_string())),
        };
        let cert = check(&plan);
        prop_assert!(cert.is_ok(), "{}", cert.unwrap_err());
        prop_assert!(run_and_compare(&plan, seed).is_ok());
        let cluster = problem.cluster();
        let load = Loads::of(&plan).max_time(cluster).0;
        let bound = lower_bound(&problem).unwrap().seconds;
        prop_assert!(load >= bound * (1.0 - 1e-9), "load {load} < bound {bound}");
        prop_assert!((report.makespan_s - load).abs() <= 1e-9 * load.max(1e-12), "{} vs {load}", report.makespan_s);
        if report.optimal {
            for name in ["tenplex", "least-loaded", "hotspa"] {
                let other = planner(name).unwrap().plan(&problem).unwrap();
                let theirs = Loads::of(&other).max_time(cluster).0;
                prop_assert!(load <= theirs * (1.0 + 1e-3) + 1e-12, "{name}: {theirs} < integral {load}");
            }
        }
    }
}
