//! The `tenplan` command line.
//!
//! Exit codes: 0 success; 1 invalid input or an I/O failure; 2 usage error;
//! 3 no plan exists (state without a live holder); 4 a plan failed verification;
//! 5 `diff` found the two states different.

mod ckpt;
mod iobench;
mod scale;
mod switchcmd;
mod sync;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use tenplan::models::ParallelConfig;
use tenplan::models::{resolve, scenarios, ModelSpec, ModelState, StateKind, MODELS};
use tenplan::planner::{lower_bound_given, planner, Error as PlanError, LpPlanner, Placement, PLANNERS};
use tenplan::ptc::{Cluster, DType, DatasetFields, DatasetState, DeviceId, Forwarding, JobState, Plan, Problem};
use tenplan::report::{
    bytes, evaluate, evaluate_knowing, evaluate_unbounded, peak_resident_bytes, seconds, PlanReport,
};

#[derive(Parser)]
#[command(
    name = "tenplan",
    version,
    about = "Plan and verify the movement of a deep-learning job's state between parallel layouts"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Plan a reconfiguration: of a model between two layouts, or of a problem file.
    Plan(Box<PlanArgs>),
    /// Check a plan file with the independent checker.
    Verify {
        /// The plan file.
        plan: PathBuf,
    },
    /// Simulate a plan file (after checking it) and report its cost.
    Simulate {
        /// The plan file.
        plan: PathBuf,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List the models and their sizes: the catalog's presets, or one model
    /// from a Hugging Face config.json.
    Models {
        /// Only this model: a preset's name, a config.json or a model directory.
        #[arg(long)]
        model: Option<String>,
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Write a checkpoint with deterministic contents (for demos, tests and benchmarks).
    Init(ckpt::InitArgs),
    /// Reshard a checkpoint to another layout: plan, check, copy through memory maps, verify digests.
    Reshard(ckpt::ReshardArgs),
    /// Verify a checkpoint against its manifest: files, shapes, types, coverage and digests.
    Check {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Print one JSON object instead of a summary.
        #[arg(long)]
        json: bool,
    },
    /// Shard a Hugging Face safetensors model (any supported family) into a checkpoint.
    Import(ckpt::ImportArgs),
    /// Write a checkpoint's weights as a Hugging Face model directory (config.json, safetensors shards, index).
    Export(ckpt::ExportArgs),
    /// Compare two states tensor by tensor whatever their layouts and formats (checkpoints, Hugging Face directories); exit 5 when they differ.
    Diff(ckpt::DiffArgs),
    /// Plan hot switches between parallel strategies (HotSPa) and the best order of a step.
    Switch(switchcmd::SwitchArgs),
    /// Weight sync (RL post-training): a trainer's weights to the layout inference engines serve them in, planned, checked, bounded and simulated per planner.
    Sync(sync::SyncArgs),
    /// The hotspa suite: per-step switching time of lp and the hotspa baseline.
    BenchSwitch(switchcmd::BenchSwitchArgs),
    /// Executor benchmark: host executor vs memcpy, checkpoint reshard vs PyTorch DCP and vs the disk.
    BenchExecutor(iobench::BenchExecutorArgs),
    /// Show which samples a data-parallel rank reads next, from a dataset state.
    Data(DataArgs),
    /// Describe a cluster's fabric, or write its topology file (nodes, NICs, switches and links
    /// by name) to edit and pass back as --cluster FILE.json.
    Topology {
        /// Cluster: NODESxGPUS, a preset (PRESET:NODES) or a topology file.
        #[arg(long)]
        cluster: String,
        /// Write the topology file here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print the topology file instead of a summary.
        #[arg(long)]
        json: bool,
    },
    /// Run the Tenplex paper's scenarios with every planner and print one table.
    Demo {
        /// Print one JSON object per (scenario, planner) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Plan-quality benchmark: every planner on every scenario of a suite,
    /// simulated and compared with the lower bound and with tenplex.
    Bench {
        /// Suite: paper (Tenplex paper, 16 GPUs), large (DGX-H100 nodes, up to 1024 GPUs), rl (weight
        /// syncs from trainers to inference engines, up to 768 GPUs), all (paper and large), or
        /// scale (1k to 16k GPUs; each run its own `tenplan plan` process, timed and measured
        /// whole).
        #[arg(long, default_value = "paper")]
        suite: String,
        /// Scale suite: GPU counts (comma-separated multiples of 1024) [default: 1024,4096,16384].
        #[arg(long, value_delimiter = ',')]
        gpus: Option<Vec<u32>>,
        /// Scale suite: stop a (scenario, planner) run after this many seconds and report it as
        /// timed out [default: 600].
        #[arg(long)]
        timeout: Option<f64>,
        /// Scale suite: clusters (comma-separated: dgx-h100 non-blocking, dgx-h100-rail 1:1 spine,
        /// dgx-h100-rail-2to1) [default: dgx-h100,dgx-h100-rail-2to1].
        #[arg(long, value_delimiter = ',')]
        fabrics: Option<Vec<String>>,
        /// Write the results here as a JSON array, one object per (scenario, planner).
        #[arg(long)]
        json: Option<PathBuf>,
        /// Planners to run (comma-separated; default all).
        #[arg(long, value_delimiter = ',')]
        planners: Option<Vec<String>>,
    },
}

#[derive(Args)]
struct DataArgs {
    /// Dataset state: a JSON file, or inline `dataset_size=N,seed=S,consumed=C,global_batch=B`.
    #[arg(long)]
    state: String,
    /// The parallel layout (its dp is the number of data-parallel ranks).
    #[arg(long)]
    layout: String,
    /// Data-parallel rank.
    #[arg(long)]
    rank: u64,
    /// Number of micro-batches to show.
    #[arg(long, default_value_t = 1)]
    steps: u64,
    /// Samples per micro-batch (default: the rank's whole share of a step).
    #[arg(long)]
    micro_batch: Option<u64>,
    /// Size of the dataset being read: refuses a state saved for another dataset.
    #[arg(long)]
    dataset_size: Option<u64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct PlanArgs {
    /// Model name (see `tenplan models`).
    #[arg(long, required_unless_present = "problem", conflicts_with = "problem")]
    model: Option<String>,
    /// Source layout, e.g. tp=4,pp=2,dp=1 (keys tp, pp, dp, zero, ep, devices=A-B, split=A:B:..).
    #[arg(long, required_unless_present = "problem")]
    from: Option<String>,
    /// Target layout.
    #[arg(long, required_unless_present = "problem")]
    to: Option<String>,
    /// Cluster: NODESxGPUS (Tenplex testbed link rates), a preset (tenplex-onprem, dgx-h100,
    /// dgx-h100-rail, dgx-h100-rail-2to1, gb200-nvl72; PRESET:NODES), or a topology file (FILE.json,
    /// see `tenplan topology`).
    #[arg(long, default_value = "tenplex-onprem")]
    cluster: String,
    /// Dead devices, e.g. 0-3 or 0,5,9-11.
    #[arg(long)]
    dead: Option<String>,
    /// The job's last checkpoint is on storage (read at the cluster's storage
    /// bandwidth): state no live device holds is recovered from it.
    #[arg(long)]
    storage: bool,
    /// State to move: `training` (bf16 weights, fp32 master weights, Adam moments) or `weights`.
    #[arg(long, default_value = "training")]
    state: String,
    /// Element type of the weights when --state weights.
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// A problem file (docs/problem-format.md) instead of --model/--from/--to.
    #[arg(long)]
    problem: Option<PathBuf>,
    /// Write the problem file and stop.
    #[arg(long)]
    emit_problem: Option<PathBuf>,
    /// Planner: lp (optimal, HiGHS), lp-placed, tenplex, central, least-loaded, hotspa,
    /// static-p2p, broadcast (checkpoint-engine's) or trees (broadcast trees among the receivers).
    #[arg(long, default_value = "lp")]
    planner: String,
    /// With the lp planner: `fixed` keeps the target's rank placement, `optimize` chooses it.
    #[arg(long, default_value = "fixed")]
    placement: String,
    /// HiGHS threads for the lp planner (1 keeps plans deterministic).
    #[arg(long, default_value_t = 1)]
    threads: u32,
    /// Time limit for the LP solver, in seconds (the MIP's defaults to 10).
    #[arg(long)]
    time_limit: Option<f64>,
    /// Integer variant: whole fragments, direct paths, per-message cost, solved
    /// as a MIP with a time limit (small instances); reports the gap to the bound.
    #[arg(long)]
    integral: bool,
    /// With the lp planner: send every destination its own copy, never one
    /// copy forwarded by another destination (for comparison).
    #[arg(long)]
    no_multicast: bool,
    /// Where a multicast's destination may forward what it receives: `node`
    /// (devices of its node, the default) or `cluster` (any device, over the
    /// network too: broadcast trees; the bound is then the cuts alone).
    /// Overrides a problem file's.
    #[arg(long)]
    forwarding: Option<String>,
    /// Split the plan into rounds so that no device stages (receives from
    /// others) more than this many bytes at once, e.g. 2GiB.
    #[arg(long)]
    staging_budget: Option<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Write the plan file (docs/plan-format.md) here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The job's dataset and RNG state (JSON: {"dataset": {...}, "rng": {...}}), carried by the plan.
    #[arg(long)]
    job: Option<PathBuf>,
}

/// Errors that map to their own exit codes.
#[derive(Debug, thiserror::Error)]
enum Exit {
    #[error("{0}")]
    Infeasible(String),
    #[error("{0}")]
    Rejected(String),
    #[error("{0}")]
    Differ(String),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = match e.downcast_ref::<Exit>() {
                Some(Exit::Infeasible(_)) => 3,
                Some(Exit::Rejected(_)) => 4,
                Some(Exit::Differ(_)) => 5,
                None => 1,
            };
            // `diff` has printed its report; differing is an answer, not an error.
            #[allow(clippy::print_stderr)]
            if code != 5 {
                eprintln!("error: {}", one_line(&e));
            }
            ExitCode::from(code)
        }
    }
}

/// An error and its causes on one line, each cause once: errors that
/// already say their cause (`layout `tp=3`: tp=3 does not divide ...`) do
/// not repeat it.
fn one_line(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg += ": ";
            msg += &c;
        }
    }
    msg
}

