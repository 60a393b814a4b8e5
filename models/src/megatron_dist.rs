//! Megatron-Core's distributed checkpoints (`torch_dist`) under a parallel
//! configuration: the state as such a checkpoint holds it — each tensor
//! under its saved name, a transformer block's layers stacked on a leading
//! axis (and a MoE layer's local experts on a second), optimizer state
//! under `optimizer.state.<kind>.<parameter>` — placed on the ranks of
//! `tp, pp, dp` as Megatron-Core's modules place it: the layer axis split
//! evenly (or by `split=`) over pipeline stages, the embedding on the first
//! stage and the final norm and output layer on the last, column-parallel
//! weights split on their rows and row-parallel ones on their columns over
//! tensor parallelism, everything else whole (the copy saved is tensor-
//! parallel rank 0's); data-parallel replicas hold the same shard. Optimizer state is placed like its parameter.
//!
//! Each layer (and expert) of a stacked tensor is a buffer of its own, as
//! Megatron's modules hold and save them. Megatron's loader reads any
//! chunking of a global tensor, so the layout decides only which rank's
//! file holds which bytes; SwiGLU's `[W; V]` is split as one block of rows
//! per rank.
//!
//! ```
//! use tenplan_models::{torch_dist_layout, ParallelConfig};
//! use tenplan_ptc::{DType, TensorSpec};
//!
//! let tensors = vec![
//!     TensorSpec::new("embedding.word_embeddings.weight", DType::F32, [128, 32]),
//!     TensorSpec::new("decoder.layers.self_attention.linear_proj.weight", DType::F32, [4, 32, 32]),
//! ];
//! let cfg: ParallelConfig = "tp=2,pp=2".parse().unwrap();
//! let layout = torch_dist_layout(tensors.into(), &cfg).unwrap();
//! // The projection: 4 layers (2 per stage) x 2 tensor-parallel column blocks.
//! assert_eq!(layout.sub_tensors(1).len(), 8);
//! ```

use std::ops::Range;
use std::sync::Arc;

use tenplan_ptc::{Buffer, Layout, Region, Shard, TensorId, TensorSpec};

use crate::mesh::chunk;
use crate::{Error, ParallelConfig, Result};

/// Where Megatron-Core's pipeline places a saved tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Stacked layers: the leading axis is split over the stages.
    Layers,
    /// The first stage (the embedding, and entries of no layer).
    First,
    /// The last stage (the final norm, the output layer).
    Last,
    /// The stage of one layer of a block saved layer by layer (its global
    /// index in the name: `decoder.layers.3.…`).
    Layer(u64),
}

/// The parameter a saved tensor belongs to: its own name, or, for
/// optimizer state (`optimizer.state.exp_avg.<parameter>`), its
/// parameter's.
fn parameter_of(name: &str) -> &str {
    name.strip_prefix("optimizer.state.")
        .and_then(|rest| rest.split_once('.'))
        .map_or(name, |(_, param)| param)
}

/// How Megatron-Core's distributed optimizer saved its state, as the
/// saved names tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DistributedOptimizerFormat {
    /// Per parameter, in the parameter's shape
    /// (`optimizer.state.<kind>.<parameter>`): placed like the parameter
    /// under any configuration.
    FullyReshardable,
    /// Flat per-bucket buffers of one data-parallel group
    /// (`optimizer.distributed.dp_group_idx_<g>...`): their contents follow
    /// the parameter order of one tensor- and pipeline-parallel layout.
    DpReshardable,
}

impl DistributedOptimizerFormat {
    /// The format of the saved names `names`, if they hold optimizer state.
    pub fn of<'a>(names: impl Iterator<Item = &'a str>) -> Option<DistributedOptimizerFormat> {
        let mut found = None;
        for name in names {
            if name.starts_with(DP_RESHARDABLE_PREFIX) {
                return Some(DistributedOptimizerFormat::DpReshardable);
            }
            if name.starts_with("optimizer.state.") {
                found = Some(DistributedOptimizerFormat::FullyReshardable);
            }
        }
        found
    }

    /// Megatron's name of the format (`distrib_optim_sharding_type`).
    pub fn name(self) -> &'static str {
        match self {
            DistributedOptimizerFormat::FullyReshardable => "fully_reshardable",
            DistributedOptimizerFormat::DpReshardable => "dp_reshardable",
        }
    }
}

/// Where the `dp_reshardable` format keeps its buffers.
const DP_RESHARDABLE_PREFIX: &str = "optimizer.distributed.";

