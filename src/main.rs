//! The `tenplan` command line: it parses arguments into the application
//! layer's requests (`tenplan_application`) and prints their outcomes
//! (`tenplan::render` for people, the outcome itself with `--json`).
//!
//! Exit codes: 0 success; 1 invalid input or an I/O failure; 2 usage error;
//! 3 no plan exists (state without a live holder); 4 a plan failed verification;
//! 5 `diff` found the two states different.

mod ckpt;
mod switch;
mod sync;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use tenplan::application::{
    self as app, describe_model, fabric_summary, peak_resident_bytes, Assessed, Bound, Config, IntegralRequest,
    ModelMove, PlanRequest, Planned,
};
use tenplan::models::{resolve, ModelSpec, StateKind, MODELS};
use tenplan::planner::PlannerSpec;
use tenplan::ptc::{Cluster, DType, DatasetFields, DatasetState, DeviceId, Forwarding, JobState, Problem};
use tenplan::render;

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
    Switch(switch::SwitchArgs),
    /// Weight sync (RL post-training): a trainer's weights to the layout inference engines serve them in, planned, checked, bounded and simulated per planner.
    Sync(sync::SyncArgs),
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
    /// Moved to the benchmark binary: `tenplan-bench demo`.
    #[command(hide = true)]
    Demo {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        rest: Vec<String>,
    },
    /// Moved to the benchmark binary: `tenplan-bench suite`.
    #[command(hide = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        rest: Vec<String>,
    },
    /// Moved to the benchmark binary: `tenplan-bench switch`.
    #[command(hide = true)]
    BenchSwitch {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        rest: Vec<String>,
    },
    /// Moved to the benchmark binary: `tenplan-bench executor`.
    #[command(hide = true)]
    BenchExecutor {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        rest: Vec<String>,
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
            let plan = app::read_plan(&plan)?;
            match tenplan::proofs::check(&plan) {
                Ok(cert) => {
                    out(&format!("{cert}\n"));
                    Ok(())
                }
                Err(v) => Err(Exit::Rejected(format!("plan rejected: {v}")).into()),
            }
        }
        Command::Simulate { plan, json } => {
            let plan = app::read_plan(&plan)?;
            let problem = plan.problem.clone();
            let a = app::evaluate(&problem, vec![Planned::given(plan)], Bound::Shared).remove(0);
            if !a.report.verified {
                return Err(Exit::Rejected(format!("plan {}", a.report.verdict)).into());
            }
            print_report(&a, json)
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
                out(&fabric_summary(&cluster));
            }
            Ok(())
        }
        Command::Models { model, json } => {
            let specs: Vec<ModelSpec> = match model {
                Some(m) => vec![resolve(&m)?],
                None => MODELS.to_vec(),
            };
            let models: Vec<_> = specs.iter().map(describe_model).collect();
            if json {
                out(&(serde_json::to_string_pretty(&models)? + "\n"));
            } else {
                out(&render::models_table(&models));
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
        Command::Switch(args) => switch::switch(args),
        Command::Sync(args) => sync::sync(args),
        Command::Demo { .. } => moved("demo", "demo"),
        Command::Bench { .. } => moved("bench", "suite"),
        Command::BenchSwitch { .. } => moved("bench-switch", "switch"),
        Command::BenchExecutor { .. } => moved("bench-executor", "executor"),
    }
}

/// Benchmarks are not commands of the product: say where one went.
fn moved(old: &str, new: &str) -> Result<()> {
    bail!("`tenplan {old}` moved to the benchmark binary: run `tenplan-bench {new}` (`make demo` and `make bench*` run it)")
}

/// Write a file atomically (see [`tenplan::formats::write_file`]).
pub(crate) fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    Ok(tenplan::formats::write_file(path, data)?)
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

/// A job state file (`{"dataset": {...}, "rng": {...}}`).
pub(crate) fn read_job(path: &Path) -> Result<JobState> {
    let text = app::read_input(path)?;
    serde_json::from_str(&text).with_context(|| format!("{}: not a valid job state", path.display()))
}

/// The state `--state` and `--dtype` name.
fn state_kind(state: &str, dtype: &str) -> Result<StateKind> {
    Ok(match state {
        "training" => StateKind::Training,
        "weights" => StateKind::Weights(dtype.parse::<DType>()?),
        other => bail!("unknown state `{other}` (expected training or weights)"),
    })
}