#[allow(clippy::print_stdout)]
pub(crate) fn out(s: &str) {
    print!("{s}");
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Plan(args) => plan(*args),
        Command::Verify { plan } => {
            let plan = read_plan(&plan)?;
            match tenplan::proofs::check(&plan) {
                Ok(cert) => {
                    out(&format!("{cert}\n"));
                    Ok(())
                }
                Err(v) => Err(Exit::Rejected(format!("plan rejected: {v}")).into()),
            }
        }
        Command::Simulate { plan, json } => {
            let plan = read_plan(&plan)?;
            let report = evaluate(&plan, f64::NAN);
            if !report.verified {
                return Err(Exit::Rejected(format!("plan {}", report.verdict)).into());
            }
            print_report(&report, json)
        }
        Command::Topology {
            cluster,
            out: path,
            json,
        } => {
            let cluster = Cluster::open(&cluster)?;
            let topology = tenplan::ptc::Topology::of(cluster.data());
            let text = serde_json::to_string_pretty(&topology)?;
            if let Some(path) = &path {
                write_atomic(path, text.as_bytes())?;
            }
            if json {
                out(&format!("{text}\n"));
            } else {
                out(&tenplan::report::fabric_summary(&cluster));
            }
            Ok(())
        }
        Command::Models { model, json } => {
            let specs = match model {
                Some(m) => vec![resolve(&m)?],
                None => MODELS.to_vec(),
            };
            if json {
                let rows: Vec<_> = specs.iter().map(model_json).collect();
                out(&(serde_json::to_string_pretty(&rows)? + "\n"));
            } else {
                out(&models_table(&specs));
            }
            Ok(())
        }
        Command::Data(args) => data(args),
        Command::Init(args) => ckpt::init(args),
        Command::Reshard(args) => ckpt::reshard(args),
        Command::Check { dir, json } => ckpt::check(&dir, json),
        Command::Import(args) => ckpt::import(args),
        Command::Export(args) => ckpt::export(args),
        Command::Diff(args) => ckpt::diff(args),
        Command::BenchExecutor(args) => iobench::bench_executor(args),
        Command::Switch(args) => switchcmd::switch(args),
        Command::Sync(args) => sync::sync(args),
        Command::BenchSwitch(args) => switchcmd::bench_switch(args),
        Command::Demo { json } => demo(json),
        Command::Bench {
            suite,
            json,
            planners,
            gpus,
            timeout,
            fabrics,
        } => {
            if suite == "scale" {
                let gpus = gpus.unwrap_or_else(|| vec![1024, 4096, 16384]);
                let fabrics = fabrics.unwrap_or_else(|| vec!["dgx-h100".into(), "dgx-h100-rail-2to1".into()]);
                return scale::bench(&gpus, &fabrics, planners, timeout.unwrap_or(600.0), json.as_deref());
            }
            if gpus.is_some() || timeout.is_some() || fabrics.is_some() {
                bail!("--gpus, --timeout and --fabrics are options of the scale suite, not of `{suite}`");
            }
            bench(&suite, json.as_deref(), planners)
        }
    }
}

