//! `tenplan-bench suite --suite scale`: the scale suite at 1k to 16k GPUs.
//!
//! Each (scenario, planner) runs as its own `tenplan plan --json` process,
//! so that its time is the whole command's (plan, check, bound, simulation,
//! output) and its memory is its own peak, not what earlier runs left
//! resident. A run past the time limit is stopped and reported as such.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use tenplan::application::units::{bytes, seconds};

use crate::scenarios::{self, Scenario};
use crate::suite::known_planners;
use crate::{machine, out, tenplan_bin, write_atomic};

/// The clusters the suite runs on: DGX-H100 nodes on a non-blocking
/// network, and on a rail-optimized fabric with its spine at 1:1 and 2:1.
pub const FABRICS: &[&str] = &["dgx-h100", "dgx-h100-rail", "dgx-h100-rail-2to1"];

/// How one (scenario, planner) run ended.
enum Outcome {
    /// The command's JSON report.
    Done(Value),
    TimedOut,
    Failed(String),
}

/// One row of the suite.
struct Row {
    gpus: u32,
    fabric: String,
    scenario: String,
    planner: String,
    command_s: f64,
    outcome: Outcome,
}

/// The `tenplan plan` arguments that pose a scenario.
pub(crate) fn plan_args(sc: &Scenario, planner: &str) -> Vec<String> {
    let mut args: Vec<String> = [
        "plan",
        "--model",
        sc.model,
        "--cluster",
        &sc.cluster,
        "--from",
        &sc.from.to_string(),
        "--to",
        &sc.to.to_string(),
        "--planner",
        planner,
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if !sc.dead.is_empty() {
        let dead: Vec<String> = sc.dead.iter().map(u32::to_string).collect();
        args.extend(["--dead".to_string(), dead.join(",")]);
    }
    args
}

/// Run one `tenplan plan` process, stopping it after `timeout`.
fn run_one(args: &[String], timeout: Duration) -> Result<(f64, Outcome)> {
    let exe = tenplan_bin()?;
    let start = Instant::now();
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start tenplan plan")?;
    // Drain both pipes on their own threads so a chatty child never blocks.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let stdout = drain(Box::new(child.stdout.take().context("no stdout")?));
    let stderr = drain(Box::new(child.stderr.take().context("no stderr")?));
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if start.elapsed() >= timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = start.elapsed().as_secs_f64();
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    let outcome = match status {
        None => Outcome::TimedOut,
        Some(s) if s.success() => match serde_json::from_str(stdout.trim()) {
            Ok(v) => Outcome::Done(v),
            Err(e) => Outcome::Failed(format!("unreadable report: {e}")),
        },
        Some(s) => {
            let why = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no message");
            Outcome::Failed(match s.code() {
                Some(code) => format!("exit {code}: {why}"),
                None => format!("killed by a signal ({s}; out of memory?)"),
            })
        }
    };
    Ok((took, outcome))
}

/// Run the scale suite and print its table; write the rows as JSON if asked.
pub fn bench(
    gpus: &[u32],
    fabrics: &[String],
    planners: Option<Vec<String>>,
    timeout: f64,
    json: Option<&Path>,
) -> Result<()> {
    if !(timeout.is_finite() && timeout > 0.0) {
        bail!("--timeout must be a positive number of seconds, not {timeout}");
    }
    let planners = known_planners(planners)?;
    let mut suite = Vec::new();
    for f in fabrics {
        if !FABRICS.contains(&f.as_str()) {
            bail!(
                "unknown fabric `{f}` for the scale suite (one of: {})",
                FABRICS.join(", ")
            );
        }
        for &g in gpus {
            suite.extend(scenarios::scale_on(g, f)?.into_iter().map(|sc| (g, f.clone(), sc)));
        }
    }
    let total = suite.len() * planners.len();
    let mut rows = Vec::new();
    for (g, fabric, sc) in &suite {
        for p in &planners {
            let (command_s, outcome) = run_one(&plan_args(sc, p), Duration::from_secs_f64(timeout))?;
            #[allow(clippy::print_stderr)]
            {
                let how = match &outcome {
                    Outcome::Done(_) => "done".to_string(),
                    Outcome::TimedOut => "timed out".to_string(),
                    Outcome::Failed(why) => format!("failed: {why}"),
                };
                eprintln!(
                    "[{}/{total}] {g} GPUs ({fabric}) {} with {p}: {how} in {command_s:.1} s",
                    rows.len() + 1,
                    sc.name
                );
            }
            rows.push(Row {
                gpus: *g,
                fabric: fabric.clone(),
                scenario: sc.name.clone(),
                planner: p.clone(),
                command_s,
                outcome,
            });
        }
    }
    let machine = machine();
    let mut text = table(&rows, timeout);
    text += &growth(&rows, &planners, fabrics, gpus);
    text += &format!("\nmachine: {machine}; LP solver: HiGHS (1 thread); time limit per run {timeout} s\n");
    out(&text);
    if let Some(path) = json {
        let all: Vec<Value> = rows.iter().map(|r| row_json(r, &machine)).collect();
        write_atomic(path, serde_json::to_string_pretty(&all)?.as_bytes())?;
    }
    Ok(())
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(f64::NAN)
}

fn table(rows: &[Row], timeout: f64) -> String {
    let mut s = String::from(
        "| GPUs | fabric | scenario | planner | makespan / bound | makespan | planning | command | peak memory | copies |\n|---:|---|---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let cells = match &r.outcome {
            Outcome::Done(v) => format!(
                "{:.4} | {} | {} | {} | {} | {}",
                num(v, "makespan_s") / num(v, "lower_bound_s"),
                seconds(num(v, "makespan_s")),
                seconds(num(v, "planning_time_s")),
                seconds(r.command_s),
                v["peak_memory_bytes"].as_u64().map_or("n/a".into(), bytes),
                v["copies"]
            ),
            Outcome::TimedOut => format!("- | - | - | > {timeout} s | - | -"),
            Outcome::Failed(why) => format!("failed: {why} | - | - | {} | - | -", seconds(r.command_s)),
        };
        s += &format!(
            "| {} | {} | {} | {} | {cells} |\n",
            r.gpus, r.fabric, r.scenario, r.planner
        );
    }
    s
}

