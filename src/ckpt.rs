//! The checkpoint commands: init, reshard, check, import, export, diff.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tenplan::application::{
    self as app, Config, ExportRequest, ImportRequest, InitRequest, ModelArg, Progress, ReshardRequest, Target,
    DEFAULT_MAX_SHARD_BYTES,
};
use tenplan::models::{resolve, MeshConfig, StateKind, TpPlacement};
use tenplan::ptc::{Cluster, DType, JobState};
use tenplan::render;

use crate::{failed, out, Exit};

#[derive(Args)]
pub struct InitArgs {
    /// Model name (see `tenplan models`).
    #[arg(long)]
    model: String,
    /// Parallel layout, e.g. tp=2,dp=2.
    #[arg(long)]
    layout: String,
    /// The new checkpoint directory (must not exist).
    #[arg(long)]
    out: PathBuf,
    /// Seed of the generated contents.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Element type of the weights (with --weights-only; training state is bf16 + fp32).
    #[arg(long)]
    dtype: Option<String>,
    /// Write the weights alone instead of the whole training state.
    #[arg(long)]
    weights_only: bool,
    /// Cluster the layout's devices belong to (default: enough DGX-H100 nodes).
    #[arg(long)]
    cluster: Option<String>,
    /// The job's dataset and RNG state (JSON: {"dataset": {...}, "rng": {...}}), kept in the manifest.
    #[arg(long)]
    job: Option<PathBuf>,
    /// Replace what `--out` holds: an interrupted write, or a complete
    /// checkpoint (swapped in only once the new one is complete).
    #[arg(long)]
    overwrite: bool,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ReshardArgs {
    /// The source: a tenplan checkpoint, a PyTorch DCP checkpoint
    /// (`.metadata` and `__<rank>_<n>.distcp`), or a Megatron-Core
    /// torch_dist checkpoint (a DCP checkpoint beside metadata.json and
    /// common.pt); never modified.
    #[arg(long)]
    src: PathBuf,
    /// Model of a DCP or Megatron-Core source: a name, a config.json or a Hugging Face model
    /// directory (default: a config.json beside the checkpoint).
    #[arg(long)]
    model: Option<String>,
    /// The target layout: a DTensor mesh with torchtitan's dimensions
    /// (dp_shard=N, dp_replicate=R, tp=T, pp, cp, ep; the state as the source holds it,
    /// every tensor under its own name and every other entry carried, written
    /// in the source's format; tp splits each tensor as the --model's
    /// transformers plan says), or a Megatron configuration such as tp=4,dp=1
    /// (the model's state as tenplan's catalog lays it out).
    #[arg(long)]
    to: String,
    /// The new checkpoint directory (must not exist).
    #[arg(long)]
    out: PathBuf,
    /// Planner: lp, lp-placed, tenplex, central, least-loaded or hotspa.
    #[arg(long, default_value = "lp")]
    planner: String,
    /// Cluster (default: the source manifest's, grown to fit the target).
    #[arg(long)]
    cluster: Option<String>,
    /// Format to write: dcp, torch_dist or tenplan (default: the source's
    /// for a mesh target and for a Megatron-Core source, tenplan for a
    /// Megatron target of any other source).
    #[arg(long)]
    format: Option<String>,
    /// Leave out, on purpose, the source's optimizer state and entries that
    /// are not tensors, where the target has no place for them (the summary
    /// lists what was left out).
    #[arg(long)]
    weights_only: bool,
    /// Leave out, on purpose, the source entries whose names contain
    /// PATTERN (repeatable; the summary lists what was left out).
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,
    /// A mesh target's tensor-parallel placement for the tensors whose
    /// names match PATTERN (`*` matches anything; an optimizer moment
    /// matches by its parameter): PATTERN=Shard(d) or PATTERN=Replicate().
    /// Repeatable; the last that matches decides, over --model's plan.
    #[arg(long, value_name = "PATTERN=PLACEMENT")]
    place: Vec<String>,
    /// A mesh target's FSDP2 placement for the tensors whose names match
    /// PATTERN, as the job's `fully_shard(shard_placement_fn=...)` says:
    /// PATTERN=Shard(d) (default Shard(0)). Repeatable; the last that
    /// matches decides; an optimizer moment matches by its parameter.
    #[arg(long, value_name = "PATTERN=Shard(d)")]
    fsdp_place: Vec<String>,
    /// With --format torch_dist of a model: the Megatron-Core layer
    /// implementation the checkpoint is for, as Megatron-LM's
    /// --transformer-impl (transformer_engine, the default, or local);
    /// they save some norms under different names.
    #[arg(long, value_name = "IMPL")]
    transformer_impl: Option<String>,
    /// Replace what `--out` holds: an interrupted write, or a complete
    /// checkpoint (swapped in only once the new one is complete).
    #[arg(long)]
    overwrite: bool,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ImportArgs {
    /// Directory of the Hugging Face model (model.safetensors or an index with shards).
    #[arg(long)]
    hf: PathBuf,
    /// Model: a name (see `tenplan models`), a config.json or a model
    /// directory; names and shapes must match it (default: the config.json in --hf).
    #[arg(long)]
    model: Option<String>,
    /// Parallel layout, e.g. tp=2,pp=2.
    #[arg(long)]
    layout: String,
    /// The new checkpoint directory (must not exist).
    #[arg(long)]
    out: PathBuf,
    /// Element type (default: the model files').
    #[arg(long)]
    dtype: Option<String>,
    /// Cluster the layout's devices belong to (default: enough DGX-H100 nodes).
    #[arg(long)]
    cluster: Option<String>,
    /// Leave out, on purpose, the model files' tensors whose names contain
    /// PATTERN (repeatable); a tensor the model does not read is refused
    /// otherwise.
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,
    /// Replace what `--out` holds: an interrupted write, or a complete
    /// checkpoint (swapped in only once the new one is complete).
    #[arg(long)]
    overwrite: bool,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    json: bool,
}

/// A byte progress bar on standard error, hidden when it is not a terminal.
fn progress_bar(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// A progress bar that a library operation drives.
struct Bar(ProgressBar);

impl Progress for Bar {
    fn start(&self, total: u64) {
        self.0.set_length(total);
    }

    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }
}

/// Print an outcome: itself as JSON, or its summary for people.
fn summary<T: serde::Serialize>(json: bool, outcome: &T, text: impl FnOnce(&T) -> String) -> Result<()> {
    if json {
        out(&format!("{}\n", serde_json::to_string(outcome)?));
    } else {
        out(&text(outcome));
    }
    Ok(())
}

/// `--model`, resolved.
fn model_arg(model: Option<&str>) -> Result<Option<ModelArg>> {
    Ok(model.map(ModelArg::resolve).transpose()?)
}

/// `--cluster`, opened.
fn cluster_arg(cluster: Option<&str>) -> Result<Option<Cluster>> {
    Ok(cluster.map(Cluster::open).transpose()?)
}

pub fn init(a: InitArgs) -> Result<()> {
    let state = match (a.weights_only, &a.dtype) {
        (true, d) => StateKind::Weights(d.as_deref().unwrap_or("bf16").parse::<DType>()?),
        (false, None) => StateKind::Training,
        (false, Some(_)) => bail!("--dtype applies to --weights-only; training state is bf16 weights + fp32 optimizer"),
    };
    let req = InitRequest {
        model: resolve(&a.model)?,
        state,
        layout: a.layout.parse::<Config>()?,
        out: a.out.clone(),
        seed: a.seed,
        cluster: cluster_arg(a.cluster.as_deref())?,
        job: match &a.job {
            Some(p) => crate::read_job(p)?,
            None => JobState::default(),
        },
        overwrite: a.overwrite,
    };
    let bar = Bar(progress_bar(0, "init"));
    let done = app::init(&req, &bar);
    bar.0.finish_and_clear();
    summary(a.json, &done?, render::initialized)
}

/// The placements given with `flag` (`PATTERN=Shard(d)`, `PATTERN=Replicate()`).
fn placements_arg(flag: &str, given: &[String]) -> Result<Vec<TpPlacement>> {
    given
        .iter()
        .map(|p| p.parse::<TpPlacement>().with_context(|| format!("{flag} {p}")))
        .collect()
}

pub fn reshard(a: ReshardArgs) -> Result<()> {
    let mut req = ReshardRequest::new(&a.src, &a.out, a.to.parse::<Target>()?);
    req.model = model_arg(a.model.as_deref())?;
    req.cluster = cluster_arg(a.cluster.as_deref())?;
    req.planner = a.planner.parse()?;
    req.format = a.format.as_deref().map(str::parse).transpose()?;
    req.weights_only = a.weights_only;
    req.exclude = a.exclude.clone();
    req.place = placements_arg("--place", &a.place)?;
    req.fsdp_place = placements_arg("--fsdp-place", &a.fsdp_place)?;
    req.transformer_impl = a
        .transformer_impl
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(|e: String| anyhow::anyhow!("--transformer-impl: {e}"))?;
    req.overwrite = a.overwrite;
    let bar = Bar(progress_bar(0, "reshard"));
    let done = app::reshard(&req, &bar);
    bar.0.finish_and_clear();
    summary(a.json, &done.map_err(failed)?, render::resharded)
}

pub fn check(dir: &Path, json: bool) -> Result<()> {
    summary(json, &app::check(dir)?, render::checked)
}

pub fn import(a: ImportArgs) -> Result<()> {
    let req = ImportRequest {
        hf: a.hf.clone(),
        model: model_arg(a.model.as_deref())?,
        layout: a.layout.parse::<Config>()?,
        out: a.out.clone(),
        dtype: a.dtype.as_deref().map(str::parse::<DType>).transpose()?,
        cluster: cluster_arg(a.cluster.as_deref())?,
        exclude: a.exclude.clone(),
        overwrite: a.overwrite,
    };
    let bar = Bar(progress_bar(0, "import"));
    let done = app::import(&req, &bar);
    bar.0.finish_and_clear();
    summary(a.json, &done?, render::imported)
}

#[derive(Args)]
pub struct ExportArgs {
    /// The checkpoint directory: tenplan's, or a PyTorch DCP checkpoint (never modified).
    ckpt: PathBuf,
    /// Model of a DCP checkpoint: a name, a config.json or a Hugging Face
    /// model directory (default: a config.json beside the checkpoint).
    #[arg(long)]
    model: Option<String>,
    /// The new Hugging Face model directory (must not exist).
    #[arg(long, required_unless_present = "dcp", conflicts_with = "dcp")]
    hf: Option<PathBuf>,
    /// Instead, a new PyTorch DCP checkpoint of the transformers model
    /// (must not exist): Hugging Face names, as an FSDP2 job on the model
    /// saves it and loads it with dcp.load; config.json beside it.
    #[arg(long)]
    dcp: Option<PathBuf>,
    /// The DCP checkpoint's mesh: how the FSDP2 job that loads it shards
    /// the weights (dp_shard=N, dp_replicate=R, tp=T as the model's
    /// tensor-parallel plan splits) [default: dp_shard=1].
    #[arg(long, value_name = "MESH")]
    to: Option<String>,
    /// Largest shard: bytes, or with a unit (500MB, 2GiB), as transformers' max_shard_size [default: 5GB].
    #[arg(long)]
    max_shard_size: Option<String>,
    /// Leave out, on purpose, what is not a model weight (optimizer state,
    /// master weights, entries that are not tensors): Hugging Face files
    /// hold weights only, and a checkpoint that holds more is refused
    /// otherwise.
    #[arg(long)]
    weights_only: bool,
    /// Leave out, on purpose, the entries whose names contain PATTERN
    /// (repeatable).
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    json: bool,
}

/// A size as transformers writes it: `5GB` is 5 * 10^9 bytes, `5GiB` 5 * 2^30.
fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "KIB" => 1 << 10,
        "MIB" => 1 << 20,
        "GIB" => 1 << 30,
        "TIB" => 1 << 40,
        _ => bail!("--max-shard-size {s}: unknown unit (use B, KB, MB, GB, KiB, MiB or GiB)"),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n > 0)
        .with_context(|| format!("--max-shard-size {s}: expected a positive size such as 5GB"))
}