/// Largest plan, problem, job or peers file read (1 GiB): parsing a JSON
/// document takes several times its size in memory.
const MAX_INPUT_BYTES: u64 = 1 << 30;

/// Read a text file given on the command line, refusing one over
/// [`MAX_INPUT_BYTES`] before reading it.
pub(crate) fn read_input(path: &Path) -> Result<String> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    if len > MAX_INPUT_BYTES {
        bail!(
            "{}: {} is larger than the {} limit on input files",
            path.display(),
            bytes(len),
            bytes(MAX_INPUT_BYTES)
        );
    }
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

fn read_plan(path: &Path) -> Result<Plan> {
    let text = read_input(path)?;
    Plan::from_json(&text).with_context(|| format!("{}", path.display()))
}

/// Check `--threads`: at least 1 and at most this machine's cores (more
/// solver threads than cores only slow HiGHS down; 100,000 of them ran for
/// minutes before this check).
pub(crate) fn check_threads(threads: u32) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    if threads == 0 || threads > cores {
        bail!("--threads {threads}: expected 1 to {cores} (the cores of this machine)");
    }
    Ok(())
}

use tenplan::ptc::limits::{available_memory, BYTES_PER_PIECE};

/// Refuse a problem (read from a file) whose planning would need more memory
/// than this machine has available: the pieces its devices hold, every
/// replica counted, at [`BYTES_PER_PIECE`] each.
fn check_problem_memory(problem: &Problem) -> Result<()> {
    let pieces = problem
        .source()
        .pieces_held()
        .saturating_add(problem.target().pieces_held());
    let need = pieces.saturating_mul(BYTES_PER_PIECE);
    if let Some(have) = available_memory() {
        if need > have {
            bail!(
                "the problem would need about {} of memory to plan ({pieces} pieces held by its devices at {} each), more than the {} this machine has available",
                bytes(need),
                bytes(BYTES_PER_PIECE),
                bytes(have)
            );
        }
    }
    Ok(())
}

