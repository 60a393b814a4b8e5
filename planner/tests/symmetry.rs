//! Symmetry reduction: a problem whose tensors repeat is planned as its
//! reduced problem and expanded. The expanded plan must satisfy the
//! independent checker and the reference interpreter, put the same bytes
//! on every resource as planning the original, and the reduced problem's
//! bounds must hold for the original.

use tenplan_models::{find, ModelState, StateKind};
use tenplan_planner::{
    fragments, lower_bound, planner, simulate, trivial_lower_bound, LayoutClasses, Loads, LpPlanner, Planner, Reduced,
    Resource, Symmetric,
};
use tenplan_proofs::{check, random_problem, run_and_compare};
use tenplan_ptc::{Buffer, Cluster, Layout, Piece, Problem, Shard, TensorSpec};

/// The problem with every tensor repeated `k` times, placed as the
/// original: copy `i` of a buffer's pieces follows copy `i - 1` in the
/// same buffer, padding included.
fn repeated(problem: &Problem, k: u32) -> Problem {
    let tensors: Vec<TensorSpec> = problem
        .tensors()
        .iter()
        .flat_map(|t| (0..k).map(move |i| TensorSpec::new(format!("{}~{i}", t.name), t.dtype, t.shape.clone())))
        .collect();
    let tensors: std::sync::Arc<[TensorSpec]> = tensors.into();
    let layout = |l: &Layout| {
        let shards = l
            .shards()
            .iter()
            .map(|s| Shard {
                buffers: s
                    .buffers
                    .iter()
                    .map(|b| Buffer {
                        len: b.len * u64::from(k),
                        pieces: (0..k)
                            .flat_map(|i| {
                                b.pieces.iter().map(move |p| Piece {
                                    tensor: p.tensor * k + i,
                                    region: p.region.clone(),
                                    offset: p.offset + u64::from(i) * b.len,
                                })
                            })
                            .collect(),
                        ..b.clone()
                    })
                    .collect(),
                ..s.clone()
            })
            .collect();
        Layout::new(tensors.clone(), shards).unwrap()
    };
    Problem::new(
        layout(problem.source()),
        layout(problem.target()),
        problem.cluster().clone(),
    )
    .unwrap()
    .with_forwarding(problem.forwarding())
}

fn gpt3_reshard() -> Problem {
    let state = ModelState::new(find("gpt3-1.3b").unwrap(), StateKind::Training);
    let from = state.layout(&"tp=4,pp=2,dp=2".parse().unwrap()).unwrap();
    let to = state.layout(&"tp=2,pp=4,dp=3,devices=8-31".parse().unwrap()).unwrap();
    Problem::new(from, to, Cluster::parse("dgx-h100:4").unwrap()).unwrap()
}

/// A model's state reduces to a few classes, and planning the reduced
/// problem gives the original's optimum: same busiest load, a bound that
/// holds, a plan the checker proves.
#[test]
fn a_model_reshard_reduces_and_plans_at_the_same_load() {
    let problem = gpt3_reshard();
    let reduced = Reduced::new(&problem).unwrap().expect("a model's layers repeat");
    let n = problem.tensors().len();
    let r = reduced.problem().tensors().len();
    assert!(r * 5 < n, "{n} tensors reduced to {r} only");
    let members: usize = (0..r as u32).map(|t| reduced.members(t).len()).sum();
    assert_eq!(members, n, "every tensor in exactly one stack");

    let lp = LpPlanner::default();
    let (plan, bound) = Symmetric::new(lp.clone()).plan_with_bound(&problem).unwrap();
    check(&plan).expect("the expanded plan verifies");
    assert_eq!(plan.problem, problem);
    let direct = lp.plan(&problem).unwrap();
    let (load, _) = Loads::of(&plan).max_time(problem.cluster());
    let (direct_load, _) = Loads::of(&direct).max_time(problem.cluster());
    assert!(
        (load - direct_load).abs() <= 1e-6 * direct_load,
        "reduced {load} vs direct {direct_load}"
    );
    let exact = lower_bound(&problem).unwrap().seconds;
    let reduced_bound = lower_bound(reduced.problem()).unwrap().seconds;
    assert!(reduced_bound <= exact * (1.0 + 1e-9), "{reduced_bound} above {exact}");
    assert!(
        reduced_bound >= exact * (1.0 - 1e-3),
        "{reduced_bound} far below {exact}"
    );
    if let Some(b) = bound {
        assert!(b.seconds <= simulate(&direct).makespan_s * (1.0 + 1e-9));
    }
    // Deterministic: the same problem, the same plan.
    let again = Symmetric::new(lp).plan(&problem).unwrap();
    assert_eq!(again, plan);
}

