//! `tenplan-bench`: tenplan's benchmarks, out of the product. Each writes
//! a table (and JSON when asked) and records the machine that produced it.
//!
//! - `demo`: the Tenplex paper's scenarios with every planner (`make demo`);
//! - `suite --suite paper|large|rl|all|scale`: plan quality against the
//!   certified bound and the published policies (`make bench`, `make
//!   bench-rl`, `make bench-scale`);
//! - `switch`: hot switching's per-step cost (`make bench`);
//! - `executor`: the executor's throughput against memcpy, the disk and
//!   PyTorch DCP (`make bench-executor`);
//! - `bound-gap`: the scheduler's bound-only answer against `lp`'s
//!   makespan over the paper, large and scale suites (`make bench-python`);
//! - `mesh-scale`: a torchtitan MoE job's whole state on expert-parallel
//!   DTensor meshes, scaled up to thousands of ranks (`make bench-mesh`);
//! - `digests`: a digest of every suite plan, to show that a change of the
//!   code changed no plan.

mod bound_gap;
mod digests;
mod executor;
mod mesh_scale;
mod scale;
mod scenarios;
mod suite;
mod switch;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "tenplan-bench", version, about = "tenplan's benchmarks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the Tenplex paper's scenarios with every planner and print one table.
    Demo {
        /// Print one JSON object per (scenario, planner) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Plan-quality benchmark: every planner on every scenario of a suite,
    /// simulated and compared with the lower bound and with tenplex.
    Suite(suite::SuiteArgs),
    /// The hotspa suite: per-step switching time of lp and the hotspa baseline.
    Switch(switch::BenchSwitchArgs),
    /// Executor benchmark: host executor vs memcpy, checkpoint reshard vs PyTorch DCP and vs the disk.
    Executor(executor::BenchExecutorArgs),
    /// The scheduler's bound-only answer against lp's simulated makespan
    /// and certified bound over the paper, large and scale suites.
    BoundGap(bound_gap::BoundGapArgs),
    /// A torchtitan MoE job's whole state (grouped experts, AdamW) scaled
    /// up on DTensor meshes with expert parallelism, to thousands of ranks.
    MeshScale(mesh_scale::MeshScaleArgs),
    /// A digest of every plan of a suite (scenario, planner, plan bytes,
    /// xxh3-128 of the plan file): two builds that print the same digests
    /// make the same plans, byte for byte.
    Digests {
        /// Suite: paper, large, rl, all, or scale (each row a `tenplan plan`
        /// process of the binary `TENPLAN_BIN` names, default the one beside
        /// this one).
        #[arg(long, default_value = "paper")]
        suite: String,
        /// Scale suite: GPU counts (comma-separated multiples of 1024).
        #[arg(long, value_delimiter = ',', default_value = "1024")]
        gpus: Vec<u32>,
        /// Scale suite: clusters (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "dgx-h100,dgx-h100-rail-2to1")]
        fabrics: Vec<String>,
        /// Scale suite: planners (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "lp")]
        planners: Vec<String>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("error: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Demo { json } => suite::demo(json),
        Command::Suite(args) => suite::suite(args),
        Command::Switch(args) => switch::bench_switch(args),
        Command::Executor(args) => executor::bench_executor(args),
        Command::BoundGap(args) => bound_gap::bound_gap(args),
        Command::MeshScale(args) => mesh_scale::mesh_scale(args),
        Command::Digests {
            suite,
            gpus,
            fabrics,
            planners,
        } if suite == "scale" => digests::scale_digests(&gpus, &fabrics, &planners),
        Command::Digests { suite, .. } => digests::digests(&suite),
    }
}

#[allow(clippy::print_stdout)]
pub(crate) fn out(s: &str) {
    print!("{s}");
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

/// Write a file atomically (see [`tenplan::formats::write_file`]).
pub(crate) fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    Ok(tenplan::formats::write_file(path, data)?)
}

/// The `tenplan` binary the scale suite runs: `$TENPLAN_BIN`, or the one
/// built beside this benchmark.
pub(crate) fn tenplan_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("TENPLAN_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("cannot find the tenplan-bench executable")?;
    let bin = exe.with_file_name("tenplan");
    if !bin.is_file() {
        anyhow::bail!(
            "no tenplan binary beside {} (build it: cargo build --release --bin tenplan), or set TENPLAN_BIN",
            exe.display()
        );
    }
    Ok(bin)
}