/// The number of stacked axes a saved tensor's name implies: the layer
/// axis of a transformer block's `layers`, and the expert axis of a MoE
/// layer's experts (saved as `experts.experts`).
fn stacked_axes(param: &str) -> usize {
    let parts: Vec<&str> = param.split('.').collect();
    parts
        .windows(2)
        .filter(|w| (w[0] == "layers" && w[1].parse::<u64>().is_err()) || (w[0] == "experts" && w[1] == "experts"))
        .count()
}

/// The dimension Megatron-Core's tensor parallelism splits a parameter on
/// (past its stacked axes), from the module that owns it: column-parallel
/// linear layers and the vocabulary split their rows, row-parallel ones
/// their columns; norms, routers and row-parallel biases are whole.
fn tensor_parallel_dim(param: &str) -> Option<usize> {
    const ROWS: [&str; 9] = [
        "eh_proj.weight",
        "linear_qkv.weight",
        "linear_qkv.bias",
        "linear_fc1.weight",
        "linear_fc1.bias",
        "linear_q_proj.weight",
        "linear_q_up_proj.weight",
        "linear_kv_up_proj.weight",
        "word_embeddings.weight",
    ];
    const COLUMNS: [&str; 2] = ["linear_proj.weight", "linear_fc2.weight"];
    if param == "output_layer.weight" || ROWS.iter().any(|s| param.ends_with(s)) {
        Some(0)
    } else if COLUMNS.iter().any(|s| param.ends_with(s)) {
        Some(1)
    } else {
        None
    }
}

/// Whether a saved tensor's name holds a MoE layer's experts stacked
/// (`experts.experts`).
fn has_experts(param: &str) -> bool {
    param.contains(".experts.experts.")
}

/// The layer a saved tensor belongs to where Megatron-Core saves its block
/// layer by layer (a block whose layers differ): `decoder.layers.3.…`.
fn named_layer(param: &str) -> Option<u64> {
    param.strip_prefix("decoder.layers.")?.split('.').next()?.parse().ok()
}

fn stage_of(param: &str, layer_axis: bool) -> Stage {
    if layer_axis {
        Stage::Layers
    } else if let Some(layer) = named_layer(param) {
        Stage::Layer(layer)
    } else if param.starts_with("output_layer.") || param.starts_with("mtp.") || param.contains("final_layernorm") {
        // Megatron-Core builds MTP modules on the last stage.
        Stage::Last
    } else {
        Stage::First
    }
}

/// The layer range of each pipeline stage: `cfg.split`, or an even split.
fn stage_layers(cfg: &ParallelConfig, layers: u64, tensor: &str) -> Result<Vec<Range<u64>>> {
    let bad = |why: String| Error::ParseLayout {
        input: cfg.to_string(),
        why,
    };
    match &cfg.split {
        Some(split) => {
            let total: u64 = split.iter().map(|&n| u64::from(n)).sum();
            if total != layers {
                return Err(bad(format!("split= places {total} layers, `{tensor}` stacks {layers}")));
            }
            let mut at = 0;
            Ok(split
                .iter()
                .map(|&n| {
                    let r = at..at + u64::from(n);
                    at = r.end;
                    r
                })
                .collect())
        }
        None if !layers.is_multiple_of(u64::from(cfg.pp)) => Err(bad(format!(
            "`{tensor}` stacks {layers} layers, which pp={} does not divide evenly (give split=)",
            cfg.pp
        ))),
        None => Ok((0..cfg.pp).map(|s| chunk(0..layers, cfg.pp, s)).collect()),
    }
}

/// Every index tuple of the ranges of a tensor's stacked axes, in
/// row-major order (one empty tuple for a tensor without them).
fn stacked_indices(ranges: &[Range<u64>]) -> Vec<Vec<u64>> {
    ranges.iter().fold(vec![Vec::new()], |tuples, r| {
        tuples
            .into_iter()
            .flat_map(|t| {
                r.clone().map(move |i| {
                    let mut t = t.clone();
                    t.push(i);
                    t
                })
            })
            .collect()
    })
}