/// Refuse, before building it, a layout that does not fit the cluster or
/// whose problem would need more memory than this machine has available.
pub(crate) fn check_layout(state: &ModelState, cfg: &ParallelConfig, cluster: &Cluster) -> Result<()> {
    Ok(state.check_plannable(cfg, cluster)?)
}

/// Parse `--dead`: devices and ranges, each below `devices` (the cluster's
/// count), checked before a range is expanded.
fn parse_dead(s: &str, devices: u32) -> Result<Vec<DeviceId>> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let num = |x: &str| {
            x.trim()
                .parse::<DeviceId>()
                .with_context(|| format!("bad device `{x}` in --dead {s}"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    bail!("inverted range `{part}` in --dead {s}");
                }
                if b >= devices {
                    bail!("device {b} in --dead {s} does not exist (the cluster has {devices} devices)");
                }
                out.extend(a..=b);
            }
            None => {
                let d = num(part)?;
                if d >= devices {
                    bail!("device {d} in --dead {s} does not exist (the cluster has {devices} devices)");
                }
                out.push(d);
            }
        }
    }
    Ok(out)
}

fn problem_of(args: &PlanArgs) -> Result<Problem> {
    let mut problem = bare_problem_of(args)?;
    match args.forwarding.as_deref() {
        None => {}
        Some("node") => problem = problem.with_forwarding(Forwarding::Node),
        Some("cluster") => problem = problem.with_forwarding(Forwarding::Cluster),
        Some(other) => bail!("--forwarding: unknown `{other}` (expected node or cluster)"),
    }
    if args.storage {
        problem = problem.with_storage()?;
    }
    match &args.job {
        Some(path) => {
            let text = read_input(path)?;
            let job: JobState =
                serde_json::from_str(&text).with_context(|| format!("{}: not a valid job state", path.display()))?;
            Ok(problem.with_job(job))
        }
        None => Ok(problem),
    }
}

fn bare_problem_of(args: &PlanArgs) -> Result<Problem> {
    if let Some(path) = &args.problem {
        let text = read_input(path)?;
        let problem = Problem::from_json(&text).with_context(|| format!("{}", path.display()))?;
        check_problem_memory(&problem).with_context(|| format!("{}", path.display()))?;
        return match &args.dead {
            Some(d) => {
                let dead = parse_dead(d, problem.cluster().num_devices())?;
                Ok(problem.with_cluster(problem.cluster().with_dead(dead)?)?)
            }
            None => Ok(problem),
        };
    }
    let (model, from, to) = match (&args.model, &args.from, &args.to) {
        (Some(m), Some(f), Some(t)) => (m, f, t),
        _ => bail!("--model, --from and --to are required without --problem"),
    };
    let kind = match args.state.as_str() {
        "training" => StateKind::Training,
        "weights" => StateKind::Weights(args.dtype.parse::<DType>()?),
        other => bail!("unknown state `{other}` (expected training or weights)"),
    };
    let state = ModelState::new(&resolve(model)?, kind);
    let mut cluster = Cluster::open(&args.cluster)?;
    if let Some(d) = &args.dead {
        cluster = cluster.with_dead(parse_dead(d, cluster.num_devices())?)?;
    }
    let (from, to): (ParallelConfig, ParallelConfig) = (from.parse()?, to.parse()?);
    check_layout(&state, &from, &cluster).context("source layout")?;
    check_layout(&state, &to, &cluster).context("target layout")?;
    let from_layout = state.layout(&from).context("source layout")?;
    let to_layout = state.layout(&to).context("target layout")?;
    Ok(Problem::new(from_layout, to_layout, cluster)?)
}

