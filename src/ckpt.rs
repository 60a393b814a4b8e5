//! The checkpoint commands: init, reshard, check, import, export, diff.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tenplan::executor::checkpoint::{self, CheckpointInfo, Destination};
use tenplan::executor::generate::{fill_region, tensor_key};
use tenplan::executor::hf::HfModel;
use tenplan::executor::{self as exec};
use tenplan::executor::{hf_export, operations};
use tenplan::models::{resolve, ModelState, ParallelConfig, StateKind};
use tenplan::ptc::{Cluster, DType, JobState, Layout, Problem};
use tenplan::report::bytes;

use crate::{out, Exit};

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
    /// The source: a tenplan checkpoint, or a PyTorch DCP checkpoint
    /// (`.metadata` and `__<rank>_<n>.distcp`); never modified.
    #[arg(long)]
    src: PathBuf,
    /// Model of a DCP source: a name, a config.json or a Hugging Face model
    /// directory (default: a config.json beside the checkpoint).
    #[arg(long)]
    model: Option<String>,
    /// The target layout, e.g. tp=4,dp=1.
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

impl operations::Progress for Bar {
    fn start(&self, total: u64) {
        self.0.set_length(total);
    }

    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }
}

/// Write a new checkpoint with a progress bar.
fn write_with_progress<F>(
    dest: Destination,
    layout: &Layout,
    info: &CheckpointInfo,
    what: &str,
    fill: F,
) -> Result<checkpoint::Written>
where
    F: Fn(&checkpoint::StoredBox, &tenplan::ptc::Region, &mut [u8]) -> tenplan::executor::Result<()> + Sync,
{
    let total = layout.tensors().iter().map(|t| t.bytes()).sum();
    let bar = progress_bar(total, what);
    let w = checkpoint::write(dest.path(), layout, info, None, fill, &|n| bar.inc(n))?;
    bar.finish_and_clear();
    dest.commit()?;
    Ok(w)
}

/// The cluster a new checkpoint's layout lives on: `--cluster`, or enough
/// DGX-H100 nodes for the configuration's devices. The configuration is
/// checked against it, and against this machine's memory, before any
/// layout is built.
fn cluster_of_config(arg: Option<&str>, state: &ModelState, cfg: &ParallelConfig) -> Result<Cluster> {
    let cluster = match arg {
        Some(c) => Cluster::open(c)?,
        None => {
            let devices = cfg.rank_devices()?;
            let n = devices.iter().max().map_or(1, |d| d + 1);
            Cluster::parse(&format!("dgx-h100:{}", n.div_ceil(8)))?
        }
    };
    crate::check_layout(state, cfg, &cluster).context("layout")?;
    Ok(cluster)
}

fn read_job(path: Option<&Path>) -> Result<JobState> {
    match path {
        None => Ok(JobState::default()),
        Some(p) => {
            let text = crate::read_input(p)?;
            serde_json::from_str(&text).with_context(|| format!("{}: not a valid job state", p.display()))
        }
    }
}

fn state_name(kind: StateKind) -> String {
    kind.to_string()
}

fn summary(json: bool, value: serde_json::Value, text: String) {
    if json {
        out(&format!("{value}\n"));
    } else {
        out(&text);
    }
}