/// The layout of a Megatron-Core `torch_dist` state (`tensors`, as the
/// checkpoint holds them) under `cfg` (see the module docs). Refuses
/// expert parallelism, a tensor a tensor-parallel split does not divide,
/// and layer counts the stages do not divide.
pub fn torch_dist_layout(tensors: Arc<[TensorSpec]>, cfg: &ParallelConfig) -> Result<Layout> {
    let devices = cfg.rank_devices()?;
    let ep = cfg.ep;
    if !cfg.dp.is_multiple_of(ep) {
        return Err(Error::EpDp { ep, dp: cfg.dp });
    }
    if let Some(t) = tensors.iter().find(|t| t.name.starts_with(DP_RESHARDABLE_PREFIX)) {
        return Err(Error::ParseLayout {
            input: cfg.to_string(),
            why: format!(
                "tensor `{}` is distributed-optimizer state saved dp_reshardable (flat buffers of the saving job's tensor- and pipeline-parallel layout, which Megatron reshards only over data parallelism); save it fully_reshardable (Megatron-LM: --dist-ckpt-optim-fully-reshardable; megatron-core: optimizer.sharded_state_dict(model_sd, metadata={{'distrib_optim_sharding_type': 'fully_reshardable'}})), or leave the optimizer out on purpose: --exclude optimizer",
                t.name
            ),
        });
    }
    let (tp, pp, dp) = (cfg.tp, cfg.pp, cfg.dp);
    // A block saved layer by layer: its layers' stages.
    let named = tensors
        .iter()
        .filter_map(|t| Some((named_layer(parameter_of(&t.name))?, &t.name)))
        .max();
    let named_stages = match named {
        Some((last, name)) => stage_layers(cfg, last + 1, name)?,
        None => Vec::new(),
    };
    // Per tensor: its stage rule, its stages' layer ranges, its tp
    // dimension, its stacked axes and its expert axis.
    let mut rules = Vec::with_capacity(tensors.len());
    for spec in tensors.iter() {
        let param = parameter_of(&spec.name);
        let stacked = stacked_axes(param).min(spec.shape.len().saturating_sub(1));
        let expert_axis = (has_experts(param) && stacked > 0).then(|| stacked - 1);
        let stage = stage_of(param, stacked > usize::from(expert_axis.is_some()));
        let layers = match stage {
            Stage::Layers => stage_layers(cfg, spec.shape[0], &spec.name)?,
            _ => Vec::new(),
        };
        let dim = tensor_parallel_dim(param)
            .map(|d| d + stacked)
            .filter(|&d| d < spec.shape.len() && tp > 1);
        if let Some(d) = dim {
            if !spec.shape[d].is_multiple_of(u64::from(tp)) {
                return Err(Error::ParseLayout {
                    input: cfg.to_string(),
                    why: format!(
                        "tensor `{}` has {} elements in dimension {d}, which tp={tp} does not divide",
                        spec.name, spec.shape[d]
                    ),
                });
            }
        }
        // A MoE layer's experts (stacked on the axis after the layers, or
        // the first of a layer saved on its own) are split over expert
        // parallelism.
        if let Some(e) = expert_axis
            .map(|a| spec.shape[a])
            .filter(|&e| ep > 1 && !e.is_multiple_of(u64::from(ep)))
        {
            return Err(Error::ParseLayout {
                input: cfg.to_string(),
                why: format!(
                    "tensor `{}` stacks {e} experts, which ep={ep} does not divide",
                    spec.name
                ),
            });
        }
        rules.push((stage, layers, dim, stacked, expert_axis));
    }
    if ep > 1 && !rules.iter().any(|r| r.4.is_some()) {
        return Err(Error::ParseLayout {
            input: cfg.to_string(),
            why: "ep > 1, but the state has no experts to split".into(),
        });
    }
    let mut shards = Vec::with_capacity((tp * pp * ep) as usize);
    for (s, t, e) in (0..pp).flat_map(|s| (0..tp).flat_map(move |t| (0..ep).map(move |e| (s, t, e)))) {
        let mut buffers = Vec::new();
        for (ti, (spec, (stage, layers, dim, stacked, expert))) in tensors.iter().zip(&rules).enumerate() {
            let mut ranges: Vec<Range<u64>> = spec.shape.iter().map(|&n| 0..n).collect();
            match stage {
                Stage::Layers => ranges[0] = layers[s as usize].clone(),
                Stage::First if s != 0 => continue,
                Stage::Last if s != pp - 1 => continue,
                Stage::Layer(l) if !named_stages[s as usize].contains(l) => continue,
                _ => {}
            }
            if let Some(a) = *expert {
                ranges[a] = chunk(ranges[a].clone(), ep, e);
            } else if e != 0 {
                // Every expert-parallel rank holds the dense tensors;
                // the first group's copy is the one saved.
                continue;
            }
            if let Some(d) = *dim {
                ranges[d] = chunk(ranges[d].clone(), tp, t);
            } else if t != 0 {
                // A whole tensor: every tensor-parallel rank of its
                // stage holds it, and rank 0's copy is the one saved
                // (Megatron saves the main replica only).
                continue;
            }
            // One buffer per layer (and expert), as Megatron's modules
            // hold them and save them: a reader of one layer reads
            // that layer's chunk alone.
            for lead in stacked_indices(&ranges[..*stacked]) {
                let mut ranges = ranges.clone();
                for (a, &i) in lead.iter().enumerate() {
                    ranges[a] = i..i + 1;
                }
                let region = Region::new(ranges)?;
                if region.is_empty() {
                    continue;
                }
                let name = match lead.is_empty() {
                    true => spec.name.clone(),
                    false => format!("{}@{lead:?}", spec.name),
                };
                buffers.push(Buffer::of_box(name, spec.dtype, ti as TensorId, region));
            }
        }
        // Megatron's rank order: tp fastest, then dp (whose index
        // modulo ep is the expert-parallel rank), then pp.
        let replicas = (0..dp)
            .filter(|d| d % ep == e)
            .map(|d| devices[((s * dp + d) * tp + t) as usize])
            .collect();
        shards.push(Shard {
            name: match ep {
                1 => format!("pp{s}.tp{t}"),
                _ => format!("pp{s}.tp{t}.ep{e}"),
            },
            devices: replicas,
            buffers,
        });
    }
    Ok(Layout::new(tensors, shards)?)
}