fn plan(args: PlanArgs) -> Result<()> {
    check_threads(args.threads)?;
    if let Some(t) = args.time_limit {
        tenplan::ptc::limits::check_time_limit(t).context("--time-limit")?;
    }
    let budget = args
        .staging_budget
        .as_deref()
        .map(tenplan::ptc::limits::parse_bytes)
        .transpose()
        .context("--staging-budget")?;
    let problem = problem_of(&args)?;
    if let Some(path) = &args.emit_problem {
        write_atomic(path, problem.to_json().as_bytes())?;
        return Ok(());
    }
    if args.integral {
        return plan_integral(&args, &problem);
    }
    let p: Box<dyn tenplan::planner::Planner> = match (args.planner.as_str(), args.placement.as_str()) {
        ("lp" | "lp-placed", placement) => {
            let placement = match (args.planner.as_str(), placement) {
                ("lp-placed", _) | (_, "optimize") => Placement::Optimize,
                (_, "fixed") => Placement::Fixed,
                (_, other) => bail!("unknown placement `{other}` (expected fixed or optimize)"),
            };
            let mut b = LpPlanner::builder()
                .threads(args.threads)
                .placement(placement)
                .multicast(!args.no_multicast);
            if let Some(t) = args.time_limit {
                b = b.time_limit_s(t);
            }
            Box::new(b.build())
        }
        (name, _) if args.no_multicast => bail!("--no-multicast needs the lp planner, not {name}"),
        (name, "fixed") => planner(name)?,
        (name, _) => bail!("--placement optimize needs the lp planner, not {name}"),
    };
    let (plan, took, certified) = run_planner(&*p, &problem)?;
    let plan = staged(plan, budget)?;
    let mut report = evaluate_knowing(&plan, took, certified.as_ref());
    report.peak_memory_bytes = peak_resident_bytes();
    if let Some(path) = &args.out {
        write_atomic(path, plan.to_json().as_bytes())?;
    }
    print_report(&report, args.json)?;
    if !report.verified {
        return Err(Exit::Rejected(format!(
            "planner {} produced a plan that {}",
            plan.planner, report.verdict
        ))
        .into());
    }
    Ok(())
}

/// Apply `--staging-budget`, if given.
fn staged(plan: Plan, budget: Option<u64>) -> Result<Plan> {
    match budget {
        None => Ok(plan),
        Some(b) => Ok(tenplan::planner::schedule::stage(&plan, b)?),
    }
}

fn plan_integral(args: &PlanArgs, problem: &Problem) -> Result<()> {
    if args.planner != "lp" || args.placement != "fixed" {
        bail!("--integral is its own planner: drop --planner and --placement");
    }
    let mip = tenplan::planner::MipPlanner {
        time_limit_s: args.time_limit.unwrap_or(10.0),
        threads: args.threads,
        ..Default::default()
    };
    let start = Instant::now();
    let (plan, mip_report) = match mip.plan_with_report(problem) {
        Ok(x) => x,
        Err(PlanError::Infeasible(inf)) => {
            #[allow(clippy::print_stderr)]
            {
                eprint!("{}", inf.report());
            }
            return Err(Exit::Infeasible(inf.to_string()).into());
        }
        Err(e) => return Err(e.into()),
    };
    let budget = args
        .staging_budget
        .as_deref()
        .map(tenplan::ptc::limits::parse_bytes)
        .transpose()?;
    let plan = staged(plan, budget)?;
    let report = evaluate(&plan, start.elapsed().as_secs_f64());
    if let Some(path) = &args.out {
        write_atomic(path, plan.to_json().as_bytes())?;
    }
    let status = if mip_report.optimal {
        "optimal"
    } else {
        "time limit (best found)"
    };
    if args.json {
        let mut v = serde_json::to_value(&report)?;
        v["mip"] = serde_json::json!({
            "status": status, "makespan_s": mip_report.makespan_s, "lower_bound_s": mip_report.lower_bound_s,
            "gap": mip_report.gap, "binaries": mip_report.binaries,
        });
        out(&format!("{v}\n"));
    } else {
        out(&report.table());
        out(&format!(
            "MIP: {status}, {} binaries; {} under the cost model, {:.2}% above the certified bound\n",
            mip_report.binaries,
            seconds(mip_report.makespan_s),
            100.0 * mip_report.gap
        ));
    }
    if !report.verified {
        return Err(Exit::Rejected(format!("the MIP produced a plan that {}", report.verdict)).into());
    }
    Ok(())
}

