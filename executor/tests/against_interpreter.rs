//! The host executor produces exactly the reference interpreter's bytes.

use proptest::prelude::*;
use tenplan_executor::{execute, HostMemory};
use tenplan_planner::{planner, PLANNERS};
use tenplan_proofs::strategies::healthy_problems;
use tenplan_proofs::{addends, materialize, random_tensors, verify};

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn executor_matches_interpreter(problem in healthy_problems(), seed in any::<u64>()) {
        let mut globals = random_tensors(problem.tensors(), seed);
        let mut source = materialize(problem.source(), &globals, |_| true);
        // Partial tensors: every holder its own addend, the sum as the value.
        addends(problem.source(), &mut globals, &mut source, seed);
        let host = HostMemory::from_buffers(problem.source(), source).unwrap();
        for name in PLANNERS {
            let plan = planner(name).unwrap().plan(&problem).unwrap();
            // A placing planner answers a re-placed target: compare with that one.
            let want = materialize(plan.problem.target(), &globals, |_| true);
            let verified = verify(&plan).unwrap();
            let got = execute(&verified, &host).unwrap().into_buffers();
            prop_assert_eq!(&got, &want, "{}", name);
        }
    }
}

#[test]
fn a_model_reshard_matches_the_interpreter() {
    use tenplan_models::{find, ModelState, StateKind};
    use tenplan_ptc::{Cluster, Problem};
    let state = ModelState::new(find("llama-tiny").unwrap(), StateKind::Training);
    let from = state.layout(&"tp=2,pp=2,dp=2,zero=1".parse().unwrap()).unwrap();
    let to = state.layout(&"tp=4,pp=1,dp=2".parse().unwrap()).unwrap();
    let problem = Problem::new(from, to, Cluster::parse("2x4").unwrap()).unwrap();
    let globals = random_tensors(problem.tensors(), 42);
    let source = HostMemory::from_buffers(problem.source(), materialize(problem.source(), &globals, |_| true)).unwrap();
    let want = materialize(problem.target(), &globals, |_| true);
    let plan = planner("least-loaded").unwrap().plan(&problem).unwrap();
    let got = execute(&verify(&plan).unwrap(), &source).unwrap().into_buffers();
    assert_eq!(got, want);
}