#[cfg(test)]
mod tests {
    use tenplan_ptc::DType;

    use super::*;

    #[test]
    fn megatron_rules_by_name() {
        assert_eq!(
            parameter_of("optimizer.state.exp_avg.decoder.layers.mlp.linear_fc2.weight"),
            "decoder.layers.mlp.linear_fc2.weight"
        );
        assert_eq!(parameter_of("output_layer.weight"), "output_layer.weight");
        assert_eq!(stacked_axes("decoder.layers.mlp.experts.experts.linear_fc1.weight"), 2);
        assert_eq!(stacked_axes("decoder.layers.3.mlp.linear_fc1.weight"), 0);
        assert_eq!(
            tensor_parallel_dim("decoder.layers.self_attention.linear_proj.weight"),
            Some(1)
        );
        assert_eq!(
            tensor_parallel_dim("decoder.layers.self_attention.linear_qkv.layer_norm_weight"),
            None
        );
        assert_eq!(
            tensor_parallel_dim("decoder.layers.self_attention.linear_qkv.weight"),
            Some(0)
        );
    }

    #[test]
    fn stages_tensor_parallel_blocks_and_replicas() {
        let tensors: Arc<[TensorSpec]> = vec![
            TensorSpec::new("embedding.word_embeddings.weight", DType::F32, [8, 4]),
            TensorSpec::new("decoder.layers.self_attention.linear_qkv.weight", DType::F32, [4, 8, 4]),
            TensorSpec::new(
                "decoder.layers.self_attention.linear_qkv.layer_norm_weight",
                DType::F32,
                [4, 4],
            ),
            TensorSpec::new(
                "optimizer.state.exp_avg.decoder.layers.mlp.linear_fc2.weight",
                DType::F32,
                [4, 4, 6],
            ),
            TensorSpec::new("decoder.final_layernorm.weight", DType::F32, [4]),
        ]
        .into();
        let cfg: ParallelConfig = "tp=2,pp=2,dp=2".parse().unwrap();
        let layout = torch_dist_layout(tensors, &cfg).unwrap();
        // Every tensor tiled exactly (Layout::new checks it), on 8 ranks.
        assert_eq!(layout.devices().count(), 8);
        // The qkv: 4 layers x 2 row blocks; the norm: one per layer; the
        // moment like its parameter: column blocks; the embedding's two
        // row blocks and the final norm whole, once.
        assert_eq!(layout.sub_tensors(0).len(), 2);
        assert_eq!(layout.sub_tensors(1).len(), 8);
        assert_eq!(layout.sub_tensors(2).len(), 4);
        assert_eq!(layout.sub_tensors(3).len(), 8);
        assert_eq!(layout.sub_tensors(4).len(), 1);
        assert_eq!(
            stacked_indices(&[1..3, 0..2]),
            [vec![1, 0], vec![1, 1], vec![2, 0], vec![2, 1]]
        );
        let bad: ParallelConfig = "tp=3".parse().unwrap();
        let one: Arc<[TensorSpec]> = vec![TensorSpec::new(
            "decoder.layers.self_attention.linear_qkv.weight",
            DType::F32,
            [4, 8, 4],
        )]
        .into();
        assert!(torch_dist_layout(one.clone(), &bad).is_err());
        let uneven: ParallelConfig = "pp=3".parse().unwrap();
        assert!(torch_dist_layout(one.clone(), &uneven).is_err());
        let dense: ParallelConfig = "dp=2,ep=2".parse().unwrap();
        assert!(torch_dist_layout(one, &dense).is_err());
    }