pub fn init(a: InitArgs) -> Result<()> {
    let kind = match (a.weights_only, &a.dtype) {
        (true, d) => StateKind::Weights(d.as_deref().unwrap_or("bf16").parse::<DType>()?),
        (false, None) => StateKind::Training,
        (false, Some(_)) => bail!("--dtype applies to --weights-only; training state is bf16 weights + fp32 optimizer"),
    };
    let spec = resolve(&a.model)?;
    let state = ModelState::new(&spec, kind);
    let cfg: ParallelConfig = a.layout.parse()?;
    let cluster = cluster_of_config(a.cluster.as_deref(), &state, &cfg)?;
    let job = read_job(a.job.as_deref())?;
    let dest = Destination::new(&a.out, a.overwrite)?;
    let layout = state.layout(&cfg).context("layout")?;
    Problem::new(layout.clone(), layout.clone(), cluster.clone()).context("the layout does not fit the cluster")?;
    let info = CheckpointInfo {
        model: Some(spec.clone()),
        config: Some(a.layout.clone()),
        state: Some(state_name(kind)),
        cluster,
        job,
        hf_config: None,
    };
    let tensors = layout.tensors().clone();
    let keys: Vec<u64> = tensors.iter().map(|t| tensor_key(a.seed, t)).collect();
    let start = Instant::now();
    let w = write_with_progress(dest, &layout, &info, "init", |b, slab, buf| {
        fill_region(keys[b.tensor as usize], &tensors[b.tensor as usize], slab, buf);
        Ok(())
    })?;
    let took = start.elapsed().as_secs_f64();
    summary(
        a.json,
        serde_json::json!({
            "out": a.out, "model": spec.name, "layout": a.layout, "state": state_name(kind),
            "files": w.manifest.files.len(), "tensors": tensors.len(),
            "data_bytes": w.data_bytes, "file_bytes": w.file_bytes, "seconds": took,
        }),
        format!(
            "wrote {}: {} files, {} tensors, {} of data in {:.2} s\n",
            a.out.display(),
            w.manifest.files.len(),
            tensors.len(),
            bytes(w.data_bytes),
            took
        ),
    );
    Ok(())
}

pub fn reshard(a: ReshardArgs) -> Result<()> {
    let mut req = operations::ReshardRequest::new(&a.src, &a.out, &a.to)?;
    req.model = a.model.clone();
    req.cluster = a.cluster.as_deref().map(Cluster::open).transpose()?;
    req.planner = a.planner.clone();
    req.overwrite = a.overwrite;
    let bar = Bar(progress_bar(0, "reshard"));
    let done = operations::reshard_checkpoint(&req, &bar);
    bar.0.finish_and_clear();
    let r = match done {
        Err(exec::Error::Rejected { verdict }) => {
            return Err(Exit::Rejected(format!("plan rejected: {verdict}")).into())
        }
        other => other?,
    };
    let check = if r.src_format == "tenplan" {
        "digests match"
    } else {
        "digests recorded"
    };
    summary(
        a.json,
        serde_json::json!({
            "src": a.src, "src_format": r.src_format, "out": a.out, "to": a.to, "planner": r.planner,
            "copies": r.copies, "bytes_read": r.resharded.bytes_read, "data_bytes": r.resharded.written.data_bytes,
            "file_bytes": r.resharded.written.file_bytes, "unused_source_tensors": r.unused,
            "plan_seconds": r.plan_s, "execute_seconds": r.execute_s, "seconds": r.seconds,
        }),
        format!(
            "resharded {} ({}) -> {} ({}): plan {} ({} copies, {:.3} s), read {}, wrote {} in {} files, {:.2} s in all; {check}\n{}",
            a.src.display(),
            r.src_format,
            a.out.display(),
            a.to,
            r.planner,
            r.copies,
            r.plan_s,
            bytes(r.resharded.bytes_read),
            bytes(r.resharded.written.file_bytes),
            r.resharded.written.manifest.files.len(),
            r.seconds,
            left_out(&r.unused, "checkpoint", &r.model.name)
        ),
    );
    Ok(())
}

/// A note naming tensors of the `source` no tensor of the model reads.
fn left_out(unused: &[String], source: &str, model: &str) -> String {
    match unused.len() {
        0 => String::new(),
        n => format!(
            "note: {n} tensor{} of the {source} not part of {model} left out: {}{}\n",
            if n == 1 { "" } else { "s" },
            unused.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
            if n > 3 { ", ..." } else { "" }
        ),
    }
}

