//! `tenplan switch` and `tenplan bench-switch`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use tenplan::models::resolve;
use tenplan::ptc::Cluster;
use tenplan::report::{bytes, seconds};
use tenplan::switch::{schedule, Schedule, SwitchCache, SwitchKey, SwitchRequest, SwitchState};

use crate::out;

/// HotSPa's step times for LLaMA-2-7B on 8 GPUs (Table 1 of the paper),
/// depending on sequence length and TP: the scale of a step's switching
/// overhead.
const HOTSPA_STEP_S: (f64, f64) = (13.9, 30.8);

#[derive(Args)]
pub struct SwitchArgs {
    /// Model name (see `tenplan models`).
    #[arg(long)]
    model: String,
    /// Cluster: NODESxGPUS or a preset (dgx-h100, dgx-h100:NODES, ...).
    #[arg(long, default_value = "dgx-h100")]
    cluster: String,
    /// Strategies, the base (where the optimizer state lives) first.
    #[arg(long, num_args = 2.., required = true)]
    configs: Vec<String>,
    /// What moves at each switch: params, or params+grads.
    #[arg(long, default_value = "params")]
    state: String,
    /// Planner for every switch.
    #[arg(long, default_value = "lp")]
    planner: String,
    /// Bytes a device may hold while two layouts coexist (e.g. 80GB, 64GiB).
    #[arg(long)]
    memory_budget: Option<String>,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

/// `80GB`, `64GiB`, `1e9` or a plain byte count.
pub fn parse_bytes(s: &str) -> Result<u64> {
    Ok(tenplan::ptc::limits::parse_bytes(s)?)
}

#[derive(Serialize)]
struct SwitchOutput<'a> {
    model: &'a str,
    cluster: &'a str,
    state: &'a str,
    planner: &'a str,
    #[serde(flatten)]
    schedule: &'a Schedule,
    /// Per-step switching time over HotSPa's step times (LLaMA-2-7B, 8 GPUs).
    overhead_vs_hotspa_step: (f64, f64),
    /// Median time to fetch a cached switch plan.
    cached_lookup_ns: f64,
    planning_time_s: f64,
}

/// The cache key of a schedule's first switch.
fn first_key(req: &SwitchRequest, sched: &Schedule) -> SwitchKey {
    let first = &sched.switches[0];
    SwitchKey {
        model: req.model.clone(),
        cluster: req.cluster_name.clone(),
        state: req.state,
        planner: req.planner.clone(),
        from: first.from.clone(),
        to: first.to.clone(),
    }
}

