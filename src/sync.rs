//! `tenplan sync`: the weights of a training job, as it holds them, to the
//! layout inference engines serve them in (RL post-training's weight
//! sync): plan with each planner, check every plan with the independent
//! checker, bound and simulate.

use anyhow::{bail, Context, Result};
use clap::Args;
use tenplan::application::{compare_sync, default_cluster, Config, SyncRequest};
use tenplan::models::resolve;
use tenplan::planner::{PlannerSpec, SYNC_COMPARED};
use tenplan::ptc::{Cluster, DType};
use tenplan::render;

use crate::{failed, out};

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

pub fn sync(a: SyncArgs) -> Result<()> {
    let held: DType = a.dtype.parse().context("--dtype")?;
    let dtype: DType = match &a.to_dtype {
        Some(to) => to.parse().context("--to-dtype")?,
        None => held,
    };
    let (trainer, engines): (Config, Config) = (a.from.parse().context("--from")?, a.to.parse().context("--to")?);
    let cluster = match &a.cluster {
        Some(c) => Cluster::open(c)?,
        None => {
            let last = trainer
                .parsed()
                .rank_devices()?
                .into_iter()
                .chain(engines.parsed().rank_devices()?)
                .max()
                .unwrap_or(0);
            default_cluster(last + 1)?
        }
    };
    let planners = a
        .planners
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(str::parse::<PlannerSpec>)
        .collect::<Result<Vec<_>, _>>()?;
    let Some(first) = planners.first().cloned() else {
        bail!("--planners names no planner");
    };
    let req = SyncRequest {
        model: resolve(&a.model)?,
        trainer,
        engines,
        cluster,
        dtype,
        trainer_dtype: Some(held),
        planner: first,
    };
    let mut comparison = compare_sync(&req, &planners).map_err(failed)?;
    // The cluster as the user named it.
    if let Some(c) = &a.cluster {
        comparison.cluster = c.clone();
    }
    if a.json {
        out(&format!("{}\n", serde_json::to_string(&comparison)?));
    } else {
        out(&render::sync_table(&comparison));
    }
    Ok(())
}