/// The problem `tenplan plan` poses: a problem file, or a model between two
/// layouts; with the dead devices, forwarding, storage and job state asked.
fn problem_of(args: &PlanArgs) -> Result<Problem> {
    let mut problem = match &args.problem {
        Some(path) => {
            let problem = app::read_problem(path)?;
            match &args.dead {
                Some(d) => {
                    let dead = parse_dead(d, problem.cluster().num_devices())?;
                    problem.with_cluster(problem.cluster().with_dead(dead)?)?
                }
                None => problem,
            }
        }
        None => {
            let (Some(model), Some(from), Some(to)) = (&args.model, &args.from, &args.to) else {
                bail!("--model, --from and --to are required without --problem");
            };
            let mut cluster = Cluster::open(&args.cluster)?;
            if let Some(d) = &args.dead {
                cluster = cluster.with_dead(parse_dead(d, cluster.num_devices())?)?;
            }
            let movement = ModelMove {
                model: resolve(model)?,
                state: state_kind(&args.state, &args.dtype)?,
                from: from.parse::<Config>()?,
                to: to.parse::<Config>()?,
                cluster,
            };
            movement.problem()?
        }
    };
    match args.forwarding.as_deref() {
        None => {}
        Some("node") => problem = problem.with_forwarding(Forwarding::Node),
        Some("cluster") => problem = problem.with_forwarding(Forwarding::Cluster),
        Some(other) => bail!("--forwarding: unknown `{other}` (expected node or cluster)"),
    }
    if args.storage {
        problem = problem.with_storage()?;
    }
    if let Some(path) = &args.job {
        problem = problem.with_job(read_job(path)?);
    }
    Ok(problem)
}

/// The planner `--planner`, `--placement`, `--threads`, `--time-limit` and
/// `--no-multicast` describe.
fn planner_spec(args: &PlanArgs) -> Result<PlannerSpec> {
    let mut spec: PlannerSpec = args.planner.parse()?;
    spec = spec.with_placement(args.placement.parse()?)?;
    spec = spec
        .with_threads(args.threads)
        .with_context(|| format!("--threads {}", args.threads))?;
    if let Some(t) = args.time_limit {
        spec = spec.with_time_limit_s(t).context("--time-limit")?;
    }
    if args.no_multicast {
        spec = spec.with_multicast(false)?;
    }
    Ok(spec)
}

/// An application error, with the planner's list of missing boxes printed
/// first when no plan exists (exit 3) and a rejected plan's exit code.
pub(crate) fn failed(e: app::Error) -> anyhow::Error {
    if let Some(inf) = e.infeasible() {
        #[allow(clippy::print_stderr)]
        {
            eprint!("{}", inf.report());
        }
        return Exit::Infeasible(inf.to_string()).into();
    }
    match e {
        app::Error::Rejected { .. } | app::Error::PlanRejected { .. } => Exit::Rejected(e.to_string()).into(),
        e => e.into(),
    }
}

fn plan(args: PlanArgs) -> Result<()> {
    let spec = planner_spec(&args)?;
    let staging_budget = args
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
        if args.planner != "lp" || args.placement != "fixed" {
            bail!("--integral is its own planner: drop --planner and --placement");
        }
        let done = app::plan_integral(&IntegralRequest {
            problem,
            time_limit_s: args.time_limit.unwrap_or(10.0),
            threads: args.threads,
            staging_budget,
        })
        .map_err(failed)?;
        let (a, mip) = (&done.assessed, &done.mip);
        if let Some(path) = &args.out {
            write_atomic(path, a.plan.to_json().as_bytes())?;
        }
        if args.json {
            let mut v = serde_json::to_value(&a.report)?;
            v["mip"] = serde_json::json!({
                "status": render::mip_status(mip), "makespan_s": mip.makespan_s,
                "lower_bound_s": mip.lower_bound_s, "gap": mip.gap, "binaries": mip.binaries,
            });
            out(&format!("{v}\n"));
        } else {
            out(&render::plan_report(&a.report));
            out(&render::mip_line(mip));
        }
        if !a.report.verified {
            return Err(Exit::Rejected(format!("the MIP produced a plan that {}", a.report.verdict)).into());
        }
        return Ok(());
    }
    let mut a = app::plan(&PlanRequest {
        problem,
        planner: spec,
        staging_budget,
    })
    .map_err(failed)?;
    a.report.peak_memory_bytes = peak_resident_bytes();
    if let Some(path) = &args.out {
        write_atomic(path, a.plan.to_json().as_bytes())?;
    }
    print_report(&a, args.json)?;
    a.verified().map_err(failed)?;
    Ok(())
}

fn print_report(a: &Assessed, json: bool) -> Result<()> {
    if json {
        out(&format!("{}\n", serde_json::to_string(&a.report)?));
    } else {
        out(&render::plan_report(&a.report));
    }
    Ok(())
}

fn dataset_state(spec: &str) -> Result<DatasetState> {
    let path = Path::new(spec);
    if path.exists() || !spec.contains('=') {
        let text = app::read_input(path)?;
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
    let layout: tenplan::models::ParallelConfig = args.layout.parse()?;
    let dp = layout.dp as u64;
    let share = state.share(dp, args.rank)?;
    let micro = args.micro_batch.unwrap_or(share.1 - share.0);
    let batches = state.micro_batches(dp, args.rank, micro, args.steps)?;
    if args.json {
        out(&format!("{}\n", serde_json::to_string(&batches)?));
    } else {
        out(&render::data_table(&state, dp, args.rank, share, &batches));
    }
    Ok(())
}
