//! `tenplan switch`: hot switches between parallel strategies (HotSPa)
//! and the best order of a step.

use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use tenplan::application::{Config, Schedule, Session, SwitchRequest, SwitchState};
use tenplan::models::resolve;
use tenplan::ptc::Cluster;
use tenplan::render::{self, SwitchSummary, HOTSPA_STEP_S};

use crate::out;

#[derive(Args)]
pub struct SwitchArgs {
    /// Model name (see `tenplan models`).
    #[arg(long)]
    model: String,
    /// Cluster: NODESxGPUS or a preset (dgx-h100, dgx-h100:NODES, ...).
    #[arg(long, default_value = "dgx-h100")]
    cluster: String,
    /// Strategies, the base (where the optimizer state lives) first.
    #[arg(long, num_args = 2.., required = true)]
    configs: Vec<String>,
    /// What moves at each switch: params, or params+grads.
    #[arg(long, default_value = "params")]
    state: String,
    /// Planner for every switch.
    #[arg(long, default_value = "lp")]
    planner: String,
    /// Bytes a device may hold while two layouts coexist (e.g. 80GB, 64GiB).
    #[arg(long)]
    memory_budget: Option<String>,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct SwitchOutput<'a> {
    model: &'a str,
    cluster: &'a str,
    state: &'a str,
    planner: &'a str,
    #[serde(flatten)]
    schedule: &'a Schedule,
    /// Per-step switching time over HotSPa's step times (LLaMA-2-7B, 8 GPUs).
    overhead_vs_hotspa_step: (f64, f64),
    /// Median time to fetch a cached switch plan.
    cached_lookup_ns: f64,
    planning_time_s: f64,
}

pub fn switch(a: SwitchArgs) -> Result<()> {
    let budget = a
        .memory_budget
        .as_deref()
        .map(tenplan::ptc::limits::parse_bytes)
        .transpose()?;
    let req = SwitchRequest {
        model: resolve(&a.model)?,
        cluster: Cluster::open(&a.cluster)?,
        configs: a
            .configs
            .iter()
            .map(|c| c.parse::<Config>())
            .collect::<Result<_, _>>()?,
        state: SwitchState::parse(&a.state)
            .with_context(|| format!("unknown state `{}` (expected params or params+grads)", a.state))?,
        planner: a.planner.parse()?,
        memory_budget: budget,
    };
    let session = Session::new();
    let start = Instant::now();
    let sched = session.switch(&req)?;
    let planning_time_s = start.elapsed().as_secs_f64();
    let lookup_ns = session.switch_lookup_ns(&req.key(sched.order_indices[0], sched.order_indices[1]));
    if a.json {
        let o = SwitchOutput {
            model: &req.model.name,
            cluster: &a.cluster,
            state: req.state.as_str(),
            planner: &a.planner,
            schedule: &sched,
            overhead_vs_hotspa_step: (sched.total_s / HOTSPA_STEP_S.0, sched.total_s / HOTSPA_STEP_S.1),
            cached_lookup_ns: lookup_ns,
            planning_time_s,
        };
        out(&format!("{}\n", serde_json::to_string(&o)?));
        return Ok(());
    }
    out(&render::switch_table(&SwitchSummary {
        model: &req.model.name,
        cluster: &a.cluster,
        state: req.state.as_str(),
        planner: &a.planner,
        schedule: &sched,
        planned: session.cached_switches(),
        planning_time_s,
        lookup_ns,
    }));
    Ok(())
}