fn run_planner(
    p: &dyn tenplan::planner::Planner,
    problem: &Problem,
) -> Result<(Plan, f64, Option<tenplan::planner::LowerBound>)> {
    let start = Instant::now();
    match p.plan_with_bound(problem) {
        Ok((plan, bound)) => Ok((plan, start.elapsed().as_secs_f64(), bound)),
        Err(PlanError::Infeasible(inf)) => {
            #[allow(clippy::print_stderr)]
            {
                eprint!("{}", inf.report());
            }
            Err(Exit::Infeasible(inf.to_string()).into())
        }
        Err(e) => Err(e.into()),
    }
}

fn print_report(report: &PlanReport, json: bool) -> Result<()> {
    if json {
        out(&format!("{}\n", serde_json::to_string(report)?));
    } else {
        out(&report.table());
    }
    Ok(())
}

/// Write a file atomically: temporary file in the same directory, fsync, rename.
pub(crate) fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .with_context(|| format!("{} is not a file path", path.display()))?;
    let tmp = dir.join(format!(".{}.tmp{}", name.to_string_lossy(), std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("cannot write {}", path.display()))
}

fn models_table(specs: &[ModelSpec]) -> String {
    let mut s = String::from("| model | family | layers | hidden | heads | kv heads | head dim | ffn | vocab | experts | tensors | parameters | training state |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for m in specs {
        let size = ModelSize::of(m);
        let experts = match (m.experts, m.shared_ffn > 0) {
            (0, _) => "-".to_string(),
            (e, false) => e.to_string(),
            (e, true) => format!("{e} + shared"),
        };
        s += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            m.name,
            m.family,
            m.layers,
            m.hidden,
            m.heads,
            m.groups,
            m.head_dim,
            m.ffn,
            m.vocab,
            experts,
            size.tensors,
            params(size.parameters),
            bytes(size.training_state_bytes)
        );
    }
    s
}

/// A parameter count as people write it: 1.54B, 124.4M.
fn params(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2}B", n as f64 / 1e9)
    } else if n >= 1_000_000 {
        format!("{:.1}M", n as f64 / 1e6)
    } else {
        n.to_string()
    }
}

/// What `tenplan models` says of a model's size, from its training state.
struct ModelSize {
    tensors: usize,
    parameters: u64,
    training_state_bytes: u64,
}

impl ModelSize {
    fn of(m: &ModelSpec) -> ModelSize {
        let training = ModelState::new(m, StateKind::Training);
        ModelSize {
            tensors: training.parameter_tensors(),
            parameters: training.parameter_count(),
            training_state_bytes: training.tensors().iter().map(|t| t.bytes()).sum(),
        }
    }
}

fn model_json(m: &ModelSpec) -> serde_json::Value {
    let size = ModelSize::of(m);
    let mut v = serde_json::to_value(m).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("tensors".into(), size.tensors.into());
        o.insert("parameters".into(), size.parameters.into());
        o.insert("training_state_bytes".into(), size.training_state_bytes.into());
    }
    v
}

fn dataset_state(spec: &str) -> Result<DatasetState> {
    let path = Path::new(spec);
    if path.exists() || !spec.contains('=') {
        let text = read_input(path)?;
        return serde_json::from_str(&text).with_context(|| format!("{spec}: not a valid dataset state"));
    }
    let mut f = DatasetFields {
        dataset_size: 0,
        seed: 0,
        consumed: 0,
        global_batch: 0,
    };
    for part in spec.split(',') {
        let (k, v) = part
            .split_once('=')
            .with_context(|| format!("`{part}` is not key=value in --state"))?;
        let v: u64 = v
            .trim()
            .parse()
            .with_context(|| format!("`{part}`: expected a non-negative integer"))?;
        match k.trim() {
            "dataset_size" => f.dataset_size = v,
            "seed" => f.seed = v,
            "consumed" => f.consumed = v,
            "global_batch" => f.global_batch = v,
            other => bail!("unknown key `{other}` in --state (expected dataset_size, seed, consumed, global_batch)"),
        }
    }
    Ok(DatasetState::new(f)?)
}

fn data(args: DataArgs) -> Result<()> {
    let state = dataset_state(&args.state)?;
    if let Some(n) = args.dataset_size {
        state.for_dataset(n)?;
    }
    let layout: ParallelConfig = args.layout.parse()?;
    let dp = layout.dp as u64;
    let (a, b) = state.share(dp, args.rank)?;
    let micro = args.micro_batch.unwrap_or(b - a);
    let batches = state.micro_batches(dp, args.rank, micro, args.steps)?;
    if args.json {
        out(&format!("{}\n", serde_json::to_string(&batches)?));
        return Ok(());
    }
    let mut s = format!(
        "rank {} of dp={} reads positions {}..{} of every global batch of {}\n| step | micro-batch | first position | samples |\n|---:|---:|---:|---|\n",
        args.rank,
        dp,
        a,
        b,
        state.fields().global_batch
    );
    for m in batches {
        let samples: Vec<String> = m.samples.iter().map(u64::to_string).collect();
        s += &format!(
            "| {} | {} | {} | {} |\n",
            m.step,
            m.micro,
            m.first_position,
            samples.join(" ")
        );
    }
    out(&s);
    Ok(())
}

