//! Small-scope proof: for tiny models, every pair of layouts from all
//! (tp, pp, dp, zero) with tp·pp·dp ≤ 8 on a 2×4 cluster, every planner's plan
//! passes the checker.

use tenplan_models::{find, ModelState, ParallelConfig, StateKind};
use tenplan_planner::{planner, PLANNERS};
use tenplan_proofs::check;
use tenplan_ptc::{Cluster, Layout, Problem};

fn all_layouts(state: &ModelState) -> Vec<(String, Layout)> {
    let mut out = Vec::new();
    for tp in 1..=8u32 {
        for pp in 1..=8u32 {
            for dp in 1..=8u32 {
                for zero in 0..=1 {
                    if tp * pp * dp > 8 {
                        continue;
                    }
                    let cfg = ParallelConfig {
                        tp,
                        pp,
                        dp,
                        zero,
                        ..ParallelConfig::default()
                    };
                    // Invalid configurations (tp not dividing heads, uneven
                    // stages) are typed errors, tested elsewhere.
                    if let Ok(l) = state.layout(&cfg) {
                        out.push((cfg.to_string(), l));
                    }
                }
            }
        }
    }
    out
}

fn exhaust(model: &str, min_layouts: usize) {
    let state = ModelState::new(find(model).unwrap(), StateKind::Training);
    let layouts = all_layouts(&state);
    assert!(layouts.len() >= min_layouts, "{model}: only {} layouts", layouts.len());
    let cluster = Cluster::parse("2x4").unwrap();
    let mut plans = 0;
    for (a, from) in &layouts {
        for (b, to) in &layouts {
            let problem = Problem::new(from.clone(), to.clone(), cluster.clone()).unwrap();
            for name in PLANNERS {
                let plan = planner(name)
                    .unwrap()
                    .plan(&problem)
                    .unwrap_or_else(|e| panic!("{model} {a} -> {b} with {name}: {e}"));
                if let Err(v) = check(&plan) {
                    panic!("{model} {a} -> {b} with {name}: {v}");
                }
                plans += 1;
            }
        }
    }
    assert_eq!(plans, layouts.len() * layouts.len() * PLANNERS.len());
}

#[test]
fn every_pair_of_gpt_tiny_layouts() {
    // tp ∈ {1,2,4,8} (8 heads), pp ∈ {1,2,4,8} (8 layers): 26 (tp,pp,dp) × 2.
    exhaust("gpt-tiny", 52);
}

#[test]
fn every_pair_of_llama_tiny_layouts() {
    // tp ∈ {1,2,4} (4 query groups), pp ∈ {1,2,4} (4 layers).
    exhaust("llama-tiny", 30);
}