    #[test]
    fn a_block_saved_layer_by_layer_places_each_layer_on_its_stage() {
        // Layer 0 dense, layer 1 MoE (two experts), saved per layer.
        let tensors: Arc<[TensorSpec]> = vec![
            TensorSpec::new("embedding.word_embeddings.weight", DType::F32, [8, 4]),
            TensorSpec::new("decoder.layers.0.mlp.linear_fc2.weight", DType::F32, [4, 6]),
            TensorSpec::new(
                "decoder.layers.1.mlp.experts.experts.linear_fc1.weight",
                DType::F32,
                [2, 6, 4],
            ),
            TensorSpec::new(
                "optimizer.state.exp_avg.decoder.layers.1.mlp.router.weight",
                DType::F32,
                [2, 4],
            ),
            TensorSpec::new("output_layer.weight", DType::F32, [8, 4]),
        ]
        .into();
        assert_eq!(named_layer("decoder.layers.1.mlp.router.weight"), Some(1));
        assert_eq!(named_layer("decoder.layers.mlp.router.weight"), None);
        // pp=2, ep=2 on 4 ranks: rank = (stage * dp + d) * tp + t.
        let cfg: ParallelConfig = "tp=1,pp=2,dp=2,ep=2".parse().unwrap();
        let layout = torch_dist_layout(tensors.clone(), &cfg).unwrap();
        assert_eq!(layout.sub_tensors(0)[0].holders, [0]);
        assert_eq!(layout.sub_tensors(1)[0].holders, [0]);
        // Layer 1's experts on the second stage, split over ep (axis 0).
        let experts: Vec<(u64, Vec<u32>)> = layout
            .sub_tensors(2)
            .iter()
            .map(|s| (s.region.range(0).start, s.holders.clone()))
            .collect();
        assert_eq!(experts, [(0, vec![2]), (1, vec![3])]);
        // Its router's moment like the router: whole, on the second stage.
        assert_eq!(layout.sub_tensors(3)[0].holders, [2]);
        assert_eq!(layout.sub_tensors(4)[0].holders, [2]);
        // Two layers do not split over three stages.
        let three: ParallelConfig = "pp=3".parse().unwrap();
        assert!(torch_dist_layout(tensors, &three).is_err());
    }

    #[test]
    fn expert_parallelism_splits_the_experts_over_data_parallel_ranks() {
        let tensors: Arc<[TensorSpec]> = vec![
            TensorSpec::new("embedding.word_embeddings.weight", DType::F32, [8, 4]),
            TensorSpec::new(
                "decoder.layers.mlp.experts.experts.linear_fc1.weight",
                DType::F32,
                [2, 4, 6, 4],
            ),
            TensorSpec::new("decoder.layers.mlp.router.weight", DType::F32, [2, 4, 4]),
        ]
        .into();
        let cfg: ParallelConfig = "tp=1,dp=4,ep=2".parse().unwrap();
        let layout = torch_dist_layout(tensors.clone(), &cfg).unwrap();
        // One buffer per layer and expert; ep rank e = dp index mod 2.
        assert_eq!(layout.sub_tensors(1).len(), 8);
        for s in layout.sub_tensors(1) {
            let e = s.region.range(1).start;
            let want: Vec<u32> = if e < 2 { vec![0, 2] } else { vec![1, 3] };
            assert_eq!(s.holders, want, "expert {e}");
        }
        // The dense tensors once, in the first expert-parallel group.
        assert_eq!(layout.sub_tensors(0)[0].holders, [0, 2]);
        assert_eq!(layout.sub_tensors(2).len(), 2);
        let odd: ParallelConfig = "tp=1,dp=3,ep=3".parse().unwrap();
        assert!(torch_dist_layout(tensors.clone(), &odd).is_err());
        let uneven: ParallelConfig = "tp=1,dp=2,ep=2".parse().unwrap();
        assert!(torch_dist_layout(tensors, &uneven).is_ok());
    }
}