/// One (scenario, planner) result of a suite.
struct Row {
    scenario: String,
    gpus: u32,
    report: PlanReport,
    /// Tenplex's makespan over this one (none when tenplex did not run).
    speedup: Option<f64>,
    /// For a weight sync, the least time a bucketed broadcast would take.
    broadcast_floor: Option<tenplan::planner::BroadcastFloor>,
}

/// Run planners on scenarios, checking and simulating every plan.
fn run_suite(suite: &[scenarios::Scenario], planners: &[String], progress: bool) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (i, sc) in suite.iter().enumerate() {
        let problem = sc.problem().with_context(|| sc.name.clone())?;
        let mut reports = Vec::new();
        // The best bound a planner certified for this problem on the way.
        let mut known: Option<tenplan::planner::LowerBound> = None;
        for name in planners {
            if progress {
                #[allow(clippy::print_stderr)]
                {
                    eprintln!("[{}/{}] {} with {name}", i + 1, suite.len(), sc.name);
                }
            }
            let (plan, took, certified) = run_planner(&*planner(name)?, &problem).with_context(|| sc.name.clone())?;
            // A placing planner answers a re-placed problem: bound that one.
            let shared = plan.problem == problem;
            let r = if shared {
                if let Some(c) = certified.filter(|c| known.as_ref().is_none_or(|k| c.seconds > k.seconds)) {
                    known = Some(c);
                }
                evaluate_unbounded(&plan, took)
            } else {
                evaluate_knowing(&plan, took, certified.as_ref())
            };
            if !r.verified {
                return Err(Exit::Rejected(format!("{} with {name}: {}", sc.name, r.verdict)).into());
            }
            reports.push((r, shared));
        }
        // One bound for the planners that answered this problem, capped by
        // the best of their (verified) loads; it takes its time once.
        let upper = reports
            .iter()
            .filter(|(_, shared)| *shared)
            .map(|(r, _)| r.max_load_s)
            .fold(f64::INFINITY, f64::min);
        let start = Instant::now();
        let bound = lower_bound_given(&problem, upper, known.as_ref()).with_context(|| sc.name.clone())?;
        let bound_s = start.elapsed().as_secs_f64();
        let reports: Vec<PlanReport> = reports
            .into_iter()
            .map(|(mut r, shared)| {
                if shared {
                    r.set_bound(&bound);
                    r.timings.bound_s = bound_s;
                }
                r
            })
            .collect();
        let base = reports.iter().find(|r| r.planner == "tenplex").map(|r| r.makespan_s);
        let floor = sc.serving.then(|| tenplan::planner::broadcast_floor(&problem));
        for report in reports {
            rows.push(Row {
                scenario: sc.name.clone(),
                gpus: problem.cluster().num_devices() - problem.cluster().dead().len() as u32,
                speedup: base.map(|b| b / report.makespan_s),
                broadcast_floor: floor.clone(),
                report,
            });
        }
    }
    Ok(rows)
}

fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| scenario | planner | moved | cross-node | max load | simulated makespan | lower bound | makespan / bound | speed-up vs tenplex | planning time |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let r = &row.report;
        s += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.3} | {} | {} |\n",
            row.scenario,
            r.planner,
            bytes(r.bytes_moved),
            bytes(r.bytes_cross_node),
            seconds(r.max_load_s),
            seconds(r.makespan_s),
            seconds(r.lower_bound_s),
            r.makespan_s / r.lower_bound_s,
            row.speedup.map_or("—".to_string(), |x| format!("{x:.2}x")),
            seconds(r.planning_time_s)
        );
    }
    s
}

fn row_json(row: &Row) -> Result<serde_json::Value> {
    let mut v = serde_json::to_value(&row.report)?;
    v["scenario"] = row.scenario.clone().into();
    v["gpus"] = row.gpus.into();
    v["speedup_vs_tenplex"] = row.speedup.into();
    v["makespan_over_bound"] = (row.report.makespan_s / row.report.lower_bound_s).into();
    if let Some(f) = &row.broadcast_floor {
        v["broadcast_floor_s"] = f.seconds.into();
        v["broadcast_floor_over_makespan"] = (f.seconds / row.report.makespan_s).into();
    }
    Ok(v)
}