/// A recovery whose surviving holders must send thousands of pieces is
/// bound by messages: the reduced problem's bound, each stacked piece
/// counted as its members', is the whole problem's.
#[test]
fn the_message_bound_survives_the_reduction() {
    let state = ModelState::new(find("gpt3-1.3b").unwrap(), StateKind::Training);
    let from = state.layout(&"tp=4,pp=2,dp=2".parse().unwrap()).unwrap();
    let to = state.layout(&"tp=4,pp=2,dp=1,devices=4-11".parse().unwrap()).unwrap();
    let cluster = Cluster::parse("4x4").unwrap().with_dead([0, 1, 2, 3]).unwrap();
    let problem = Problem::new(from, to, cluster).unwrap();
    let whole = trivial_lower_bound(&problem, &fragments(&problem).unwrap());
    assert!(whole.reason.contains("message"), "{}", whole.reason);
    let reduced = Reduced::new(&problem).unwrap().unwrap();
    let stacked = reduced.trivial_lower_bound(&fragments(reduced.problem()).unwrap());
    assert_eq!(stacked, whole);
    // Unweighted, the stacks would send fewer messages.
    let plain = trivial_lower_bound(reduced.problem(), &fragments(reduced.problem()).unwrap());
    assert!(plain.seconds < whole.seconds, "{} vs {}", plain.seconds, whole.seconds);
}

/// Classes computed once per layout give the same reduction.
#[test]
fn classes_given_are_classes_computed() {
    let problem = gpt3_reshard();
    let (s, t) = (LayoutClasses::of(problem.source()), LayoutClasses::of(problem.target()));
    let a = Reduced::with_classes(&problem, &s, &t).unwrap().unwrap();
    let b = Reduced::new(&problem).unwrap().unwrap();
    assert_eq!(a.problem(), b.problem());
}

/// Random problems with every tensor repeated (partial sums, padding,
/// replicas cut differently, dead devices, multicasts): the expanded plan
/// verifies, performs correctly on random data, and loads the resources
/// exactly as the reduced plan does; the reduced problem's bound holds
/// for the original's plan.
#[test]
fn random_repeated_problems_expand_into_correct_plans() {
    let mut planned = 0;
    for seed in 0..150 {
        let base = random_problem(seed);
        let problem = repeated(&base, 1 + (seed % 3) as u32 + 1);
        let Some(reduced) = Reduced::new(&problem).unwrap() else {
            panic!("seed {seed}: repeated tensors do not reduce");
        };
        assert!(reduced.problem().tensors().len() <= base.tensors().len());
        let lp = planner("lp").unwrap();
        let Ok((small, _)) = lp.plan_with_bound(reduced.problem()) else {
            continue;
        };
        let plan = reduced.expand(&small).unwrap();
        check(&plan).unwrap_or_else(|v| panic!("seed {seed}: {v}"));
        // The reduced problem's cuts and message bound, each stacked piece
        // counted as its members', are the whole problem's.
        let whole = trivial_lower_bound(&problem, &fragments(&problem).unwrap()).seconds;
        let stacked = reduced
            .trivial_lower_bound(&fragments(reduced.problem()).unwrap())
            .seconds;
        assert!(
            (whole - stacked).abs() <= 1e-9 * whole,
            "seed {seed}: {stacked} vs {whole}"
        );
        run_and_compare(&plan, seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        // Bytes on every resource are the reduced plan's; messages (the
        // issue resources) multiply by the members.
        let bytes = |l: Loads| -> Vec<(Resource, u64)> {
            l.bytes
                .into_iter()
                .filter(|(r, _)| !matches!(r, Resource::Issue(_)))
                .collect()
        };
        assert_eq!(
            bytes(Loads::of(&plan)),
            bytes(Loads::of(&small)),
            "seed {seed}: loads differ after expansion"
        );
        if let Ok(direct) = lp.plan(&problem) {
            let bound = lower_bound(reduced.problem()).unwrap().seconds;
            let (direct_load, _) = Loads::of(&direct).max_time(problem.cluster());
            assert!(
                bound <= direct_load * (1.0 + 1e-6),
                "seed {seed}: bound {bound} above a plan's load {direct_load}"
            );
        }
        planned += 1;
    }
    assert!(planned > 100, "only {planned} random problems planned");
}