/// Per planner and GPU count: the slowest command, the largest memory, the
/// worst makespan / bound, and how many runs did not finish.
fn growth(rows: &[Row], planners: &[String], fabrics: &[String], gpus: &[u32]) -> String {
    let mut s = String::from(
        "\n| planner | fabric | GPUs | slowest planning | slowest command | largest peak memory | worst makespan / bound | unfinished |\n|---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for p in planners {
        for (f, &g) in fabrics.iter().flat_map(|f| gpus.iter().map(move |g| (f, g))) {
            let mine: Vec<&Row> = rows
                .iter()
                .filter(|r| &r.planner == p && r.gpus == g && &r.fabric == f)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let done: Vec<&Value> = mine
                .iter()
                .filter_map(|r| match &r.outcome {
                    Outcome::Done(v) => Some(v),
                    _ => None,
                })
                .collect();
            let max = |f: &dyn Fn(&Value) -> f64| done.iter().map(|v| f(v)).fold(f64::NAN, f64::max);
            let command = mine
                .iter()
                .filter(|r| matches!(r.outcome, Outcome::Done(_)))
                .map(|r| r.command_s)
                .fold(f64::NAN, f64::max);
            let memory = done.iter().filter_map(|v| v["peak_memory_bytes"].as_u64()).max();
            let ratio = max(&|v| num(v, "makespan_s") / num(v, "lower_bound_s"));
            s += &format!(
                "| {p} | {f} | {g} | {} | {} | {} | {} | {} |\n",
                seconds(max(&|v| num(v, "planning_time_s"))),
                seconds(command),
                memory.map_or("n/a".into(), bytes),
                if ratio.is_nan() {
                    "n/a".into()
                } else {
                    format!("{ratio:.4}")
                },
                mine.len() - done.len()
            );
        }
    }
    s
}

fn row_json(r: &Row, machine: &str) -> Value {
    let mut v = json!({
        "suite": "scale",
        "gpus": r.gpus,
        "fabric": r.fabric,
        "scenario": r.scenario,
        "planner": r.planner,
        "command_s": r.command_s,
        "machine": machine,
    });
    match &r.outcome {
        Outcome::Done(report) => {
            v["status"] = "done".into();
            v["makespan_over_bound"] = (num(report, "makespan_s") / num(report, "lower_bound_s")).into();
            v["report"] = report.clone();
        }
        Outcome::TimedOut => v["status"] = "timed out".into(),
        Outcome::Failed(why) => {
            v["status"] = "failed".into();
            v["error"] = why.clone().into();
        }
    }
    v
}
