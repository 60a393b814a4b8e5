//! `tenplan-bench executor`: executor throughput against its physical peers,
//! measured in the same run (a plain parallel read of the same files, plain
//! memcpy, the disk's own write speed), and checkpoint loading against
//! PyTorch DCP loading the same checkpoint, also in the same run
//! (`benches/dcp_load.py`, both DCP formats) when a Python with torch is at
//! hand; "not measured" otherwise.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use rayon::prelude::*;
use serde::Serialize;
use tenplan::application::units::bytes;
use tenplan::executor::generate::{fill_region, tensor_key};
use tenplan::executor::{self as exec};
use tenplan::formats::checkpoint::{self, Checkpoint, CheckpointInfo};
use tenplan::models::{find, ModelState, StateKind};
use tenplan::planner::planner;
use tenplan::ptc::{Cluster, DType, JobState, Problem};

use crate::out;

/// The DCP side of the comparison, run by the Python given with `--python`.
const DCP_LOAD_PY: &str = include_str!("../dcp_load.py");

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
    /// A Python with torch, to measure DCP loading the same checkpoint
    /// (default: $TENPLAN_VENV/bin/python, else ~/.cache/tenplan/venv/bin/python).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Do not measure DCP.
    #[arg(long)]
    no_dcp: bool,
}

/// DCP loading the source checkpoint in one format: median seconds.
#[derive(Serialize, serde::Deserialize, Clone, Copy)]
struct DcpTimes {
    warm_s: f64,
    cold_s: f64,
}

/// What `benches/dcp_load.py` reports.
#[derive(Serialize, serde::Deserialize)]
struct DcpLoad {
    /// The tenplan files themselves through DCP's HuggingFaceStorageReader.
    hf: DcpTimes,
    /// DCP's own `.distcp` format (written once from the same state).
    distcp: DcpTimes,
    ranks: usize,
    placement: String,
    torch: String,
    bytes: u64,
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
    /// Reading every byte of the source files into one fresh buffer with
    /// as many threads as the load uses, page cache warm: the load's floor.
    plain_read_warm_s: f64,
    /// The same with the files evicted first.
    plain_read_cold_s: f64,
    /// DCP's load time over tenplan's, per DCP format (absent when DCP was
    /// not measured).
    #[serde(skip_serializing_if = "Option::is_none")]
    warm_speedup_vs_dcp_hf: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cold_speedup_vs_dcp_hf: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    warm_speedup_vs_dcp_distcp: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cold_speedup_vs_dcp_distcp: Option<f64>,
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
    /// The same copies as one driver copy per slab (no kernel).
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_driver_copy_s: Option<f64>,
    /// Host time preparing the kernel's items (not in gpu_copy_s).
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_prepare_s: Option<f64>,
    /// One device-to-device copy of the same bytes on the same GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_dtod_s: Option<f64>,
    /// gpu_dtod_s / gpu_copy_s.
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_vs_dtod: Option<f64>,
}

/// Reduce-copies: the same state held as addends by every data-parallel
/// replica of the source (gradients before their all-reduce), summed into
/// the target layout.
#[derive(Serialize)]
struct ReduceRow {
    model: String,
    from: String,
    to: String,
    /// Most addends of one element.
    addends: usize,
    /// Bytes the reduce-copies move (each addend once).
    bytes_moved: u64,
    /// Host executor, adding.
    host_execute_s: f64,
    /// Parallel memcpy of as many bytes.
    memcpy_s: f64,
    /// memcpy_s / host_execute_s.
    host_vs_memcpy: f64,
    /// The reduce-copies on the GPU (box_reduce kernel; CUDA builds with a
    /// GPU only).
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_reduce_s: Option<f64>,
    /// Host time preparing the kernels' items (not in gpu_reduce_s).
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_prepare_s: Option<f64>,
    /// One device-to-device copy of bytes_moved on the same GPU. A reduce
    /// reads two bytes for every one it writes, a copy one: 1.5 times the
    /// memory traffic.
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_dtod_s: Option<f64>,
    /// gpu_dtod_s / gpu_reduce_s.
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_vs_dtod: Option<f64>,
}

