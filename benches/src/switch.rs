//! The hotspa suite: hot switching's per-step cost, `lp` against the
//! hotspa baseline.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use tenplan::application::units::seconds;
use tenplan::application::{Config, Session, SwitchRequest, SwitchState};
use tenplan::models::resolve;
use tenplan::planner::PlannerSpec;
use tenplan::ptc::Cluster;
use tenplan::render::HOTSPA_STEP_S;

use crate::{out, write_atomic};

#[derive(Args)]
pub struct BenchSwitchArgs {
    /// Write the results here as JSON (one object per model, cluster, state and planner).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Planners to compare.
    #[arg(long, value_delimiter = ',', default_value = "lp,hotspa")]
    planners: Vec<String>,
    /// Models.
    #[arg(long, value_delimiter = ',', default_value = "llama2-7b,llama2-13b")]
    models: Vec<String>,
}

#[derive(Serialize)]
struct BenchRow {
    model: String,
    cluster: String,
    gpus: u32,
    state: String,
    planner: String,
    order: Vec<String>,
    total_s: f64,
    total_bound_s: f64,
    bytes_moved: u64,
    peak_device_bytes: u64,
    worst_switch_ratio: f64,
    overhead_vs_hotspa_step: (f64, f64),
    cached_lookup_ns: f64,
    planning_time_s: f64,
    switches: Vec<serde_json::Value>,
}

/// The `hotspa` suite: LLaMA-2 7B and 13B on one and two DGX-H100 nodes,
/// strategies TP ∈ {1, 2, 4, 8} with DP = GPUs / TP, params and params+grads.
pub fn bench_switch(a: BenchSwitchArgs) -> Result<()> {
    let mut rows = Vec::new();
    for model in &a.models {
        for nodes in [1u32, 2] {
            let cluster = format!("dgx-h100:{nodes}");
            let gpus = 8 * nodes;
            let configs: Vec<String> = [1u32, 2, 4, 8]
                .iter()
                .map(|tp| format!("tp={tp},dp={}", gpus / tp))
                .collect();
            for state in ["params", "params+grads"] {
                for planner in &a.planners {
                    let req = SwitchRequest {
                        model: resolve(model)?,
                        cluster: Cluster::open(&cluster)?,
                        configs: configs.iter().map(|c| c.parse::<Config>()).collect::<Result<_, _>>()?,
                        state: SwitchState::parse(state).context("a switch state")?,
                        planner: planner.parse::<PlannerSpec>()?,
                        memory_budget: None,
                    };
                    let session = Session::new();
                    let start = Instant::now();
                    let sched = session.switch(&req)?;
                    let planning_time_s = start.elapsed().as_secs_f64();
                    let key = req.key(sched.order_indices[0], sched.order_indices[1]);
                    rows.push(BenchRow {
                        model: model.clone(),
                        cluster: cluster.clone(),
                        gpus,
                        state: state.into(),
                        planner: planner.clone(),
                        order: sched.order.clone(),
                        total_s: sched.total_s,
                        total_bound_s: sched.total_bound_s,
                        bytes_moved: sched.bytes_moved,
                        peak_device_bytes: sched.peak_device_bytes,
                        worst_switch_ratio: sched
                            .switches
                            .iter()
                            .map(|s| s.makespan_s / s.lower_bound_s)
                            .fold(0.0, f64::max),
                        overhead_vs_hotspa_step: (sched.total_s / HOTSPA_STEP_S.0, sched.total_s / HOTSPA_STEP_S.1),
                        cached_lookup_ns: session.switch_lookup_ns(&key),
                        planning_time_s,
                        switches: sched
                            .switches
                            .iter()
                            .map(|s| serde_json::to_value(&**s))
                            .collect::<Result<_, _>>()?,
                    });
                }
            }
        }
    }
    let mut t = String::from(
        "| model | GPUs | state | planner | best order | switching per step | bound | worst switch / bound | vs lp | overhead of a 13.9–30.8 s step | cached lookup |\n",
    );
    t += "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|\n";
    for r in &rows {
        let lp = rows
            .iter()
            .find(|x| x.model == r.model && x.cluster == r.cluster && x.state == r.state && x.planner == "lp")
            .map_or(f64::NAN, |x| r.total_s / x.total_s);
        t += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.3} | {:.3}× | {:.2}%–{:.2}% | {:.0} ns |\n",
            r.model,
            r.gpus,
            r.state,
            r.planner,
            r.order.join(" → "),
            seconds(r.total_s),
            seconds(r.total_bound_s),
            r.worst_switch_ratio,
            lp,
            100.0 * r.overhead_vs_hotspa_step.1,
            100.0 * r.overhead_vs_hotspa_step.0,
            r.cached_lookup_ns
        );
    }
    out(&t);
    if let Some(path) = &a.json {
        write_atomic(path, serde_json::to_string_pretty(&rows)?.as_bytes())?;
    }
    Ok(())
}
