//! Replicas cut differently: real Megatron ZeRO-1 layouts put the tied word
//! embedding of the first and the last pipeline stage into flat buffers of
//! different sizes, so the two replicas are cut at different places. These
//! layouts must build for every catalog model and every data-parallel
//! degree, and every planner's plans between them must pass the checker and
//! the reference interpreter.

use std::collections::BTreeSet;
use tenplan_models::{find, ModelState, ParallelConfig, StateKind, MODELS};
use tenplan_planner::{planner, PLANNERS};
use tenplan_proofs::{check, run_and_compare};

use tenplan_ptc::{Cluster, Layout, Problem, Region};

fn zero1(tp: u32, pp: u32, dp: u32) -> ParallelConfig {
    ParallelConfig {
        tp,
        pp,
        dp,
        zero: 1,
        ..ParallelConfig::default()
    }
}

/// Whether the replicas of some tensor are cut differently: its
/// sub-tensors are not the distinct boxes of its pieces.
fn cut_differently(layout: &Layout) -> bool {
    let boxes: BTreeSet<(u32, &Region)> = layout
        .shards()
        .iter()
        .flat_map(|s| &s.buffers)
        .flat_map(|b| &b.pieces)
        .map(|p| (p.tensor, &p.region))
        .collect();
    let subs: BTreeSet<(u32, &Region)> = (0..layout.tensors().len() as u32)
        .flat_map(|t| layout.sub_tensors(t).iter().map(move |s| (t, &s.region)))
        .collect();
    boxes != subs
}

#[test]
fn zero1_layouts_of_every_catalog_model_build_for_every_dp() {
    let mut differently = 0;
    // Llama 3.1 405B and DeepSeek-V3 hold more than the 1 TiB buffer limit
    // per half of the model at tp=1 (and Kimi-K2, which has DeepSeek-V3's
    // 61 layers); Qwen3-235B's 64 layouts of 94 layers of 128 experts take
    // minutes in a debug build. The scale and rl suites build their layouts.
    for spec in MODELS.iter().filter(|m| {
        !matches!(
            m.name.as_ref(),
            "llama3.1-405b" | "deepseek-v3" | "kimi-k2" | "qwen3-235b-a22b"
        )
    }) {
        let state = ModelState::new(spec, StateKind::Training);
        // Two stages: the tied embedding is on the first and on the last.
        let pp = if spec.layers >= 2 { 2 } else { 1 };
        for dp in 1..=64 {
            let cfg = zero1(1, pp, dp);
            let layout = state
                .layout(&cfg)
                .unwrap_or_else(|e| panic!("{} {cfg}: {e}", spec.name));
            differently += usize::from(cut_differently(&layout));
        }
    }
    // The case this guards: some of them do cut replicas differently.
    assert!(differently > 0);
}

#[test]
fn gpt3_175b_zero1_on_1024_nodes_builds_for_every_dp_that_failed() {
    // `tenplan plan --model gpt3-175b --cluster dgx-h100:1024 --from
    // tp=8,pp=16,dp=24,zero=1 ...` failed for dp = 24, 32, 48, 64.
    let state = ModelState::new(find("gpt3-175b").unwrap(), StateKind::Training);
    for dp in [24, 64] {
        let layout = state.layout(&zero1(8, 16, dp)).unwrap();
        assert!(cut_differently(&layout), "dp={dp}");
    }
}

#[test]
fn plans_between_zero1_layouts_of_tiny_models_pass_the_checker_and_the_interpreter() {
    let cluster = Cluster::parse("4x8").unwrap();
    let mut checked = 0;
    let mut differently = 0;
    for model in ["gpt-tiny", "llama-tiny", "mixtral-tiny"] {
        let state = ModelState::new(find(model).unwrap(), StateKind::Training);
        // dp from 1 to 16 on two stages, each to another dp (ZeRO-1 or not)
        // and to a tensor-parallel layout.
        let layouts: Vec<(String, Layout)> = (1..=16u32)
            .filter_map(|dp| {
                let mut cfg = zero1(1, 2, dp);
                if model == "mixtral-tiny" && dp % 2 == 0 {
                    cfg.ep = 2;
                }
                state.layout(&cfg).ok().map(|l| (cfg.to_string(), l))
            })
            .collect();
        assert!(layouts.len() >= 12, "{model}: {} layouts", layouts.len());
        assert!(!layouts.len().is_multiple_of(7));
        let plain = state.layout(&"tp=2,pp=2,dp=2".parse().unwrap()).unwrap();
        for (i, (a, from)) in layouts.iter().enumerate() {
            differently += usize::from(cut_differently(from));
            // Every layout is a source and a target once (7 is prime to the
            // count); every fourth also goes to and from a plain layout.
            let (b, to) = &layouts[(i * 7 + 3) % layouts.len()];
            let mut pairs = vec![(a.as_str(), b.as_str(), from, to)];
            if i % 4 == 0 {
                pairs.push((a.as_str(), "tp=2,pp=2,dp=2", from, &plain));
                pairs.push(("tp=2,pp=2,dp=2", a.as_str(), &plain, from));
            }
            for (x, y, from, to) in pairs {
                let problem = Problem::new(from.clone(), to.clone(), cluster.clone()).unwrap();
                for name in PLANNERS {
                    let plan = planner(name)
                        .unwrap()
                        .plan(&problem)
                        .unwrap_or_else(|e| panic!("{model} {x} -> {y} with {name}: {e}"));
                    check(&plan).unwrap_or_else(|v| panic!("{model} {x} -> {y} with {name}: {v}"));
                    run_and_compare(&plan, 7).unwrap_or_else(|m| panic!("{model} {x} -> {y} with {name}: {m}"));
                    checked += 1;
                }
            }
        }
    }
    assert!(differently >= 3, "only {differently} layouts cut replicas differently");
    assert!(checked > 300, "{checked} plans");
}