#[derive(Serialize)]
struct Report {
    machine: String,
    threads: usize,
    reps: usize,
    /// DCP loading the source checkpoint, measured in this run.
    dcp: Option<DcpLoad>,
    /// Why DCP was not measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    dcp_not_measured: Option<String>,
    rows: Vec<Row>,
    reduce: Vec<ReduceRow>,
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

/// What the GPU measured for one plan (medians, seconds).
#[derive(Clone, Copy)]
struct GpuTimes {
    /// Box copies with the box-copy kernel.
    kernel: f64,
    /// Box copies as one driver copy per slab (absent for reduce-copies,
    /// which need the kernel).
    driver: Option<f64>,
    /// One device-to-device copy of as many bytes.
    dtod: f64,
    /// Host time turning the plan into kernel items (kernel path).
    prepare: f64,
}

/// Median GPU time of the plan's copies (by both copy paths, each run's
/// bytes checked against the host executor's; the kernels alone for a plan
/// with reduce-copies) and of one device-to-device copy of as many bytes,
/// when this build and machine have a GPU.
fn gpu_times(
    verified: &tenplan::proofs::Verified<'_>,
    source: &exec::HostMemory,
    moved: usize,
    reps: usize,
) -> Result<Option<GpuTimes>> {
    if exec::cuda_device_count() == 0 {
        return Ok(None);
    }
    let want = exec::execute(verified, source)?;
    let kernel = exec::CudaExecutor::new()?;
    // Driver copies cannot add: reduce-copies are timed on the kernels alone.
    let driver = if verified.plan().copies.iter().any(|c| c.reduce) {
        None
    } else {
        Some(exec::CudaExecutor::new()?.with_driver_copies())
    };
    // Copy and preparation times per path: the kernel's, the driver's.
    let mut times = [(Vec::new(), Vec::new()), (Vec::new(), Vec::new())];
    for _ in 0..reps {
        for (gpu, (copy, prepare)) in std::iter::once(&kernel).chain(driver.as_ref()).zip(&mut times) {
            let run = gpu.execute(verified, source)?;
            anyhow::ensure!(
                run.target == want,
                "the GPU's target bytes differ from the host executor's"
            );
            copy.push(run.copy_time.as_secs_f64());
            prepare.push(run.prepare_time.as_secs_f64());
        }
    }
    let bw = kernel.dtod_bandwidth(moved, reps)?;
    let [(k, prepare), (d, _)] = times;
    Ok(Some(GpuTimes {
        kernel: median(k),
        driver: (!d.is_empty()).then(|| median(d)),
        dtod: moved as f64 / bw,
        prepare: median(prepare),
    }))
}

/// A parallel memcpy of `from` into a fresh buffer allocated as the executor
/// allocates its target buffers: seconds.
fn memcpy_time(from: &[u8]) -> Result<f64> {
    let moved = from.len();
    Ok(time(|| {
        let mut dst = exec::HostBuffer::zeroed(moved);
        let chunk = moved.div_ceil(rayon::current_num_threads().max(1) * 4).max(1);
        dst.par_chunks_mut(chunk)
            .zip(from.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
        Ok(dst)
    })?
    .0)
}

/// Read every byte of a checkpoint's files into one fresh buffer (allocated
/// as the executor allocates its buffers), each file cut into chunks read in
/// parallel: what loading those bytes costs with no layout at all.
fn plain_read(dir: &Path) -> Result<u64> {
    use std::os::unix::fs::FileExt;
    let files: Vec<(File, u64)> = std::fs::read_dir(dir)?
        .map(|e| -> Result<(File, u64)> {
            let f = File::open(e?.path())?;
            let len = f.metadata()?.len();
            Ok((f, len))
        })
        .collect::<Result<_>>()?;
    let total: u64 = files.iter().map(|f| f.1).sum();
    let mut dst = exec::HostBuffer::zeroed(total as usize);
    let chunk = 8 << 20;
    let mut jobs = Vec::new();
    let mut rest: &mut [u8] = &mut dst;
    for (f, len) in &files {
        let (mine, tail) = rest.split_at_mut(*len as usize);
        rest = tail;
        for (i, c) in mine.chunks_mut(chunk).enumerate() {
            jobs.push((f, (i * chunk) as u64, c));
        }
    }
    jobs.into_par_iter().try_for_each(|(f, at, c)| f.read_exact_at(c, at))?;
    Ok(total)
}

/// The Python that measures DCP: the one asked for, else the project's
/// torch environment.
fn dcp_python(asked: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = asked {
        return Some(p.to_path_buf());
    }
    let venv = std::env::var_os("TENPLAN_VENV")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tenplan/venv")))?;
    Some(venv.join("bin/python")).filter(|p| p.exists())
}

/// DCP loading the checkpoint at `src` (both formats) in a child Python, or
/// why it could not be measured.
fn measure_dcp(python: &Path, src: &Path, root: &Path, reps: usize) -> std::result::Result<DcpLoad, String> {
    let script = root.join("dcp_load.py");
    let json = root.join("dcp_load.json");
    std::fs::write(&script, DCP_LOAD_PY).map_err(|e| format!("writing {}: {e}", script.display()))?;
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg(src)
        .arg("--scratch")
        .arg(root)
        .args(["--reps", &reps.to_string(), "--json"])
        .arg(&json)
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output");
        return Err(format!("{} {}: {last}", python.display(), out.status));
    }
    let text = std::fs::read_to_string(&json).map_err(|e| format!("{}: {e}", json.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", json.display()))
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
    state.check_plannable(&from_cfg, &cluster).context("source layout")?;
    for to in &a.to {
        state.check_plannable(&to.parse()?, &cluster).context("target layout")?;
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
        scalars: Vec::new(),
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
    // The load's peers, measured once on the source: a plain parallel read of
    // its files, and DCP loading it.
    plain_read(&src)?;
    let mut read_warm = Vec::new();
    let mut read_cold = Vec::new();
    for _ in 0..a.reps {
        read_warm.push(time(|| plain_read(&src))?.0);
        evict(&src)?;
        read_cold.push(time(|| plain_read(&src))?.0);
    }
    let (plain_read_warm_s, plain_read_cold_s) = (median(read_warm), median(read_cold));
    let dcp = if a.no_dcp {
        Err("--no-dcp".to_string())
    } else {
        match dcp_python(a.python.as_deref()) {
            #[allow(clippy::print_stderr)]
            Some(py) => {
                eprintln!("measuring PyTorch DCP loading the source checkpoint ({})", py.display());
                measure_dcp(&py, &src, &root, a.reps)
            }
            None => Err("no Python with torch: give --python or set TENPLAN_VENV".to_string()),
        }
    };
    let dcp_times = dcp.as_ref().ok().map(|d| (d.hf, d.distcp));
    let mut rows = Vec::new();
    let mut reduce = Vec::new();
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
            memcpy.push(memcpy_time(&from_buf)?);
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
            plain_read_warm_s,
            plain_read_cold_s,
            warm_speedup_vs_dcp_hf: dcp_times.map(|d| d.0.warm_s / warm),
            cold_speedup_vs_dcp_hf: dcp_times.map(|d| d.0.cold_s / cold),
            warm_speedup_vs_dcp_distcp: dcp_times.map(|d| d.1.warm_s / warm),
            cold_speedup_vs_dcp_distcp: dcp_times.map(|d| d.1.cold_s / cold),
            host_execute_s: host,
            memcpy_s: memcpy,
            host_vs_memcpy: memcpy / host,
            reshard_to_files_s: files,
            disk_write_s: disk,
            reshard_vs_disk: disk / files,
            gpu_copy_s: gpu.map(|g| g.kernel),
            gpu_driver_copy_s: gpu.and_then(|g| g.driver),
            gpu_prepare_s: gpu.map(|g| g.prepare),
            gpu_dtod_s: gpu.map(|g| g.dtod),
            gpu_vs_dtod: gpu.map(|g| g.dtod / g.kernel),
        });
        reduce.push(reduce_row(
            &from,
            &target,
            &cluster,
            source,
            a.reps,
            [&spec.name, &a.from, to],
        )?);
    }
    std::fs::remove_dir_all(&root)?;
    let (dcp, dcp_not_measured) = match dcp {
        Ok(d) => (Some(d), None),
        Err(why) => (None, Some(why)),
    };
    let report = Report {
        machine: machine(),
        threads: rayon::current_num_threads(),
        reps: a.reps,
        dcp,
        dcp_not_measured,
        rows,
        reduce,
    };
    out(&table(&report));
    if let Some(path) = &a.json {
        crate::write_atomic(path, serde_json::to_string_pretty(&report)?.as_bytes())?;
    }
    Ok(())
}

/// Reduce-copies from `from` held as partial sums (every replica's copy of
/// `source` one addend) into `target`: host and GPU against their copies.
fn reduce_row(
    from: &tenplan::ptc::Layout,
    target: &tenplan::ptc::Layout,
    cluster: &Cluster,
    source: exec::HostMemory,
    reps: usize,
    [model, from_cfg, to]: [&str; 3],
) -> Result<ReduceRow> {
    let partial = from.with_partial(|_| true)?;
    let addends = partial.shards().iter().map(|s| s.devices.len()).max().unwrap_or(1);
    let problem = Problem::new(partial.clone(), target.clone(), cluster.clone())?;
    let plan = planner("lp")?.plan(&problem)?;
    let verified = tenplan::proofs::verify(&plan).map_err(|v| anyhow::anyhow!("{v}"))?;
    let source = exec::HostMemory::from_buffers(&partial, source.into_buffers())?;
    let moved = plan.bytes() as usize;
    let from_buf = vec![1u8; moved];
    let (mut host, mut memcpy) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        host.push(time(|| Ok(exec::execute(&verified, &source)?))?.0);
        memcpy.push(memcpy_time(&from_buf)?);
    }
    let gpu = gpu_times(&verified, &source, moved, reps)?;
    let (host, memcpy) = (median(host), median(memcpy));
    Ok(ReduceRow {
        model: model.to_string(),
        from: from_cfg.to_string(),
        to: to.to_string(),
        addends,
        bytes_moved: moved as u64,
        host_execute_s: host,
        memcpy_s: memcpy,
        host_vs_memcpy: memcpy / host,
        gpu_reduce_s: gpu.map(|g| g.kernel),
        gpu_prepare_s: gpu.map(|g| g.prepare),
        gpu_dtod_s: gpu.map(|g| g.dtod),
        gpu_vs_dtod: gpu.map(|g| g.dtod / g.kernel),
    })
}

