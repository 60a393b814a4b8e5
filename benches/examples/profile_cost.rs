//! Where a scheduler's cost query spends its time: GPT-3 6.7B training
//! state on two DGX-H100 nodes, the questions of `benches/python_cost.py`
//! (layouts built beforehand), each stage of the `lp` answer timed.
//!
//! `cargo run --release -p tenplan-bench --example profile_cost [QUESTIONS]`

use std::time::Instant;

use tenplan::models::{find, ModelState, StateKind};
use tenplan::planner::{fragments, simulate, trivial_lower_bound, LayoutClasses, LpPlanner, Planner, Reduced};
use tenplan::proofs::check;
use tenplan::ptc::{Cluster, Layout, Problem};

const CONFIGS: [&str; 16] = [
    "tp=8",
    "tp=8,devices=8-15",
    "tp=4,dp=2",
    "tp=4,dp=2,devices=8-15",
    "tp=4,dp=4",
    "tp=8,dp=2",
    "tp=2,pp=2,dp=2",
    "tp=2,pp=2,dp=4",
    "tp=4,pp=2,dp=2",
    "tp=4,pp=2",
    "tp=2,pp=4",
    "tp=8,pp=2",
    "tp=2,pp=4,dp=2",
    "tp=1,pp=8",
    "tp=2,dp=4",
    "tp=1,pp=8,dp=2",
];

fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args().nth(1).map_or(Ok(96), |s| s.parse())?;
    let spec = find("gpt3-6.7b").expect("a preset");
    let cluster = Cluster::parse("dgx-h100:2")?;
    let state = ModelState::new(spec, StateKind::Training);
    let layouts: Vec<(Layout, LayoutClasses)> = CONFIGS
        .iter()
        .map(|c| {
            let l = state.layout(&c.parse()?)?;
            let k = LayoutClasses::of(&l);
            Ok((l, k))
        })
        .collect::<anyhow::Result<_>>()?;
    let m = CONFIGS.len();
    let questions: Vec<(usize, usize)> = (0..m)
        .flat_map(|a| (0..m).map(move |b| (a, b)))
        .filter(|&(a, b)| a != b && b != (a + 1) % m)
        .take(n)
        .collect();
    let stages = ["reduce", "bound", "lp", "expand", "check", "simulate"];
    let mut total = [0.0f64; 6];
    let mut makespans = Vec::new();
    for &(a, b) in &questions {
        let mut t = Instant::now();
        let mut lap = |i: usize| {
            total[i] += t.elapsed().as_secs_f64();
            t = Instant::now();
        };
        let problem = Problem::new(layouts[a].0.clone(), layouts[b].0.clone(), cluster.clone())?;
        let r = Reduced::with_classes(&problem, &layouts[a].1, &layouts[b].1)?.expect("layers repeat");
        lap(0);
        std::hint::black_box(trivial_lower_bound(r.problem(), &fragments(r.problem())?));
        lap(1);
        // As the scheduler's price plans it (`Session::cost`).
        let (small, _) = LpPlanner::builder()
            .presolve(false)
            .build()
            .plan_with_bound(r.problem())?;
        lap(2);
        let plan = r.expand(&small)?;
        lap(3);
        check(&plan)?;
        lap(4);
        makespans.push(simulate(&plan).makespan_s);
        lap(5);
    }
    let q = questions.len() as f64;
    #[allow(clippy::print_stdout)]
    {
        println!("{} questions, mean ms per question:", questions.len());
        for (s, t) in stages.iter().zip(total) {
            println!("  {s:<9}{:>8.3}", t / q * 1e3);
        }
        println!("  {:<9}{:>8.3}", "total", total.iter().sum::<f64>() / q * 1e3);
        println!("  sum of simulated makespans {:.6} s", makespans.iter().sum::<f64>());
    }
    Ok(())
}
