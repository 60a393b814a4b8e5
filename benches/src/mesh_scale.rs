//! `tenplan-bench mesh-scale`: a torchtitan MoE training job's whole state
//! on DTensor meshes with expert parallelism, resharded at the scale such
//! jobs run (up to thousands of ranks).
//!
//! The state is what torchtitan's checkpoint of a catalog MoE model holds:
//! every weight under torchtitan's names, each MoE layer's routed experts
//! in its three grouped stacks (`moe.routed_experts.inner_experts.w1_EFD`,
//! ...), and AdamW's `exp_avg`, `exp_avg_sq` (fp32, like their parameter)
//! and `step` (a scalar on every rank) for each parameter; the routing
//! biases are buffers, whole on every rank. The move is an elastic
//! scale-up: `dp_shard=N/2,ep=E` on N/2 GPUs to `dp_shard=N,ep=E` on N
//! (DGX-H100 nodes). Each row records how big the two layouts are
//! (buffers), how long building them, planning (`lp`), checking the plan
//! with the independent checker and simulating it took, and the plan's
//! simulated makespan against its certified bound.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use tenplan::application::units::{bytes, seconds};
use tenplan::application::{default_cluster, evaluate, Bound};
use tenplan::formats::hf_export::plan_dcp_tensors;
use tenplan::formats::torchtitan::{titan_buffers, titan_expert, titan_names};
use tenplan::models::{is_unsharded_buffer, resolve, MeshConfig, ModelSpec, ModelState, StateKind, TensorPlacement};
use tenplan::planner::PlannerSpec;
use tenplan::ptc::{DType, Layout, Problem, TensorSpec};

use crate::{machine, out, write_atomic};