/// Two tables: loading (against a plain read and DCP) and executing
/// (against memcpy and the disk), then the GPU lines.
fn table(report: &Report) -> String {
    let ratio = |x: Option<f64>| x.map_or("–".to_string(), |x| format!("{x:.2}×"));
    let mut t = format!("machine: {}; median of {} runs\n\n", report.machine, report.reps);
    match (&report.dcp, &report.dcp_not_measured) {
        (Some(d), _) => {
            t += &format!(
                "PyTorch DCP {} on {} gloo ranks ({}), loading the same source checkpoint ({}): \
                 Hugging Face reader {:.3} s warm, {:.3} s cold; its own .distcp format {:.3} s warm, {:.3} s cold\n\n",
                d.torch,
                d.ranks,
                d.placement,
                bytes(d.bytes),
                d.hf.warm_s,
                d.hf.cold_s,
                d.distcp.warm_s,
                d.distcp.cold_s
            );
        }
        (None, why) => {
            t += &format!(
                "PyTorch DCP: not measured ({})\n\n",
                why.as_deref().unwrap_or("unknown")
            )
        }
    }
    t += "Loading the source checkpoint into the target layout (open, plan, check, read):\n\n";
    t += "| model | from | to | needed | read | warm load | plain read | load/read | vs DCP hf | vs DCP distcp | cold load | plain read | vs DCP hf | vs DCP distcp |\n";
    t += "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for r in &report.rows {
        t += &format!(
            "| {} | {} | {} | {} | {} | {:.3} s | {:.3} s | {:.2} | {} | {} | {:.3} s | {:.3} s | {} | {} |\n",
            r.model,
            r.from,
            r.to,
            bytes(r.bytes_needed),
            bytes(r.bytes_read),
            r.warm_load_s,
            r.plain_read_warm_s,
            r.warm_load_s / r.plain_read_warm_s,
            ratio(r.warm_speedup_vs_dcp_hf),
            ratio(r.warm_speedup_vs_dcp_distcp),
            r.cold_load_s,
            r.plain_read_cold_s,
            ratio(r.cold_speedup_vs_dcp_hf),
            ratio(r.cold_speedup_vs_dcp_distcp),
        );
    }
    t += "\nExecuting in memory and resharding to files:\n\n";
    t += "| model | from | to | host exec | memcpy | exec/memcpy | reshard to files | disk write | reshard/disk |\n";
    t += "|---|---|---|---:|---:|---:|---:|---:|---:|\n";
    for r in &report.rows {
        t += &format!(
            "| {} | {} | {} | {:.3} s | {:.3} s | {:.2} | {:.2} s | {:.2} s | {:.2} |\n",
            r.model,
            r.from,
            r.to,
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
        match (r.gpu_copy_s, r.gpu_driver_copy_s, r.gpu_dtod_s) {
            (Some(c), Some(dc), Some(d)) => {
                t += &format!(
                    "\nGPU ({} → {}): box copies {c:.4} s ({}), {dc:.4} s as driver copies, one device-to-device copy {d:.4} s, ratio {:.2}\n",
                    r.from,
                    r.to,
                    path,
                    d / c
                );
            }
            _ => t += &format!("\nGPU ({} → {}): not measured ({})\n", r.from, r.to, gpu_absent()),
        }
    }
    t +=
        "\nReduce-copies: every replica's copy one addend (gradients before their all-reduce), summed into the target \
          layout; a reduce reads two bytes for each it writes, 1.5 times a copy's memory traffic:\n\n";
    t += "| model | from | to | addends | moved | host exec | memcpy | exec/memcpy | GPU box_reduce | one dtod copy | dtod/reduce |\n";
    t += "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    let secs = |x: Option<f64>| x.map_or("–".to_string(), |x| format!("{x:.4} s"));
    for r in &report.reduce {
        t += &format!(
            "| {} | {} | {} | {} | {} | {:.3} s | {:.3} s | {:.2} | {} | {} | {} |\n",
            r.model,
            r.from,
            r.to,
            r.addends,
            bytes(r.bytes_moved),
            r.host_execute_s,
            r.memcpy_s,
            r.host_vs_memcpy,
            secs(r.gpu_reduce_s),
            secs(r.gpu_dtod_s),
            ratio(r.gpu_vs_dtod),
        );
    }
    if report.reduce.iter().all(|r| r.gpu_reduce_s.is_none()) {
        t += &format!("\nGPU reduce-copies: not measured ({})\n", gpu_absent());
    }
    t
}
