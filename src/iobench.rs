//! `tenplan bench-executor`: executor throughput against its physical peers,
//! measured in the same run (plain memcpy, the disk's own write speed), and
//! checkpoint resharding against PyTorch DCP's reshard-on-load.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use rayon::prelude::*;
use serde::Serialize;
use tenplan::executor::checkpoint::{self, Checkpoint, CheckpointInfo};
use tenplan::executor::generate::{fill_region, tensor_key};
use tenplan::executor::{self as exec};
use tenplan::models::{find, ModelState, StateKind};
use tenplan::planner::planner;
use tenplan::ptc::{Cluster, DType, JobState, Problem};
use tenplan::report::bytes;

use crate::out;

/// PyTorch DCP's reshard-on-load of GPT-3 350M fp32 weights on this kind of
/// machine (the executor issue's reference): median seconds.
const DCP_WARM_S: f64 = 1.49;
const DCP_COLD_S: f64 = 2.39;

#[derive(Args)]
pub struct BenchExecutorArgs {
    /// Model of the weights-only state.
    #[arg(long, default_value = "gpt3-350m")]
    model: String,
    /// Element type.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Source layout.
    #[arg(long, default_value = "tp=2,dp=2")]
    from: String,
    /// Target layouts.
    #[arg(long, default_values_t = ["tp=4,dp=1".to_string(), "tp=2,dp=1".to_string()])]
    to: Vec<String>,
    /// Repetitions of each measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Scratch directory for the checkpoints (default: the system's temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Write the results here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Serialize)]
struct Row {
    model: String,
    from: String,
    to: String,
    /// Bytes the target devices hold, replicas included, padding excluded.
    bytes_needed: u64,
    /// Bytes the load read from the source files.
    bytes_read: u64,
    /// Open + plan + check + load into memory, page cache warm.
    warm_load_s: f64,
    /// The same with the source files evicted from the page cache first.
    cold_load_s: f64,
    warm_speedup_vs_dcp: f64,
    cold_speedup_vs_dcp: f64,
    /// Host executor on in-memory source buffers (target buffers allocated).
    host_execute_s: f64,
    /// Parallel memcpy of the same byte count into a fresh buffer allocated
    /// as the executor allocates its target buffers.
    memcpy_s: f64,
    /// memcpy_s / host_execute_s: the executor's throughput relative to memcpy.
    host_vs_memcpy: f64,
    /// `tenplan reshard` to files: plan, copy, write, fsync, digests, manifest.
    reshard_to_files_s: f64,
    /// Writing and fsyncing the same bytes to one file: the disk's limit.
    disk_write_s: f64,
    /// disk_write_s / reshard_to_files_s.
    reshard_vs_disk: f64,
    /// The plan's box copies on the GPU (CUDA builds with a GPU only).
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_copy_s: Option<f64>,
    /// One device-to-device copy of the same bytes on the same GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_dtod_s: Option<f64>,
    /// gpu_dtod_s / gpu_copy_s.
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_vs_dtod: Option<f64>,
}

#[derive(Serialize)]
struct Report {
    machine: String,
    threads: usize,
    reps: usize,
    dcp_reference_s: (f64, f64),
    rows: Vec<Row>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time<T>(f: impl FnOnce() -> Result<T>) -> Result<(f64, T)> {
    let t = Instant::now();
    let r = f()?;
    Ok((t.elapsed().as_secs_f64(), r))
}

/// Evict a checkpoint's files from the page cache (clean pages only: they
/// were synced when written).
fn evict(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let f = File::open(entry?.path())?;
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)?;
    }
    Ok(())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown cpu".into());
    format!("{cpu}, {} threads", rayon::current_num_threads())
}

/// Open, plan, check and load a reshard: what a job restarting at the new
/// layout does. Returns the bytes read.
fn load_once(src: &Path, problem_of: &dyn Fn(&Checkpoint) -> Result<Problem>) -> Result<u64> {
    let ckpt = Checkpoint::open(src)?;
    let problem = problem_of(&ckpt)?;
    let plan = planner("lp")?.plan(&problem)?;
    let verified = tenplan::proofs::verify(&plan).map_err(|v| anyhow::anyhow!("plan rejected: {v}"))?;
    let (memory, read) = exec::load(&verified, &ckpt)?;
    drop(memory);
    Ok(read)
}

fn gpu_absent() -> String {
    match exec::CudaExecutor::new() {
        Ok(_) => "available".into(),
        Err(e) => e.to_string(),
    }
}

/// How this build performs box copies on the GPU.
fn gpu_copy_path() -> &'static str {
    match exec::CudaExecutor::new() {
        Ok(g) if g.uses_kernel() => "box-copy kernel",
        _ => "2-D driver copies",
    }
}