/// Median time of a cache hit, in nanoseconds (over 100,000 lookups).
fn cached_lookup_ns(cache: &SwitchCache, key: &SwitchKey) -> f64 {
    let mut samples = Vec::with_capacity(100);
    for _ in 0..100 {
        let t = Instant::now();
        for _ in 0..1000 {
            std::hint::black_box(cache.get(std::hint::black_box(key)));
        }
        samples.push(t.elapsed().as_secs_f64() * 1e9 / 1000.0);
    }
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn request(
    model: &str,
    cluster: &str,
    configs: &[String],
    state: &str,
    planner: &str,
    budget: Option<u64>,
) -> Result<SwitchRequest> {
    Ok(SwitchRequest {
        model: resolve(model)?,
        cluster_name: cluster.into(),
        cluster: Cluster::open(cluster)?,
        configs: configs.to_vec(),
        state: SwitchState::parse(state)
            .with_context(|| format!("unknown state `{state}` (expected params or params+grads)"))?,
        planner: planner.into(),
        memory_budget: budget,
    })
}

pub fn switch(a: SwitchArgs) -> Result<()> {
    let budget = a.memory_budget.as_deref().map(parse_bytes).transpose()?;
    let req = request(&a.model, &a.cluster, &a.configs, &a.state, &a.planner, budget)?;
    let cache = SwitchCache::new();
    let start = Instant::now();
    let sched = schedule(&req, &cache)?;
    let planning_time_s = start.elapsed().as_secs_f64();
    let lookup = cached_lookup_ns(&cache, &first_key(&req, &sched));
    let o = SwitchOutput {
        model: &req.model.name,
        cluster: &a.cluster,
        state: req.state.as_str(),
        planner: &a.planner,
        schedule: &sched,
        overhead_vs_hotspa_step: (sched.total_s / HOTSPA_STEP_S.0, sched.total_s / HOTSPA_STEP_S.1),
        cached_lookup_ns: lookup,
        planning_time_s,
    };
    if a.json {
        out(&format!("{}\n", serde_json::to_string(&o)?));
        return Ok(());
    }
    let mut t = format!(
        "{} on {}, moving {} with {}: best order {}\n\n",
        o.model,
        o.cluster,
        o.state,
        o.planner,
        sched.order.join(" → ")
    );
    t += "| from | to | makespan | lower bound | makespan / bound | moved | cross-node | peak device memory |\n";
    t += "|---|---|---:|---:|---:|---:|---:|---:|\n";
    for s in &sched.switches {
        t += &format!(
            "| {} | {} | {} | {} | {:.3} | {} | {} | {} (device {}) |\n",
            s.from,
            s.to,
            seconds(s.makespan_s),
            seconds(s.lower_bound_s),
            s.makespan_s / s.lower_bound_s,
            bytes(s.bytes_moved),
            bytes(s.bytes_cross_node),
            bytes(s.peak_device_bytes),
            s.peak_device
        );
    }
    t += &format!(
        "\nper step: {} switching ({} bound), {} moved, peak {} per device\n",
        seconds(sched.total_s),
        seconds(sched.total_bound_s),
        bytes(sched.bytes_moved),
        bytes(sched.peak_device_bytes)
    );
    t += &format!(
        "overhead: {:.2}%–{:.2}% of a {}–{} s HotSPa step (LLaMA-2-7B, 8 GPUs, Table 1)\n",
        100.0 * o.overhead_vs_hotspa_step.1,
        100.0 * o.overhead_vs_hotspa_step.0,
        HOTSPA_STEP_S.0,
        HOTSPA_STEP_S.1
    );
    t += &format!(
        "planned {} switches in {:.2} s; a cached switch is returned in {:.0} ns\n",
        cache.len(),
        planning_time_s,
        lookup
    );
    out(&t);
    Ok(())
}

#[derive(Args)]
pub struct BenchSwitchArgs {
    /// Write the results here as JSON (one object per model, cluster, state and planner).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Planners to compare.
    #[arg(long, value_delimiter = ',', default_value = "lp,hotspa")]
    planners: Vec<String>,
    /// Models.
    #[arg(long, value_delimiter = ',', default_value = "llama2-7b,llama2-13b")]
    models: Vec<String>,
}

#[derive(Serialize)]
struct BenchRow {
    model: String,
    cluster: String,
    gpus: u32,
    state: String,
    planner: String,
    order: Vec<String>,
    total_s: f64,
    total_bound_s: f64,
    bytes_moved: u64,
    peak_device_bytes: u64,
    worst_switch_ratio: f64,
    overhead_vs_hotspa_step: (f64, f64),
    cached_lookup_ns: f64,
    planning_time_s: f64,
    switches: Vec<serde_json::Value>,
}

/// The `hotspa` suite: LLaMA-2 7B and 13B on one and two DGX-H100 nodes,
/// strategies TP ∈ {1, 2, 4, 8} with DP = GPUs / TP, params and params+grads.
pub fn bench_switch(a: BenchSwitchArgs) -> Result<()> {
    let mut rows = Vec::new();
    for model in &a.models {
        for nodes in [1u32, 2] {
            let cluster = format!("dgx-h100:{nodes}");
            let gpus = 8 * nodes;
            let configs: Vec<String> = [1u32, 2, 4, 8]
                .iter()
                .map(|tp| format!("tp={tp},dp={}", gpus / tp))
                .collect();
            for state in ["params", "params+grads"] {
                for planner in &a.planners {
                    let req = request(model, &cluster, &configs, state, planner, None)?;
                    let cache = SwitchCache::new();
                    let start = Instant::now();
                    let sched = schedule(&req, &cache)?;
                    let planning_time_s = start.elapsed().as_secs_f64();
                    let key = first_key(&req, &sched);
                    rows.push(BenchRow {
                        model: model.clone(),
                        cluster: cluster.clone(),
                        gpus,
                        state: state.into(),
                        planner: planner.clone(),
                        order: sched.order.clone(),
                        total_s: sched.total_s,
                        total_bound_s: sched.total_bound_s,
                        bytes_moved: sched.bytes_moved,
                        peak_device_bytes: sched.peak_device_bytes,
                        worst_switch_ratio: sched
                            .switches
                            .iter()
                            .map(|s| s.makespan_s / s.lower_bound_s)
                            .fold(0.0, f64::max),
                        overhead_vs_hotspa_step: (sched.total_s / HOTSPA_STEP_S.0, sched.total_s / HOTSPA_STEP_S.1),
                        cached_lookup_ns: cached_lookup_ns(&cache, &key),
                        planning_time_s,
                        switches: sched
                            .switches
                            .iter()
                            .map(|s| serde_json::to_value(&**s))
                            .collect::<Result<_, _>>()?,
                    });
                }
            }
        }
    }
    let mut t = String::from(
        "| model | GPUs | state | planner | best order | switching per step | bound | worst switch / bound | vs lp | overhead of a 13.9–30.8 s step | cached lookup |\n",
    );
    t += "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|\n";
    for r in &rows {
        let lp = rows
            .iter()
            .find(|x| x.model == r.model && x.cluster == r.cluster && x.state == r.state && x.planner == "lp")
            .map_or(f64::NAN, |x| r.total_s / x.total_s);
        t += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.3} | {:.3}× | {:.2}%–{:.2}% | {:.0} ns |\n",
            r.model,
            r.gpus,
            r.state,
            r.planner,
            r.order.join(" → "),
            seconds(r.total_s),
            seconds(r.total_bound_s),
            r.worst_switch_ratio,
            lp,
            100.0 * r.overhead_vs_hotspa_step.1,
            100.0 * r.overhead_vs_hotspa_step.0,
            r.cached_lookup_ns
        );
    }
    out(&t);
    if let Some(path) = &a.json {
        crate::write_atomic(path, serde_json::to_string_pretty(&rows)?.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("80GB").unwrap(), 80_000_000_000);
        assert_eq!(parse_bytes("64GiB").unwrap(), 64 << 30);
        assert_eq!(parse_bytes("1e9").unwrap(), 1_000_000_000);
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("-1GB").is_err());
    }
}
