//! `tenplan sync`: the weights of a training job, as it holds them, to the
//! layout inference engines serve them in (RL post-training's weight
//! sync): plan with each planner, check every plan with the independent
//! checker, bound and simulate.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use tenplan::models::{resolve, ParallelConfig};
use tenplan::planner::sync::{Conversion, SyncRequest};
use tenplan::planner::{BroadcastFloor, Error, SYNC_COMPARED};
use tenplan::ptc::{Cluster, DType};
use tenplan::report::{bytes, seconds, PlanReport};

use crate::{out, Exit};

#[derive(Args)]
pub struct SyncArgs {
    /// Model: a catalog name, a config.json or a Hugging Face model directory.
    #[arg(long)]
    model: String,
    /// The trainer's layout, e.g. tp=8,pp=4,dp=8 (devices=A-B to place it).
    #[arg(long)]
    from: String,
    /// The inference engines' layout: tp=N per engine, dp=number of engine
    /// replicas, ep=E to spread the experts over E groups of tp/E ranks,
    /// devices=A-B (usually disjoint from the trainer's).
    #[arg(long)]
    to: String,
    /// Cluster (see `tenplan plan --help`); default: enough DGX-H100 nodes
    /// for both layouts.
    #[arg(long)]
    cluster: Option<String>,
    /// Element type the trainer holds the weights in.
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Element type the engines want, when it differs from --dtype: asks
    /// each trainer rank to convert its pieces before sending (fp32 master
    /// weights to bf16 engines: `--dtype f32 --to-dtype bf16`, rounded to
    /// nearest even); the plan moves the converted bytes.
    #[arg(long)]
    to_dtype: Option<String>,
    /// Planners to compare, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = SYNC_COMPARED.iter().map(|s| s.to_string()))]
    planners: Vec<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct SyncReport {
    model: String,
    from: String,
    to: String,
    cluster: String,
    dtype: String,
    bytes: u64,
    /// The conversion each trainer rank makes before sending (--to-dtype).
    #[serde(skip_serializing_if = "Option::is_none")]
    conversion: Option<Conversion>,
    rows: Vec<PlanReport>,
    /// The least time checkpoint-engine's policy (a bucketed broadcast of
    /// every weight to every engine device) could take here.
    broadcast_floor: BroadcastFloor,
}

pub fn sync(a: SyncArgs) -> Result<()> {
    let held: DType = a.dtype.parse().context("--dtype")?;
    let dtype: DType = match &a.to_dtype {
        Some(to) => to.parse().context("--to-dtype")?,
        None => held,
    };
    let spec = resolve(&a.model)?;
    let (from, to): (ParallelConfig, ParallelConfig) =
        (a.from.parse().context("--from")?, a.to.parse().context("--to")?);
    let last = from
        .rank_devices()?
        .into_iter()
        .chain(to.rank_devices()?)
        .max()
        .unwrap_or(0);
    let cluster_name = a
        .cluster
        .clone()
        .unwrap_or_else(|| format!("dgx-h100:{}", (last / 8 + 1)));
    let cluster = Cluster::open(&cluster_name)?;
    let base = SyncRequest {
        model: spec.clone(),
        trainer: a.from.clone(),
        engines: a.to.clone(),
        cluster,
        dtype,
        trainer_dtype: Some(held),
        planner: String::new(),
    };
    let conversion = base.conversion()?;
    // One problem for every planner: its layouts are the costly part.
    let problem = base.problem()?;
    let mut rows = Vec::new();
    let mut floor = None;
    for name in a.planners.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let req = SyncRequest {
            planner: name.to_string(),
            ..base.clone()
        };
        let done = match req.plan_problem(&problem) {
            Err(Error::Rejected { planner, verdict }) => {
                return Err(Exit::Rejected(format!("planner {planner} produced a plan that {verdict}")).into())
            }
            r => r?,
        };
        floor = Some(done.broadcast_floor);
        rows.push(done.report);
    }
    let Some(broadcast_floor) = floor else {
        bail!("--planners names no planner");
    };
    let report = SyncReport {
        model: spec.name.to_string(),
        from: a.from.clone(),
        to: a.to.clone(),
        cluster: cluster_name,
        dtype: dtype.to_string(),
        bytes: broadcast_floor.bytes,
        conversion,
        broadcast_floor,
        rows,
    };
    if a.json {
        out(&format!("{}\n", serde_json::to_string(&report)?));
    } else {
        out(&table(&report));
    }
    Ok(())
}

fn table(r: &SyncReport) -> String {
    let mut t = format!(
        "{} weights ({}, {}) from the trainer's {} to inference engines {} on {}\n\n",
        r.model,
        r.dtype,
        bytes(r.bytes),
        r.from,
        r.to,
        r.cluster
    );
    if let Some(c) = &r.conversion {
        t += &format!(
            "Each trainer rank converts its {} pieces to {} before sending ({}); the plans move {} bytes.\n\n",
            c.from,
            c.to,
            if c.lossy {
                "a narrowing, as asked: values are rounded to nearest even"
            } else {
                "exact"
            },
            c.to
        );
    }
    t += "| planner | simulated | lower bound | gap | cross-node | moved | copies | planning | checked |\n";
    t += "|---|---:|---:|---:|---:|---:|---:|---:|---|\n";
    for p in &r.rows {
        t += &format!(
            "| {} | {} | {} | {:.3} | {} | {} | {} | {} | {} |\n",
            p.planner,
            seconds(p.makespan_s),
            seconds(p.lower_bound_s),
            p.gap,
            bytes(p.bytes_cross_node),
            bytes(p.bytes_moved),
            p.copies,
            seconds(p.planning_time_s),
            if p.verified { "yes" } else { "NO" }
        );
    }
    let f = &r.broadcast_floor;
    t += &format!(
        "\nA bucketed broadcast of every weight to every engine device (checkpoint-engine's policy, planned as `broadcast`) takes at least {} ({}).\n",
        seconds(f.seconds),
        f.reason
    );
    t
}