pub fn check(dir: &Path, json: bool) -> Result<()> {
    let start = Instant::now();
    let checked = operations::check_checkpoint(dir)?;
    let took = start.elapsed().as_secs_f64();
    let (value, text) = match checked {
        operations::Checked::Dcp {
            ranks,
            files,
            tensors,
            chunks,
            others,
            bytes: read,
        } => (
            serde_json::json!({
                "dir": dir, "ok": true, "format": "PyTorch DCP", "ranks": ranks, "files": files,
                "tensors": tensors, "chunks": chunks, "other_entries": others, "bytes": read,
                "seconds": took,
            }),
            format!(
                "ok: {} (PyTorch DCP, {ranks} ranks), {files} files, {tensors} tensors in {chunks} chunks{}, {} read in {took:.2} s\n",
                dir.display(),
                match others.len() {
                    0 => String::new(),
                    n => format!(" and {n} other entries"),
                },
                bytes(read),
            ),
        ),
        operations::Checked::Tenplan {
            model,
            layout,
            files,
            tensors,
            bytes: read,
        } => (
            serde_json::json!({
                "dir": dir, "ok": true, "model": model, "layout": layout, "files": files,
                "tensors": tensors, "bytes": read, "seconds": took,
            }),
            format!(
                "ok: {} ({} {}), {files} files, {tensors} tensors, {} checked in {took:.2} s\n",
                dir.display(),
                model.as_deref().unwrap_or("?"),
                layout.as_deref().unwrap_or("?"),
                bytes(read),
            ),
        ),
        _ => unreachable!("every kind of checkpoint is reported"),
    };
    summary(json, value, text);
    Ok(())
}

