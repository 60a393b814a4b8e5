//! The plan-quality suites: every planner on every scenario, each plan
//! checked, simulated and compared with the certified bound, with
//! tenplex, and (weight syncs) with checkpoint-engine's broadcast.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use tenplan::application::units::{bytes, seconds};
use tenplan::application::{assess, Bound, PlanReport};
use tenplan::planner::{planner, PlannerSpec, PLANNERS, SYNC_COMPARED};

use crate::{machine, out, scale, scenarios, write_atomic};

#[derive(Args)]
pub struct SuiteArgs {
    /// Suite: paper (Tenplex paper, 16 GPUs), large (DGX-H100 nodes, up to 1024 GPUs), rl (weight
    /// syncs from trainers to inference engines, up to 768 GPUs), m2n (NCCL M2N's published
    /// weight syncs on GB200 racks, with their times; `lp` does not finish DeepSeek-V3's
    /// in 15 minutes here), all (paper and large), or
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
    /// Run only the scenarios whose name contains one of these
    /// (comma-separated; default all).
    #[arg(long, value_delimiter = ',')]
    scenarios: Option<Vec<String>>,
}

/// `tenplan-bench suite`.
pub fn suite(a: SuiteArgs) -> Result<()> {
    if a.suite == "scale" {
        if a.scenarios.is_some() {
            bail!("--scenarios is not an option of the scale suite");
        }
        let gpus = a.gpus.unwrap_or_else(|| vec![1024, 4096, 16384]);
        let fabrics = a
            .fabrics
            .unwrap_or_else(|| vec!["dgx-h100".into(), "dgx-h100-rail-2to1".into()]);
        return scale::bench(
            &gpus,
            &fabrics,
            a.planners,
            a.timeout.unwrap_or(600.0),
            a.json.as_deref(),
        );
    }
    if a.gpus.is_some() || a.timeout.is_some() || a.fabrics.is_some() {
        bail!(
            "--gpus, --timeout and --fabrics are options of the scale suite, not of `{}`",
            a.suite
        );
    }
    bench(&a.suite, a.json.as_deref(), a.planners, a.scenarios)
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

/// Run planners on scenarios: every plan checked, bounded and simulated
/// through the application's one path (one bound per scenario).
fn run_suite(suite: &[scenarios::Scenario], planners: &[String], progress: bool) -> Result<Vec<Row>> {
    let specs = planners
        .iter()
        .map(|p| p.parse::<PlannerSpec>())
        .collect::<Result<Vec<_>, _>>()?;
    let mut rows = Vec::new();
    for (i, sc) in suite.iter().enumerate() {
        let problem = sc.problem().with_context(|| sc.name.clone())?;
        if progress {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("[{}/{}] {} with {}", i + 1, suite.len(), sc.name, planners.join(", "));
            }
        }
        let assessed = assess(&problem, &specs, Bound::Shared).with_context(|| sc.name.clone())?;
        let reports: Vec<PlanReport> = assessed
            .into_iter()
            .map(|a| a.verified().map(|a| a.report))
            .collect::<Result<_, _>>()
            .with_context(|| sc.name.clone())?;
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

/// Scenarios with a published time: each planner's simulated makespan and
/// the certified bound against it (empty when none has one).
fn published_table(rows: &[Row], planners: &[String]) -> String {
    let mut t = String::new();
    let mut seen: Vec<&str> = Vec::new();
    for r in rows {
        let Some((time, source)) = scenarios::published(&r.scenario) else {
            continue;
        };
        if seen.contains(&r.scenario.as_str()) {
            continue;
        }
        seen.push(&r.scenario);
        if t.is_empty() {
            t = String::from("\n| scenario | published | lower bound | bound vs published |");
            for p in planners {
                t += &format!(" {p} |");
            }
            t += "\n|---|---|---:|---:|";
            t += &"---:|".repeat(planners.len());
            t += "\n";
        }
        t += &format!(
            "| {} | {} ({source}) | {} | {:.2}x faster |",
            r.scenario,
            seconds(time),
            seconds(r.report.lower_bound_s),
            time / r.report.lower_bound_s
        );
        for p in planners {
            match rows.iter().find(|x| x.scenario == r.scenario && &x.report.planner == p) {
                Some(x) => {
                    t += &format!(
                        " {} ({:.2}x) |",
                        seconds(x.report.makespan_s),
                        time / x.report.makespan_s
                    )
                }
                None => t += " — |",
            }
        }
        t += "\n";
    }
    t
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

pub fn demo(json: bool) -> Result<()> {
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

fn bench(suite: &str, json: Option<&Path>, planners: Option<Vec<String>>, only: Option<Vec<String>>) -> Result<()> {
    let mut scenarios = scenarios::suite(suite)
        .with_context(|| format!("unknown suite `{suite}` (expected paper, large, rl, m2n, all or scale)"))?;
    if let Some(only) = only {
        scenarios.retain(|sc| only.iter().any(|o| sc.name.contains(o.as_str())));
        if scenarios.is_empty() {
            bail!("no scenario of `{suite}` matches --scenarios {}", only.join(","));
        }
    }
    // Weight syncs are compared with the published sync policies too.
    let planners = match (planners, suite) {
        (None, "rl" | "m2n") => SYNC_COMPARED.iter().map(|s| s.to_string()).collect(),
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
    text += &published_table(&rows, &planners);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The paper suite's table as the README shows it (planning times,
    /// which vary from run to run, set to zero): every number in it comes
    /// from the plans, so a change of any plan shows up here.
    #[test]
    fn the_paper_suite_table() {
        let planners: Vec<String> = ["lp", "tenplex", "hotspa"].iter().map(|s| s.to_string()).collect();
        let mut rows = run_suite(&scenarios::paper(), &planners, false).unwrap();
        for r in &mut rows {
            r.report.planning_time_s = 0.0;
        }
        insta::assert_snapshot!(table(&rows));
    }
}
