//! Property suites: every planner against the independent checker and the
//! reference interpreter, on random problems. `PROPTEST_CASES` overrides the
//! number of cases (1,000 by default).

use proptest::prelude::*;
use tenplan_planner::{fragments, lower_bound, planner, simulate, trivial_lower_bound, Error, Loads, PLANNERS};
use tenplan_proofs::strategies::{healthy_problems, problems};
use tenplan_proofs::{check, compare, execute, materialize, random_tensors, relabel, run_and_compare};
use tenplan_ptc::{Plan, Problem};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Plan with every planner; an infeasible problem must be truly infeasible:
/// no live device holds any element of a reported missing box.
fn plans(problem: &Problem) -> Result<Vec<Plan>, TestCaseError> {
    let mut out = Vec::new();
    for name in PLANNERS {
        match planner(name).unwrap().plan(problem) {
            Ok(plan) => out.push(plan),
            Err(Error::Infeasible(inf)) => {
                prop_assert!(!inf.missing.is_empty());
                let tensors = problem.tensors();
                for m in &inf.missing {
                    let t = tensors.iter().position(|s| s.name == m.tensor).unwrap() as u32;
                    if problem.source().is_partial(t) {
                        // A partial box is lost with any one holder's addend.
                        let dead_holder = problem
                            .source()
                            .devices()
                            .filter(|&d| !problem.cluster().is_live(d))
                            .any(|d| {
                                problem
                                    .source()
                                    .shard_of(d)
                                    .unwrap()
                                    .buffers
                                    .iter()
                                    .flat_map(|b| &b.pieces)
                                    .any(|p| p.tensor == t && p.region.overlaps(&m.region))
                            });
                        prop_assert!(
                            dead_holder,
                            "{name}: partial {} {} reported missing with no dead holder",
                            m.tensor,
                            m.region
                        );
                        continue;
                    }
                    for d in problem.source().devices().filter(|&d| problem.cluster().is_live(d)) {
                        let shard = problem.source().shard_of(d).unwrap();
                        let overlaps = shard
                            .buffers
                            .iter()
                            .flat_map(|b| &b.pieces)
                            .any(|p| p.tensor == t && p.region.overlaps(&m.region));
                        prop_assert!(
                            !overlaps,
                            "{name}: {} {} reported missing but live device {d} holds part of it",
                            m.tensor,
                            m.region
                        );
                    }
                }
            }
            Err(e) => return Err(TestCaseError::fail(format!("{name}: {e}"))),
        }
    }
    Ok(out)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn every_plan_passes_the_checker_and_the_interpreter(problem in problems(), seed in any::<u64>()) {
        for plan in plans(&problem)? {
            let cert = check(&plan);
            prop_assert!(cert.is_ok(), "{}: {}", plan.planner, cert.unwrap_err());
            let run = run_and_compare(&plan, seed);
            prop_assert!(run.is_ok(), "{}: {}", plan.planner, run.unwrap_err());
        }
    }

    /// The certified lower bound (LP duals and cuts) is below every plan's
    /// load, and the simulator never beats the load.
    #[test]
    fn simulated_makespan_respects_loads_and_the_lower_bound(problem in problems()) {
        // What `lp` certified on the way (on a fabric) bounds every plan too.
        let certified = match planner("lp").unwrap().plan_with_bound(&problem) {
            Ok((_, Some(b))) => b.seconds,
            _ => 0.0,
        };
        for plan in plans(&problem)? {
            if plan.problem == problem {
                let (load, _) = Loads::of(&plan).max_time(problem.cluster());
                prop_assert!(load >= certified * (1.0 - 1e-9), "{}: load {load} < lp's certificate {certified}", plan.planner);
            }
            let trivial = trivial_lower_bound(&plan.problem, &fragments(&plan.problem).unwrap()).seconds;
            let bound = lower_bound(&plan.problem).unwrap().seconds;
            prop_assert!(bound >= trivial);
            let (max_load, _) = Loads::of(&plan).max_time(problem.cluster());
            let makespan = simulate(&plan).makespan_s;
            prop_assert!(max_load >= bound * (1.0 - 1e-9), "{}: load {max_load} < bound {bound}", plan.planner);
            prop_assert!(makespan >= max_load * (1.0 - 1e-9), "{}: makespan {makespan} < load {max_load}", plan.planner);
        }
    }

    #[test]
    fn plans_are_deterministic(problem in problems()) {
        for (a, b) in plans(&problem)?.into_iter().zip(plans(&problem)?) {
            prop_assert_eq!(a.to_json(), b.to_json());
        }
    }

    #[test]
    fn relabelled_devices_still_verify(problem in problems(), perm in any::<u64>()) {
        let relabelled = relabel(&problem, perm);
        for plan in plans(&relabelled)? {
            let cert = check(&plan);
            prop_assert!(cert.is_ok(), "{}: {}", plan.planner, cert.unwrap_err());
        }
    }

    #[test]
    fn there_and_back_restores_the_original_bytes(problem in healthy_problems(), seed in any::<u64>()) {
        // The checkpoint store is a source only: nothing goes back to it.
        if problem.cluster().storage_device().is_some() {
            return Ok(());
        }
        // Reducing partial sums cannot be undone: go there and back with whole tensors.
        let problem = Problem::new(problem.source().with_partial(|_| false).unwrap(), problem.target().clone(), problem.cluster().clone()).unwrap();
        let globals = random_tensors(problem.tensors(), seed);
        let original = materialize(problem.source(), &globals, |_| true);
        for name in PLANNERS {
            let p = planner(name).unwrap();
            // A placing planner may move target ranks: follow each plan's own problem.
            let there = p.plan(&problem).unwrap();
            let middle = execute(&there, &original, seed).unwrap();
            let back = Problem::new(there.problem.target().clone(), problem.source().clone(), problem.cluster().clone()).unwrap();
            let home_plan = p.plan(&back).unwrap();
            let home = execute(&home_plan, &middle, seed + 1).unwrap();
            let want = materialize(home_plan.problem.target(), &globals, |_| true);
            let same = compare(home_plan.problem.target(), &home, &want);
            prop_assert!(same.is_ok(), "{name}: {}", same.unwrap_err());
            if home_plan.problem.target() == problem.source() {
                prop_assert!(compare(problem.source(), &home, &original).is_ok());
            }
        }
    }

    #[test]
    fn plan_files_round_trip(problem in problems()) {
        for plan in plans(&problem)? {
            let text = plan.to_json();
            let back = Plan::from_json(&text).unwrap();
            prop_assert_eq!(&back, &plan);
        }
    }
}