pub fn import(a: ImportArgs) -> Result<()> {
    let start = Instant::now();
    let hf = HfModel::open(&a.hf)?;
    let spec = operations::hf_model_spec(&a.hf, a.model.as_deref())?;
    let dtype = match &a.dtype {
        Some(d) => d.parse::<DType>()?,
        None => hf
            .dtype()
            .with_context(|| format!("{}: the model files hold no tensor", a.hf.display()))?,
    };
    let kind = StateKind::Weights(dtype);
    let state = ModelState::new(&spec, kind);
    let cfg: ParallelConfig = a.layout.parse()?;
    let cluster = cluster_of_config(a.cluster.as_deref(), &state, &cfg)?;
    let dest = Destination::new(&a.out, a.overwrite)?;
    let layout = state.layout(&cfg).context("layout")?;
    Problem::new(layout.clone(), layout.clone(), cluster.clone()).context("the layout does not fit the cluster")?;
    let tensors = layout.tensors().clone();
    let sources = hf.sources(&spec, &tensors)?;
    let unused = sources.unused().to_vec();
    let info = CheckpointInfo {
        model: Some(spec.clone()),
        config: Some(a.layout.clone()),
        state: Some(state_name(kind)),
        cluster,
        job: JobState::default(),
        hf_config: operations::original_config(&a.hf, &spec),
    };
    let w = write_with_progress(dest, &layout, &info, "import", |b, slab, buf| {
        sources.fill(b.tensor, &tensors[b.tensor as usize], slab, buf);
        Ok(())
    })?;
    let took = start.elapsed().as_secs_f64();
    let note = left_out(&unused, "files", &spec.name);
    summary(
        a.json,
        serde_json::json!({
            "hf": a.hf, "out": a.out, "model": spec.name, "layout": a.layout, "dtype": dtype.to_string(),
            "files": w.manifest.files.len(), "tensors": tensors.len(), "hf_tensors": hf.len(),
            "unused_hf_tensors": unused, "data_bytes": w.data_bytes, "seconds": took,
        }),
        format!(
            "imported {} ({} tensors) as {} {}: {} files, {} in {:.2} s\n{note}",
            a.hf.display(),
            hf.len(),
            spec.name,
            a.layout,
            w.manifest.files.len(),
            bytes(w.data_bytes),
            took
        ),
    );
    Ok(())
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
    #[arg(long)]
    hf: PathBuf,
    /// Largest shard: bytes, or with a unit (500MB, 2GiB), as transformers' max_shard_size [default: 5GB].
    #[arg(long)]
    max_shard_size: Option<String>,
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
    let start = Instant::now();
    let max = match &a.max_shard_size {
        Some(s) => parse_size(s)?,
        None => hf_export::DEFAULT_MAX_SHARD_BYTES,
    };
    let bar = Bar(progress_bar(0, "export"));
    let (model, e) = operations::export_checkpoint(&a.ckpt, a.model.as_deref(), &a.hf, max, &bar)?;
    bar.0.finish_and_clear();
    let took = start.elapsed().as_secs_f64();
    summary(
        a.json,
        serde_json::json!({
            "ckpt": a.ckpt, "hf": a.hf, "model": model.name, "files": e.files, "tensors": e.tensors,
            "data_bytes": e.data_bytes, "file_bytes": e.file_bytes, "original_config": e.original_config,
            "seconds": took,
        }),
        format!(
            "exported {} ({}) to {}: {} tensors, {} in {} file{}, config.json {}; {:.2} s\n",
            a.ckpt.display(),
            model.name,
            a.hf.display(),
            e.tensors,
            bytes(e.data_bytes),
            e.files.len(),
            if e.files.len() == 1 { "" } else { "s" },
            if e.original_config {
                "as imported"
            } else {
                "generated from the model"
            },
            took
        ),
    );
    Ok(())
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
    let start = Instant::now();
    let r = operations::diff_checkpoints(&a.a, &a.b, a.model.as_deref(), a.weights_only)?;
    let (ka, kb) = (r.a_kind, r.b_kind);
    let (first, where_a, where_b, bytes_read) = (
        &r.first_difference,
        &r.first_difference_in_a,
        &r.first_difference_in_b,
        r.bytes,
    );
    let d = &r;
    let took = start.elapsed().as_secs_f64();
    if a.json {
        out(&format!(
            "{}\n",
            serde_json::json!({
                "a": a.a, "b": a.b, "a_kind": ka, "b_kind": kb, "identical": d.identical, "same": d.same,
                "different": d.different, "first_difference": first, "first_difference_in_a": where_a,
                "first_difference_in_b": where_b, "only_a": d.only_a, "only_b": d.only_b,
                "bytes": bytes_read, "seconds": took,
            })
        ));
    } else {
        let mut text = String::new();
        for x in d.different.iter().take(20) {
            text.push_str(&format!("differs: {}: {}\n", x.name, x.what));
        }
        if d.different.len() > 20 {
            text.push_str(&format!("... and {} more (--json lists all)\n", d.different.len() - 20));
        }
        if let Some(f) = first {
            text.push_str(&format!(
                "first difference: {} at element {:?}: {} vs {} (bytes, little-endian){}\n",
                f.tensor,
                f.index,
                f.a,
                f.b,
                match (where_a, where_b) {
                    (Some(x), Some(y)) => format!("; {x} of {} vs {y} of {}", a.a.display(), a.b.display()),
                    _ => String::new(),
                }
            ));
        }
        for (side, list) in [(&a.a, &d.only_a), (&a.b, &d.only_b)] {
            if !list.is_empty() {
                text.push_str(&format!(
                    "only in {}: {} tensor{} ({}{})\n",
                    side.display(),
                    list.len(),
                    if list.len() == 1 { "" } else { "s" },
                    list.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
                    if list.len() > 3 { ", ..." } else { "" }
                ));
            }
        }
        text.push_str(&format!(
            "{}: {} ({ka}) and {} ({kb}): {} tensors equal, {} differ, {} + {} on one side only; {} digested in {:.2} s\n",
            if d.identical { "identical" } else { "different" },
            a.a.display(),
            a.b.display(),
            d.same,
            d.different.len(),
            d.only_a.len(),
            d.only_b.len(),
            bytes(bytes_read),
            took
        ));
        out(&text);
    }
    if !d.identical {
        let at = first
            .as_ref()
            .map(|f| format!(", first at {} {:?}", f.tensor, f.index))
            .unwrap_or_default();
        return Err(Exit::Differ(format!(
            "{} and {} differ: {} tensors differ{at}, {} + {} on one side only",
            a.a.display(),
            a.b.display(),
            d.different.len(),
            d.only_a.len(),
            d.only_b.len()
        ))
        .into());
    }
    Ok(())
}