/// Weight syncs against checkpoint-engine's policy: each planner's speed-up
/// over the `broadcast` planner's plan where it ran, else over the least
/// time a bucketed broadcast of every weight to every engine device could
/// take (empty when no scenario is a weight sync).
fn broadcast_table(rows: &[Row], planners: &[String]) -> String {
    let mut scenarios: Vec<(&str, &tenplan::planner::BroadcastFloor)> = Vec::new();
    for r in rows {
        if let Some(f) = &r.broadcast_floor {
            if scenarios.last().is_none_or(|(s, _)| *s != r.scenario) {
                scenarios.push((&r.scenario, f));
            }
        }
    }
    if scenarios.is_empty() {
        return String::new();
    }
    let planned = planners.iter().any(|p| p == "broadcast");
    let others: Vec<&String> = planners.iter().filter(|p| *p != "broadcast").collect();
    let mut t = String::from("\n| scenario | broadcast floor |");
    if planned {
        t += " broadcast (plan) |";
    }
    for p in &others {
        t += &format!(" {p} vs broadcast |");
    }
    t += "\n|---|---:|";
    t += &"---:|".repeat(others.len() + usize::from(planned));
    t += "\n";
    let find = |scenario: &str, p: &str| rows.iter().find(|r| r.scenario == scenario && r.report.planner == p);
    for (scenario, f) in scenarios {
        t += &format!("| {scenario} | {} |", seconds(f.seconds));
        let base = if planned {
            let plan = find(scenario, "broadcast").map(|r| r.report.makespan_s);
            t += &format!(" {} |", plan.map_or("—".to_string(), seconds));
            plan
        } else {
            Some(f.seconds)
        };
        for p in &others {
            match (find(scenario, p), base) {
                (Some(r), Some(base)) => t += &format!(" {:.2}x |", base / r.report.makespan_s),
                _ => t += " — |",
            }
        }
        t += "\n";
    }
    t
}

/// What produced a benchmark: cores, version, build.
pub(crate) fn machine() -> String {
    format!(
        "{} cores, tenplan {}, {} build",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        env!("CARGO_PKG_VERSION"),
        if cfg!(debug_assertions) { "debug" } else { "release" }
    )
}

fn all_planners() -> Vec<String> {
    PLANNERS.iter().map(|s| s.to_string()).collect()
}

/// The planners a benchmark was asked for (all by default), each checked to exist.
pub(crate) fn known_planners(asked: Option<Vec<String>>) -> Result<Vec<String>> {
    let planners = asked.unwrap_or_else(all_planners);
    for p in &planners {
        planner(p)?;
    }
    Ok(planners)
}

fn demo(json: bool) -> Result<()> {
    let rows = run_suite(&scenarios::paper(), &all_planners(), false)?;
    if json {
        for row in &rows {
            out(&format!("{}\n", row_json(row)?));
        }
    } else {
        out(&table(&rows));
    }
    Ok(())
}

fn bench(suite: &str, json: Option<&Path>, planners: Option<Vec<String>>) -> Result<()> {
    let scenarios = scenarios::suite(suite)
        .with_context(|| format!("unknown suite `{suite}` (expected paper, large, rl, all or scale)"))?;
    // Weight syncs are compared with the published sync policies too.
    let planners = match (planners, suite) {
        (None, "rl") => tenplan::planner::SYNC_COMPARED.iter().map(|s| s.to_string()).collect(),
        (asked, _) => known_planners(asked)?,
    };
    let rows = run_suite(&scenarios, &planners, true)?;
    let mut text = table(&rows);
    // Geometric mean of the speed-up over tenplex, per planner.
    text += "\n| planner | geometric-mean speed-up vs tenplex | worst makespan / bound |\n|---|---:|---:|\n";
    for p in &planners {
        let mine: Vec<&Row> = rows.iter().filter(|r| &r.report.planner == p).collect();
        let speedups: Option<Vec<f64>> = mine.iter().map(|r| r.speedup).collect();
        let mean = speedups.filter(|s| !s.is_empty()).map_or("—".to_string(), |s| {
            format!("{:.3}x", (s.iter().map(|x| x.ln()).sum::<f64>() / s.len() as f64).exp())
        });
        let worst = mine
            .iter()
            .map(|r| r.report.makespan_s / r.report.lower_bound_s)
            .fold(0.0, f64::max);
        text += &format!("| {p} | {mean} | {worst:.3} |\n");
    }
    text += &broadcast_table(&rows, &planners);
    let machine = machine();
    text += &format!("\nmachine: {machine}; LP solver: HiGHS (IPM, 1 thread)\n");
    out(&text);
    if let Some(path) = json {
        let mut all = Vec::new();
        for row in &rows {
            let mut v = row_json(row)?;
            v["suite"] = suite.into();
            v["machine"] = machine.clone().into();
            all.push(v);
        }
        write_atomic(path, serde_json::to_string_pretty(&all)?.as_bytes())?;
    }
    Ok(())
}
