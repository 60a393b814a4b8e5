//! Planning, checking and simulation time against model size and GPU count,
//! and the time to fetch a cached switch plan or weight-sync plan (the
//! latter for a tiny MoE model and, under `cargo bench`, for the 1T
//! Kimi-K2-like model of the rl suite: 256 trainer GPUs to 16 engines of 8).
//!
//! `cargo bench -p tenplan-bench --bench planning` (criterion; reports in
//! target/criterion).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tenplan::models::{find, ModelState, StateKind};
use tenplan::planner::{planner, simulate, PLANNERS};
use tenplan::proofs::check;
use tenplan::ptc::{Cluster, Problem};

fn problem(model: &str, cluster: &str, from: &str, to: &str) -> Problem {
    let state = ModelState::new(find(model).unwrap(), StateKind::Training);
    Problem::new(
        state.layout(&from.parse().unwrap()).unwrap(),
        state.layout(&to.parse().unwrap()).unwrap(),
        Cluster::parse(cluster).unwrap(),
    )
    .unwrap()
}

fn cases() -> Vec<(&'static str, Problem)> {
    let mut cases = vec![
        (
            "gpt3-1.3b/16",
            problem("gpt3-1.3b", "tenplex-onprem", "tp=4,pp=2,dp=1", "tp=4,pp=2,dp=2"),
        ),
        (
            "gpt3-6.7b/16",
            problem("gpt3-6.7b", "tenplex-onprem", "tp=4,pp=2,dp=1", "tp=4,pp=2,dp=2"),
        ),
    ];
    // `cargo test` runs every bench once: keep that pass short, and measure
    // the 1024-GPU case only under `cargo bench`, which passes `--bench`.
    if std::env::args().any(|a| a == "--bench") {
        let big = problem(
            "gpt3-175b",
            "dgx-h100:128",
            "tp=8,pp=16,dp=8,zero=1",
            "tp=8,pp=16,dp=6,zero=1",
        );
        cases.push(("gpt3-175b/1024", big));
    }
    cases
}

fn bench(c: &mut Criterion) {
    let cases = cases();
    let mut g = c.benchmark_group("plan");
    g.sample_size(10);
    for (name, p) in &cases {
        for planner_name in PLANNERS {
            let pl = planner(planner_name).unwrap();
            g.bench_with_input(BenchmarkId::new(*planner_name, name), p, |b, p| {
                b.iter(|| pl.plan(p).unwrap())
            });
        }
    }
    g.finish();
    let mut g = c.benchmark_group("judge");
    g.sample_size(10);
    for (name, p) in &cases {
        let plan = planner("hotspa").unwrap().plan(p).unwrap();
        g.bench_with_input(BenchmarkId::new("check", name), &plan, |b, plan| {
            b.iter(|| check(plan).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("simulate", name), &plan, |b, plan| {
            b.iter(|| simulate(plan))
        });
    }
    g.finish();
}

/// A training loop asks for the same switch every step: a cache hit.
fn switch_cache(c: &mut Criterion) {
    use tenplan::application::{Session, SwitchRequest, SwitchState};
    let req = SwitchRequest {
        model: find("llama-tiny").unwrap().clone(),
        cluster: Cluster::parse("1x4").unwrap(),
        configs: ["tp=1,dp=4", "tp=2,dp=2", "tp=4,dp=1"]
            .iter()
            .map(|c| c.parse().unwrap())
            .collect(),
        state: SwitchState::Params,
        planner: "lp".parse().unwrap(),
        memory_budget: None,
    };
    let session = Session::new();
    session.switch(&req).unwrap();
    let key = req.key(0, 1);
    c.bench_function("switch/cached", |b| {
        b.iter(|| session.cached_switch(std::hint::black_box(&key)).unwrap())
    });
}

fn sync_cache(c: &mut Criterion) {
    use tenplan::application::{Session, SyncRequest};
    use tenplan::ptc::DType;
    let mut cases = vec![(
        "mixtral-tiny/4-to-2x2",
        "mixtral-tiny",
        "tp=2,dp=2",
        "tp=2,dp=2,devices=4-7",
        "2x4",
    )];
    if std::env::args().any(|a| a == "--bench") {
        cases.push((
            "kimi-k2/256-to-16x8",
            "kimi-k2",
            "tp=8,pp=8,dp=4,ep=4,split=8:8:8:8:8:7:7:7",
            "tp=8,dp=16,devices=256-383",
            "dgx-h100-rail:48",
        ));
    }
    let session = Session::new();
    for (name, model, trainer, engines, cluster) in cases {
        let req = SyncRequest {
            model: find(model).unwrap().clone(),
            trainer: trainer.parse().unwrap(),
            engines: engines.parse().unwrap(),
            cluster: Cluster::parse(cluster).unwrap(),
            dtype: DType::BF16,
            trainer_dtype: None,
            planner: "lp".parse().unwrap(),
        };
        session.sync(&req).unwrap();
        c.bench_function(&format!("sync/cached/{name}"), |b| {
            b.iter(|| session.cached_sync(std::hint::black_box(&req)).unwrap())
        });
    }
}

criterion_group!(benches, bench, switch_cache, sync_cache);
criterion_main!(benches);