/// Median GPU time of the plan's copies and of one device-to-device copy of
/// as many bytes, when this build and machine have a GPU.
fn gpu_times(
    verified: &tenplan::proofs::Verified<'_>,
    source: &exec::HostMemory,
    moved: usize,
    reps: usize,
) -> Result<Option<(f64, f64)>> {
    if exec::cuda_device_count() == 0 {
        return Ok(None);
    }
    let gpu = exec::CudaExecutor::new()?;
    let mut copy = Vec::new();
    for _ in 0..reps {
        copy.push(gpu.execute(verified, source)?.copy_time.as_secs_f64());
    }
    let bw = gpu.dtod_bandwidth(moved, reps)?;
    Ok(Some((median(copy), moved as f64 / bw)))
}

/// Most repetitions of a measurement.
const MAX_REPS: usize = 100;

pub fn bench_executor(a: BenchExecutorArgs) -> Result<()> {
    if !(1..=MAX_REPS).contains(&a.reps) {
        anyhow::bail!("--reps {}: expected 1 to {MAX_REPS}", a.reps);
    }
    let spec = find(&a.model)?;
    let kind = StateKind::Weights(a.dtype.parse::<DType>()?);
    let state = ModelState::new(spec, kind);
    let cluster = Cluster::parse("dgx-h100:1")?;
    let from_cfg = a.from.parse()?;
    crate::check_layout(&state, &from_cfg, &cluster).context("source layout")?;
    for to in &a.to {
        crate::check_layout(&state, &to.parse()?, &cluster).context("target layout")?;
    }
    let from = state.layout(&from_cfg).context("source layout")?;
    let root = a
        .dir
        .clone()
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("tenplan-bench-{}", std::process::id()));
    // The source and one target checkpoint on disk, source and target in memory.
    let state_bytes: u64 = from.tensors().iter().map(|t| t.bytes()).sum();
    let parent = root.parent().unwrap_or(&root);
    if let Ok(fs) = rustix::fs::statvfs(parent) {
        let free = fs.f_bavail.saturating_mul(fs.f_frsize);
        if 2 * state_bytes > free {
            anyhow::bail!(
                "{} needs {} of scratch space for two checkpoints, {} has {} free",
                spec.name,
                bytes(2 * state_bytes),
                parent.display(),
                bytes(free)
            );
        }
    }
    if let Some(have) = tenplan::ptc::limits::available_memory() {
        if 2 * state_bytes > have {
            anyhow::bail!(
                "{} holds {} of state: the benchmark keeps a source and a target in memory ({}), this machine has {} available",
                spec.name,
                bytes(state_bytes),
                bytes(2 * state_bytes),
                bytes(have)
            );
        }
    }
    std::fs::create_dir_all(&root)?;
    let src = root.join("src");
    let tensors = from.tensors().clone();
    let keys: Vec<u64> = tensors.iter().map(|t| tensor_key(0, t)).collect();
    let info = CheckpointInfo {
        model: Some(spec.clone()),
        config: Some(a.from.clone()),
        state: Some(format!("weights:{}", a.dtype)),
        cluster: cluster.clone(),
        job: JobState::default(),
        hf_config: None,
    };
    checkpoint::write(
        &src,
        &from,
        &info,
        None,
        |b, slab, buf| {
            fill_region(keys[b.tensor as usize], &tensors[b.tensor as usize], slab, buf);
            Ok(())
        },
        &|_| {},
    )?;
    let mut rows = Vec::new();
    for to in &a.to {
        let target = state.layout(&to.parse()?).context("target layout")?;
        // Every target device needs its pieces (replicas included, padding not).
        let target_bytes: u64 = target
            .shards()
            .iter()
            .flat_map(|s| s.buffers.iter().map(move |b| (s.devices.len() as u64, b)))
            .map(|(n, b)| n * b.pieces.iter().map(|p| p.region.volume()).sum::<u64>() * b.dtype.size())
            .sum();
        let problem_of = |c: &Checkpoint| -> Result<Problem> {
            Ok(Problem::new(c.layout().clone(), target.clone(), cluster.clone())?)
        };
        // Warm: one untimed pass fills the page cache.
        let bytes_read = load_once(&src, &problem_of)?;
        let mut warm = Vec::new();
        for _ in 0..a.reps {
            warm.push(time(|| load_once(&src, &problem_of))?.0);
        }
        let mut cold = Vec::new();
        for _ in 0..a.reps {
            evict(&src)?;
            cold.push(time(|| load_once(&src, &problem_of))?.0);
        }
        // Host executor against memcpy of the same bytes.
        let ckpt = Checkpoint::open(&src)?;
        let identity = Problem::new(from.clone(), from.clone(), cluster.clone())?;
        let id_plan = planner("lp")?.plan(&identity)?;
        let id_verified = tenplan::proofs::verify(&id_plan).map_err(|v| anyhow::anyhow!("{v}"))?;
        let (source, _) = exec::load(&id_verified, &ckpt)?;
        let problem = problem_of(&ckpt)?;
        let plan = planner("lp")?.plan(&problem)?;
        let verified = tenplan::proofs::verify(&plan).map_err(|v| anyhow::anyhow!("{v}"))?;
        let moved = plan.bytes() as usize;
        let from_buf = vec![1u8; moved];
        let mut host = Vec::new();
        let mut memcpy = Vec::new();
        for _ in 0..a.reps {
            host.push(time(|| Ok(exec::execute(&verified, &source)?))?.0);
            memcpy.push(
                time(|| {
                    let mut dst = exec::HostBuffer::zeroed(moved);
                    let chunk = moved.div_ceil(rayon::current_num_threads().max(1) * 4).max(1);
                    dst.par_chunks_mut(chunk)
                        .zip(from_buf.par_chunks(chunk))
                        .for_each(|(d, s)| d.copy_from_slice(s));
                    Ok(dst)
                })?
                .0,
            );
        }
        // Reshard to files against the disk's own write speed.
        let mut files = Vec::new();
        let mut disk = Vec::new();
        let info_to = CheckpointInfo {
            config: Some(to.clone()),
            ..info.clone()
        };
        let blob = vec![7u8; tensors.iter().map(|t| t.bytes()).sum::<u64>() as usize];
        for i in 0..a.reps.min(3) {
            let out_dir = root.join(format!("out-{i}"));
            files.push(time(|| Ok(exec::reshard(&verified, &ckpt, &out_dir, &info_to, &|_| {})?))?.0);
            std::fs::remove_dir_all(&out_dir)?;
            let path = root.join("blob");
            disk.push(
                time(|| {
                    let mut f = File::create(&path)?;
                    f.write_all(&blob)?;
                    f.sync_all()?;
                    Ok(())
                })?
                .0,
            );
            std::fs::remove_file(&path)?;
        }
        let gpu = gpu_times(&verified, &source, moved, a.reps)?;
        let (warm, cold, host, memcpy, files, disk) = (
            median(warm),
            median(cold),
            median(host),
            median(memcpy),
            median(files),
            median(disk),
        );
        rows.push(Row {
            model: spec.name.to_string(),
            from: a.from.clone(),
            to: to.clone(),
            bytes_needed: target_bytes,
            bytes_read,
            warm_load_s: warm,
            cold_load_s: cold,
            warm_speedup_vs_dcp: DCP_WARM_S / warm,
            cold_speedup_vs_dcp: DCP_COLD_S / cold,
            host_execute_s: host,
            memcpy_s: memcpy,
            host_vs_memcpy: memcpy / host,
            reshard_to_files_s: files,
            disk_write_s: disk,
            reshard_vs_disk: disk / files,
            gpu_copy_s: gpu.map(|g| g.0),
            gpu_dtod_s: gpu.map(|g| g.1),
            gpu_vs_dtod: gpu.map(|g| g.1 / g.0),
        });
    }
    std::fs::remove_dir_all(&root)?;
    let report = Report {
        machine: machine(),
        threads: rayon::current_num_threads(),
        reps: a.reps,
        dcp_reference_s: (DCP_WARM_S, DCP_COLD_S),
        rows,
    };
    let mut t = format!(
        "machine: {}; median of {} runs; DCP reshard-on-load reference {DCP_WARM_S} s warm, {DCP_COLD_S} s cold\n\n",
        report.machine, report.reps
    );
    t += "| model | from | to | needed | read | warm load | vs DCP | cold load | vs DCP | host exec | memcpy | exec/memcpy | reshard to files | disk write | reshard/disk |\n";
    t += "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for r in &report.rows {
        t += &format!(
            "| {} | {} | {} | {} | {} | {:.3} s | {:.1}× | {:.3} s | {:.1}× | {:.3} s | {:.3} s | {:.2} | {:.2} s | {:.2} s | {:.2} |\n",
            r.model,
            r.from,
            r.to,
            bytes(r.bytes_needed),
            bytes(r.bytes_read),
            r.warm_load_s,
            r.warm_speedup_vs_dcp,
            r.cold_load_s,
            r.cold_speedup_vs_dcp,
            r.host_execute_s,
            r.memcpy_s,
            r.host_vs_memcpy,
            r.reshard_to_files_s,
            r.disk_write_s,
            r.reshard_vs_disk
        );
    }
    let path = gpu_copy_path();
    for r in &report.rows {
        match (r.gpu_copy_s, r.gpu_dtod_s) {
            (Some(c), Some(d)) => {
                t += &format!(
                    "\nGPU ({} → {}): box copies {c:.4} s ({}), one device-to-device copy {d:.4} s, ratio {:.2}\n",
                    r.from,
                    r.to,
                    path,
                    d / c
                );
            }
            _ => t += &format!("\nGPU ({} → {}): not measured ({})\n", r.from, r.to, gpu_absent()),
        }
    }
    out(&t);
    if let Some(path) = &a.json {
        crate::write_atomic(path, serde_json::to_string_pretty(&report)?.as_bytes())?;
    }
    Ok(())
}