pub fn export(a: ExportArgs) -> Result<()> {
    let mesh = match (&a.dcp, a.to.as_deref()) {
        (None, Some(to)) => bail!("--to {to} is the mesh of a DCP checkpoint: give --dcp DIR instead of --hf"),
        (None, None) => None,
        (Some(_), to) => Some(
            to.unwrap_or("dp_shard=1")
                .parse::<MeshConfig>()
                .with_context(|| format!("--to {}", to.unwrap_or_default()))?,
        ),
    };
    let req = ExportRequest {
        ckpt: a.ckpt.clone(),
        model: model_arg(a.model.as_deref())?,
        out: a.dcp.clone().or(a.hf.clone()).expect("clap requires --hf or --dcp"),
        dcp: mesh,
        max_shard_bytes: match &a.max_shard_size {
            Some(s) => parse_size(s)?,
            None => DEFAULT_MAX_SHARD_BYTES,
        },
        weights_only: a.weights_only,
        exclude: a.exclude.clone(),
    };
    let bar = Bar(progress_bar(0, "export"));
    let done = app::export(&req, &bar);
    bar.0.finish_and_clear();
    summary(a.json, &done?, render::exported)
}

#[derive(Args)]
pub struct DiffArgs {
    /// A tenplan checkpoint, a PyTorch DCP checkpoint or a Hugging Face model directory.
    a: PathBuf,
    /// Another one.
    b: PathBuf,
    /// Compare the model's weights only (leave out optimizer state and gradients).
    #[arg(long)]
    weights_only: bool,
    /// Model of a DCP checkpoint or of a Hugging Face directory without a
    /// config.json (a name, a config.json or a directory).
    #[arg(long)]
    model: Option<String>,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    json: bool,
}

pub fn diff(a: DiffArgs) -> Result<()> {
    let model = model_arg(a.model.as_deref())?;
    let d = app::diff(&a.a, &a.b, model.as_ref(), a.weights_only)?;
    summary(a.json, &d, render::diffed)?;
    if !d.identical {
        return Err(Exit::Differ(render::differ_line(&d)).into());
    }
    Ok(())
}