/// Arguments of `tenplan-bench mesh-scale`.
#[derive(Args)]
pub struct MeshScaleArgs {
    /// The catalog MoE model whose torchtitan state moves.
    #[arg(long, default_value = "deepseek-v3")]
    model: String,
    /// Target GPU counts (the source has half as many).
    #[arg(long, value_delimiter = ',', default_value = "256,1024,4096")]
    gpus: Vec<u32>,
    /// Expert parallelism on both sides (at most the source's ranks).
    #[arg(long, default_value_t = 64)]
    ep: u32,
    /// Weights only, without AdamW's state.
    #[arg(long)]
    weights_only: bool,
    /// The planner.
    #[arg(long, default_value = "lp")]
    planner: String,
    /// Write the rows here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One scale-up.
#[derive(Serialize)]
struct Row {
    model: String,
    from: String,
    to: String,
    gpus: u32,
    tensors: usize,
    state_bytes: u64,
    source_buffers: usize,
    target_buffers: usize,
    layouts_s: f64,
    planning_s: f64,
    check_and_simulate_s: f64,
    copies: usize,
    makespan_s: f64,
    lower_bound_s: f64,
    gap: f64,
    bottleneck: String,
    verified: bool,
    peak_rss_bytes: u64,
}

/// The state torchtitan's checkpoint of `model` holds, with each tensor's
/// placement on a mesh (experts stacked; scalars whole on every rank).
fn titan_state(model: &ModelSpec, adam: bool) -> Result<(Vec<TensorSpec>, Vec<TensorPlacement>)> {
    let weights = ModelState::new(model, StateKind::Weights(DType::BF16));
    let (plans, _) = plan_dcp_tensors(model, weights.tensors())?;
    let mut params: Vec<(String, Vec<u64>, bool)> = Vec::new();
    for h in &plans {
        match titan_expert(model, &h.name) {
            Some((stack, 0)) => {
                let shape = std::iter::once(u64::from(model.experts)).chain(h.shape.iter().copied());
                params.push((stack, shape.collect(), true));
            }
            Some(_) => {}
            None => {
                let name = titan_names(model, &h.name)
                    .into_iter()
                    .next()
                    .with_context(|| format!("{}: torchtitan has no name for {}", model.name, h.name))?;
                params.push((name, h.shape.clone(), false));
            }
        }
    }
    let buffers = titan_buffers(model).into_iter().map(|(n, s)| (n, s, false));
    let mut tensors = Vec::new();
    let mut placed = Vec::new();
    let mut add = |name: String, dtype: DType, shape: Vec<u64>, experts: bool, fsdp: bool| {
        tensors.push(TensorSpec::new(name, dtype, shape));
        placed.push(TensorPlacement {
            tp_dim: None,
            fsdp,
            fsdp_dim: None,
            experts,
            stack: None,
        });
    };
    let params: Vec<_> = params.into_iter().chain(buffers).collect();
    for (name, shape, experts) in &params {
        add(
            name.clone(),
            DType::F32,
            shape.clone(),
            *experts,
            !is_unsharded_buffer(name),
        );
    }
    if adam {
        for (name, shape, experts) in params.iter().filter(|(n, _, _)| !is_unsharded_buffer(n)) {
            for moment in ["exp_avg", "exp_avg_sq"] {
                add(
                    format!("optimizer.state.{name}.{moment}"),
                    DType::F32,
                    shape.clone(),
                    *experts,
                    true,
                );
            }
            add(
                format!("optimizer.state.{name}.step"),
                DType::F32,
                vec![1],
                false,
                false,
            );
        }
    }
    Ok((tensors, placed))
}

/// Scale `tensors` (placed as `placed` says) up from `dp_shard=gpus/2` to
/// `dp_shard=gpus`, both with `ep`: planned, checked and simulated.
fn scale_up(
    model: &ModelSpec,
    tensors: &Arc<[TensorSpec]>,
    placed: &[TensorPlacement],
    gpus: u32,
    ep: u32,
    planner: &PlannerSpec,
) -> Result<Row> {
    anyhow::ensure!(
        gpus >= 2 && gpus.is_multiple_of(2),
        "--gpus {gpus}: an even count of at least 2"
    );
    let from: MeshConfig = format!("dp_shard={},ep={ep}", gpus / 2).parse()?;
    let to: MeshConfig = format!("dp_shard={gpus},ep={ep}").parse()?;
    let start = Instant::now();
    let place = |t: u32, _: &TensorSpec| Ok(placed[t as usize]);
    let source: Layout = from.layout(tensors.clone(), &place)?;
    let target: Layout = to.layout(tensors.clone(), &place)?;
    let layouts_s = start.elapsed().as_secs_f64();
    let buffers = |l: &Layout| l.shards().iter().map(|s| s.buffers.len()).sum::<usize>();
    let (source_buffers, target_buffers) = (buffers(&source), buffers(&target));
    let problem = Problem::new(source, target, default_cluster(gpus)?)?;
    let planned = tenplan::application::assess::plan(&problem, planner)?;
    let planning_s = planned.planning_time_s;
    let t = Instant::now();
    let r = evaluate(&problem, vec![planned], Bound::Shared)
        .pop()
        .context("one plan in, one out")?
        .report;
    Ok(Row {
        model: model.name.to_string(),
        from: from.to_string(),
        to: to.to_string(),
        gpus,
        tensors: tensors.len(),
        state_bytes: tensors.iter().map(TensorSpec::bytes).sum(),
        source_buffers,
        target_buffers,
        layouts_s,
        planning_s,
        check_and_simulate_s: t.elapsed().as_secs_f64(),
        copies: r.copies,
        makespan_s: r.makespan_s,
        lower_bound_s: r.lower_bound_s,
        gap: r.gap,
        bottleneck: r.bottleneck,
        verified: r.verified,
        peak_rss_bytes: peak_rss(),
    })
}

/// The peak resident memory of this process so far (Linux `VmHWM`).
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Run the scale-ups and print their table.
pub fn mesh_scale(a: MeshScaleArgs) -> Result<()> {
    let model = resolve(&a.model)?;
    anyhow::ensure!(
        model.experts > 0,
        "{} has no experts: mesh-scale moves a MoE state",
        model.name
    );
    let (tensors, placed) = titan_state(&model, !a.weights_only)?;
    let tensors: Arc<[TensorSpec]> = tensors.into();
    let state_bytes: u64 = tensors.iter().map(TensorSpec::bytes).sum();
    let planner: PlannerSpec = a.planner.parse()?;
    let mut rows = Vec::new();
    out(&format!(
        "{}: {} tensors ({}) as torchtitan saves them{}; {} planner; {}\n\n\
         | GPUs | from | to | buffers (source / target) | layouts | plan | check + simulate | copies | makespan | bound | gap | peak RSS |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
        model.name,
        tensors.len(),
        bytes(state_bytes),
        if a.weights_only { ", weights only" } else { " with AdamW's state" },
        a.planner,
        machine()
    ));
    for &gpus in &a.gpus {
        rows.push(scale_up(&model, &tensors, &placed, gpus, a.ep, &planner)?);
        out(&row_line(rows.last().expect("pushed")));
    }
    if let Some(path) = &a.json {
        let doc = serde_json::json!({
            "machine": machine(),
            "command": format!(
                "tenplan-bench mesh-scale --model {} --gpus {} --ep {}{} --planner {}",
                a.model,
                a.gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
                a.ep,
                if a.weights_only { " --weights-only" } else { "" },
                a.planner
            ),
            "rows": rows,
        });
        write_atomic(path, serde_json::to_string_pretty(&doc)?.as_bytes())?;
    }
    Ok(())
}

/// One row of the table, as it is measured.
fn row_line(r: &Row) -> String {
    format!(
        "| {} | {} | {} | {} / {} | {} | {} | {} | {} | {} | {} | {:.4}{} | {} |\n",
        r.gpus,
        r.from,
        r.to,
        r.source_buffers,
        r.target_buffers,
        seconds(r.layouts_s),
        seconds(r.planning_s),
        seconds(r.check_and_simulate_s),
        r.copies,
        seconds(r.makespan_s),
        seconds(r.lower_bound_s),
        r.gap,
        if r.verified { "" } else { " (REJECTED)" },
        bytes(r.peak_rss_bytes),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_is_torchtitans_and_scales_up_checked() {
        let model = resolve("qwen3-235b-a22b").unwrap();
        let (tensors, placed) = titan_state(&model, true).unwrap();
        // Three grouped stacks per MoE layer, each with its moments.
        let stacks: Vec<&TensorSpec> = tensors
            .iter()
            .zip(&placed)
            .filter(|(_, p)| p.experts)
            .map(|(t, _)| t)
            .collect();
        assert_eq!(stacks.len(), 3 * 3 * model.layers as usize);
        assert!(stacks.iter().all(|t| t.shape[0] == 128 && t.shape.len() == 3));
        assert!(tensors
            .iter()
            .any(|t| t.name == "layers.93.moe.routed_experts.inner_experts.w2_EDF"));
        // The routing bias is a buffer: no optimizer state, never sharded.
        assert!(!tensors.iter().any(|t| t.name.contains("expert_bias_E.")));
        assert!(
            !tensors.iter().any(|t| t.name.starts_with("model.")),
            "every name is torchtitan's"
        );
        // Scalars (steps) and buffers whole on every rank, everything else
        // sharded.
        assert!(tensors
            .iter()
            .zip(&placed)
            .all(|(t, p)| p.fsdp != (t.name.ends_with(".step") || t.name.ends_with("expert_bias_E"))));
        let tensors: Arc<[TensorSpec]> = tensors.into();
        let row = scale_up(&model, &tensors, &placed, 8, 4, &"lp".parse().unwrap()).unwrap();
        assert!(row.verified && row.gap < 0.01, "gap {}", row.gap);
        assert_eq!(row.target_buffers, 8 * tensors.len());
    }
}
