//! `tenplan-bench bound-gap`: what a scheduler trades by asking for the
//! bound alone (`tenplan.cost(..., bound_only=True)`) instead of a plan.
//!
//! For every scenario of the paper and large suites, and of the scale
//! suite at the GPU counts asked, the bound-only answer is computed here
//! (the problem reduced by its symmetry, its cuts and message bound) and
//! timed, and set beside `lp`'s simulated makespan and certified bound as
//! the suites' results files recorded them (`notebooks/bench.json`,
//! `notebooks/scale.json`; the planner has not changed since). The ratio
//! makespan / bound-only is how far the cheap answer lies below what the
//! best plan takes.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{json, Value};
use tenplan::application::bound_only;
use tenplan::application::units::seconds;
use tenplan::planner::Reduced;

use crate::scenarios::{self, Scenario};
use crate::{machine, out, write_atomic};

/// Arguments of `tenplan-bench bound-gap`.
#[derive(Args)]
pub struct BoundGapArgs {
    /// Results of the paper and large suites (`make bench`).
    #[arg(long, default_value = "notebooks/bench.json")]
    suites: PathBuf,
    /// Results of the scale suite (`make bench-scale`).
    #[arg(long, default_value = "notebooks/scale.json")]
    scale: PathBuf,
    /// Scale suite GPU counts to answer (each a layout pair of that size
    /// built here).
    #[arg(long, value_delimiter = ',', default_value = "1024,4096,16384")]
    gpus: Vec<u32>,
    /// Leave the scale suite out.
    #[arg(long)]
    no_scale: bool,
    /// Write the rows here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One scenario: the bound-only answer beside lp's results.
struct Row {
    suite: String,
    scenario: String,
    gpus: u32,
    bound_s: f64,
    answer_ms: f64,
    stacks: usize,
    tensors: usize,
    lp_makespan_s: f64,
    lp_bound_s: f64,
}

fn read(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not a results file", path.display()))
}

/// The bound-only answer for a scenario, timed from its built problem
/// (classes, reduction, fragments, cuts): a scheduler keeps the classes
/// with the layouts, so this is an upper bound on its time.
fn answer(sc: &Scenario) -> Result<(f64, f64, usize, usize)> {
    let problem = sc.problem().with_context(|| sc.name.clone())?;
    let start = Instant::now();
    let reduced = Reduced::new(&problem)?;
    let b = bound_only(&problem, reduced.as_ref())?;
    let took = start.elapsed().as_secs_f64();
    let stacks = reduced
        .as_ref()
        .map_or(problem.tensors().len(), |r| r.problem().tensors().len());
    Ok((b.lower_bound_s, took * 1e3, stacks, problem.tensors().len()))
}

/// Run the comparison; print a table and write JSON when asked.
pub fn bound_gap(a: BoundGapArgs) -> Result<()> {
    let suites = read(&a.suites)?;
    let gpus = if a.no_scale { Vec::new() } else { a.gpus.clone() };
    let scale = if gpus.is_empty() { Vec::new() } else { read(&a.scale)? };
    let mut rows = Vec::new();
    for (suite, list) in [
        ("paper", scenarios::suite("paper")),
        ("large", scenarios::suite("large")),
    ] {
        for sc in list.context("a known suite")? {
            let Some(lp) = suites
                .iter()
                .find(|r| r["scenario"] == sc.name.as_str() && r["planner"] == "lp")
            else {
                continue;
            };
            let (bound_s, answer_ms, stacks, tensors) = answer(&sc)?;
            rows.push(Row {
                suite: suite.into(),
                scenario: sc.name.clone(),
                gpus: lp["gpus"].as_u64().unwrap_or(0) as u32,
                bound_s,
                answer_ms,
                stacks,
                tensors,
                lp_makespan_s: lp["makespan_s"].as_f64().unwrap_or(f64::NAN),
                lp_bound_s: lp["lower_bound_s"].as_f64().unwrap_or(f64::NAN),
            });
        }
    }
    for &g in &gpus {
        for fabric in crate::scale::FABRICS {
            for sc in scenarios::scale_on(g, fabric)? {
                let Some(lp) = scale.iter().find(|r| {
                    r["scenario"] == sc.name.as_str()
                        && r["planner"] == "lp"
                        && r["gpus"] == g
                        && r["fabric"] == *fabric
                        && r["status"] == "done"
                }) else {
                    continue;
                };
                let (bound_s, answer_ms, stacks, tensors) = answer(&sc)?;
                #[allow(clippy::print_stderr)]
                {
                    eprintln!("{g} GPUs ({fabric}) {}: {answer_ms:.0} ms", sc.name);
                }
                rows.push(Row {
                    suite: format!("scale {g} {fabric}"),
                    scenario: sc.name.clone(),
                    gpus: g,
                    bound_s,
                    answer_ms,
                    stacks,
                    tensors,
                    lp_makespan_s: lp["report"]["makespan_s"].as_f64().unwrap_or(f64::NAN),
                    lp_bound_s: lp["report"]["lower_bound_s"].as_f64().unwrap_or(f64::NAN),
                });
            }
        }
    }
    let mut text = String::from(
        "| suite | scenario | GPUs | tensors → stacks | bound-only | answered in | lp makespan | lp's bound | makespan / bound-only | lp's bound / bound-only |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &rows {
        text += &format!(
            "| {} | {} | {} | {} → {} | {} | {:.1} ms | {} | {} | {:.4} | {:.4} |\n",
            r.suite,
            r.scenario,
            r.gpus,
            r.tensors,
            r.stacks,
            seconds(r.bound_s),
            r.answer_ms,
            seconds(r.lp_makespan_s),
            seconds(r.lp_bound_s),
            r.lp_makespan_s / r.bound_s,
            r.lp_bound_s / r.bound_s,
        );
    }
    let mut suites_seen: Vec<&str> = Vec::new();
    for r in &rows {
        if !suites_seen.contains(&r.suite.as_str()) {
            suites_seen.push(&r.suite);
        }
    }
    text += "\n| suite | scenarios | makespan / bound-only: median | mean | max | lp's bound above bound-only |\n|---|---:|---:|---:|---:|---:|\n";
    for s in suites_seen {
        let mut ratios: Vec<f64> = rows
            .iter()
            .filter(|r| r.suite == s)
            .map(|r| r.lp_makespan_s / r.bound_s)
            .collect();
        ratios.sort_by(f64::total_cmp);
        let tighter = rows
            .iter()
            .filter(|r| r.suite == s && r.lp_bound_s > r.bound_s * (1.0 + 1e-3))
            .count();
        text += &format!(
            "| {s} | {} | {:.4} | {:.4} | {:.4} | {tighter} |\n",
            ratios.len(),
            ratios[ratios.len() / 2],
            ratios.iter().sum::<f64>() / ratios.len() as f64,
            ratios[ratios.len() - 1],
        );
    }
    text += &format!("\n{}\n", machine());
    out(&text);
    if let Some(path) = &a.json {
        let doc: Vec<Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "suite": r.suite, "scenario": r.scenario, "gpus": r.gpus,
                    "tensors": r.tensors, "stacks": r.stacks,
                    "bound_only_s": r.bound_s, "answer_ms": r.answer_ms,
                    "lp_makespan_s": r.lp_makespan_s, "lp_lower_bound_s": r.lp_bound_s,
                    "machine": machine(),
                })
            })
            .collect();
        write_atomic(path, serde_json::to_string_pretty(&doc)?.as_bytes())?;
    }
    Ok(())
}
