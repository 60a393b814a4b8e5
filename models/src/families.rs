//! Causal-LM families as transformers itself describes them: each family's
//! tensor-parallel plan (`base_model_tp_plan`, and the causal-LM class's
//! own plan for the output layer) and the defaults of the config fields
//! tenplan reads, as `scripts/transformers_families.py` read them from
//! transformers (models/data/transformers-families.json, embedded).
//!
//! A Hugging Face model's state laid out by its family's plan keeps its
//! names ([`hf_layout`]): the tensors are those of the model's files, and
//! the plan only says how each is split under tensor parallelism. Plans
//! name placements by what they mean, and their vocabulary changed across
//! versions, so they are read by meaning: column-wise (`colwise`,
//! `colwise_gather_output`, `local_colwise`, ...) splits a weight's output
//! features, row-wise its input features, `packed_colwise` the two halves
//! of a fused gate/up weight each; anything else is replicated. A family
//! without a plan (GPT-2's Conv1D aside, which tenplan's catalog describes)
//! is split by the projections' usual names.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use serde::Deserialize;
use serde_json::Value;
use tenplan_ptc::{Buffer, Layout, Piece, Region, Shard, TensorId, TensorSpec};

use crate::{Error, ParallelConfig, Result};

/// The families' table, as the generator wrote it.
const TABLE: &str = include_str!("../data/transformers-families.json");

#[derive(Deserialize)]
struct Table {
    transformers: String,
    families: BTreeMap<String, FamilyDoc>,
}

#[derive(Deserialize)]
struct FamilyDoc {
    config_class: String,
    tp_plan: BTreeMap<String, String>,
    causal_lm_tp_plan: BTreeMap<String, String>,
    defaults: BTreeMap<String, Value>,
}

/// One family: its config class, tensor-parallel plan and defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct HfFamily {
    /// The `model_type` of `config.json`.
    pub model_type: String,
    /// The config class transformers reads it with.
    pub config_class: String,
    /// Module patterns (`layers.*.self_attn.q_proj`, relative to the base
    /// model or to the causal-LM model) and what each split means.
    pub plan: Vec<(String, TpStyle)>,
    /// Defaults of the config fields tenplan reads.
    pub defaults: BTreeMap<String, Value>,
}

/// What a tensor-parallel placement means for a weight's elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TpStyle {
    /// Split the output features (a weight's second-to-last dimension,
    /// and a bias).
    Colwise,
    /// Split the input features (a weight's last dimension; a bias is
    /// replicated).
    Rowwise,
    /// A fused gate/up weight: each half of the output features split.
    PackedColwise,
    /// A fused gate/up weight stored transposed (Llama 4's experts,
    /// `[E, H, 2F]`): each half of the last dimension split.
    PackedRowwise,
    /// Whole on every tensor-parallel rank.
    Replicated,
}

impl TpStyle {
    /// The meaning of a plan's placement name.
    pub fn of(placement: &str) -> TpStyle {
        match placement {
            "packed_colwise" | "local_packed_colwise" => TpStyle::PackedColwise,
            "packed_rowwise" | "local_packed_rowwise" => TpStyle::PackedRowwise,
            p if p.contains("colwise") => TpStyle::Colwise,
            p if p.contains("rowwise") => TpStyle::Rowwise,
            _ => TpStyle::Replicated,
        }
    }
}

static FAMILIES: LazyLock<(String, BTreeMap<String, HfFamily>)> = LazyLock::new(|| {
    let table: Table = serde_json::from_str(TABLE).expect("the embedded family table is valid JSON");
    let families = table
        .families
        .into_iter()
        .map(|(model_type, doc)| {
            let plan = doc
                .tp_plan
                .iter()
                .chain(&doc.causal_lm_tp_plan)
                .map(|(k, v)| (k.clone(), TpStyle::of(v)))
                .collect();
            let family = HfFamily {
                model_type: model_type.clone(),
                config_class: doc.config_class,
                plan,
                defaults: doc.defaults,
            };
            (model_type, family)
        })
        .collect();
    (table.transformers, families)
});

/// The transformers version the table was read from.
pub fn transformers_version() -> &'static str {
    &FAMILIES.0
}

/// A family by `model_type`.
pub fn hf_family(model_type: &str) -> Option<&'static HfFamily> {
    FAMILIES.1.get(model_type)
}

/// The transformers family of a `config.json` whose `model_type` is none
/// of the catalog's families (those tenplan lays out under Megatron's
/// names); `None` for a catalog family or a type transformers has no
/// causal LM of.
pub fn family_beyond_catalog(config: &Value) -> Option<&'static HfFamily> {
    let model_type = config.get("model_type")?.as_str()?;
    if crate::Family::ALL.iter().any(|f| f.model_type() == model_type) {
        return None;
    }
    hf_family(model_type)
}

/// Usual projection names, for a tensor no plan entry names: a family
/// whose config class has no plan, or experts its plan names as the
/// stacks transformers 5 builds while the files keep one tensor each.
const FALLBACK: &[(&str, TpStyle)] = &[
    ("w1", TpStyle::Colwise),
    ("w3", TpStyle::Colwise),
    ("w2", TpStyle::Rowwise),
    ("q_proj", TpStyle::Colwise),
    ("k_proj", TpStyle::Colwise),
    ("v_proj", TpStyle::Colwise),
    ("qkv_proj", TpStyle::Colwise),
    ("query_key_value", TpStyle::Colwise),
    ("gate_proj", TpStyle::Colwise),
    ("up_proj", TpStyle::Colwise),
    ("dense_h_to_4h", TpStyle::Colwise),
    ("o_proj", TpStyle::Rowwise),
    ("down_proj", TpStyle::Rowwise),
    ("dense_4h_to_h", TpStyle::Rowwise),
];

/// What PyTorch's optimizers keep per parameter, under the parameter's name
/// (`optim.state.<fqn>.exp_avg` in `get_state_dict`'s flattened form).
pub(crate) const OPTIMIZER_MOMENTS: [&str; 4] = [".exp_avg_sq", ".max_exp_avg_sq", ".exp_avg", ".momentum_buffer"];

/// Whether the module path `module` (`model.layers.3.self_attn.q_proj`)
/// ends with the plan pattern `pattern` (`layers.*.self_attn.q_proj`), `*`
/// standing for one segment.
fn matches(pattern: &str, module: &str) -> bool {
    let p: Vec<&str> = pattern.split('.').collect();
    let m: Vec<&str> = module.split('.').collect();
    m.len() >= p.len() && p.iter().zip(&m[m.len() - p.len()..]).all(|(a, b)| *a == "*" || a == b)
}

impl HfFamily {
    /// How tensor parallelism splits the tensor `name` (`...q_proj.weight`):
    /// the most specific plan entry matching its module, else the usual
    /// names where the family has no plan, else replicated.
    pub fn style(&self, name: &str) -> TpStyle {
        let module = name
            .strip_suffix(".weight")
            .or_else(|| name.strip_suffix(".bias"))
            .unwrap_or(name);
        let best = self
            .plan
            .iter()
            .filter(|(p, _)| matches(p, module))
            .max_by_key(|(p, _)| p.split('.').count());
        if let Some((_, s)) = best {
            return *s;
        }
        let last = module.rsplit('.').next().unwrap_or(module);
        match FALLBACK.iter().find(|(n, _)| *n == last) {
            // Mixtral's w1/w2/w3 only as experts: elsewhere the names mean
            // other things.
            Some((n, _)) if n.starts_with('w') && !module.contains(".experts.") => TpStyle::Replicated,
            Some((_, s)) => *s,
            None => TpStyle::Replicated,
        }
    }

    /// The dimension a DTensor job's tensor parallelism shards the tensor
    /// `name` (a parameter, or its optimizer moment) of `ndim` dimensions
    /// on, as torch's `ColwiseParallel` and `RowwiseParallel` place the
    /// module the family's plan names: a linear weight's output features
    /// (`Shard(0)` of `[out, in]`, and its bias) or input features
    /// (`Shard(1)`, the bias replicated); an embedding's vocabulary under
    /// a row-wise plan, its features under a column-wise one. `None`:
    /// replicated. A fused gate/up weight (`packed_colwise`) has no
    /// DTensor placement: its style comes back as the error.
    pub fn dtensor_tp_dim(&self, name: &str, ndim: usize) -> std::result::Result<Option<usize>, TpStyle> {
        let param = OPTIMIZER_MOMENTS
            .iter()
            .find_map(|m| name.strip_suffix(m))
            .unwrap_or(name);
        let style = self.style(param);
        let module = param.rsplit('.').nth(1).unwrap_or(param);
        let embedding = module.contains("embed") || module == "wte";
        let bias = param.ends_with(".bias");
        Ok(match style {
            TpStyle::PackedColwise | TpStyle::PackedRowwise => return Err(style),
            TpStyle::Replicated => None,
            _ if ndim == 0 => None,
            TpStyle::Colwise if embedding => (ndim >= 2).then_some(ndim - 1),
            TpStyle::Rowwise if embedding => Some(0),
            TpStyle::Colwise if bias => Some(ndim - 1),
            TpStyle::Colwise => (ndim >= 2).then_some(ndim - 2),
            TpStyle::Rowwise if bias => None,
            TpStyle::Rowwise => (ndim >= 2).then_some(ndim - 1),
        })
    }

    /// A config field: `config.json`'s value, else the config class's
    /// default; `None` where neither gives one (a field transformers
    /// derives from others).
    pub fn field(&self, config: &Value, name: &str) -> Option<Value> {
        config
            .get(name)
            .filter(|v| !v.is_null())
            .or_else(|| self.defaults.get(name).filter(|v| !v.is_null()))
            .cloned()
    }

    /// An integer config field, as [`HfFamily::field`].
    pub fn int(&self, config: &Value, name: &str) -> Option<u64> {
        self.field(config, name).and_then(|v| v.as_u64())
    }
}

/// Sizes the tensor-parallel split must respect: attention heads and the
/// layers that pipeline stages take.
struct Sizes {
    heads: Option<u64>,
    kv_heads: Option<u64>,
    head_dim: Option<u64>,
    layers: Option<u64>,
}

impl Sizes {
    fn of(f: &HfFamily, config: &Value) -> Sizes {
        let heads = f.int(config, "num_attention_heads").or_else(|| f.int(config, "n_head"));
        // transformers sets num_key_value_heads to num_attention_heads where
        // a config gives none.
        let kv_heads = f.int(config, "num_key_value_heads").or(heads);
        let layers = f.int(config, "num_hidden_layers").or_else(|| f.int(config, "n_layer"));
        // And head_dim to hidden_size / num_attention_heads.
        let hidden = f.int(config, "hidden_size").or_else(|| f.int(config, "n_embd"));
        let head_dim = f
            .int(config, "head_dim")
            .or_else(|| Some(hidden? / heads.filter(|&h| h > 0)?));
        Sizes {
            heads,
            kv_heads,
            head_dim,
            layers,
        }
    }
}

/// The parts a split dimension of `size` fuses, each split over the
/// tensor-parallel ranks on its own: a packed gate/up weight's two halves
/// (by the plan, or by the name `gate_up_proj` where the plan says
/// column-wise), a fused `qkv_proj`'s queries, keys and values where the
/// heads give their sizes; else the whole dimension.
fn segments(name: &str, style: TpStyle, size: u64, sizes: &Sizes) -> Vec<u64> {
    let module = name.strip_suffix(".weight").unwrap_or(name);
    let packed = matches!(style, TpStyle::PackedColwise | TpStyle::PackedRowwise)
        || (style == TpStyle::Colwise && module.ends_with("gate_up_proj"));
    if packed && size.is_multiple_of(2) {
        return vec![size / 2; 2];
    }
    if style == TpStyle::Colwise && module.ends_with(".qkv_proj") {
        if let (Some(h), Some(kv), Some(d)) = (sizes.heads, sizes.kv_heads, sizes.head_dim) {
            if (h + 2 * kv) * d == size && kv != h {
                return vec![h * d, kv * d, kv * d];
            }
            if 3 * h * d == size {
                return vec![h * d; 3];
            }
        }
    }
    vec![size]
}

/// The layer index of a tensor (`...layers.12....` is 12).
fn layer_of(name: &str) -> Option<u64> {
    let mut parts = name.split('.');
    while let Some(p) = parts.next() {
        if p == "layers" || p == "h" || p == "blocks" {
            return parts.next()?.parse().ok();
        }
    }
    None
}

/// `range` split into `n` equal parts, the `k`-th (`n` divides it).
fn part(range: std::ops::Range<u64>, n: u64, k: u64) -> std::ops::Range<u64> {
    let size = (range.end - range.start) / n;
    range.start + k * size..range.start + (k + 1) * size
}

/// The state of a Hugging Face model of `family` (its files' tensors,
/// under their own names) laid out under `cfg`: tensor parallelism as the
/// family's plan splits each tensor, pipeline stages by layer (the
/// embeddings on the first stage, what follows the layers on the last),
/// data-parallel replicas. Ranks are in Megatron's order (tp fastest, then
/// dp, then pp). A split that the sizes do not allow (a tp that does not
/// divide the heads, or a dimension) is refused naming the tensor.
pub fn hf_layout(
    family: &HfFamily,
    config: &Value,
    tensors: Arc<[TensorSpec]>,
    cfg: &ParallelConfig,
) -> Result<Layout> {
    let refuse = |why: String| Error::DoesNotFit {
        layout: cfg.to_string(),
        model: format!("{} ({})", family.model_type, family.config_class),
        why,
    };
    if cfg.zero != 0 || cfg.ep != 1 || cfg.experts.is_some() {
        return Err(refuse(
            "zero, ep and experts are Megatron's; a Hugging Face model's own layout takes tp, pp, dp, split and devices".into(),
        ));
    }
    let devices = cfg.rank_devices()?;
    let (tp, pp, dp) = (u64::from(cfg.tp), u64::from(cfg.pp), u64::from(cfg.dp));
    let sizes = Sizes::of(family, config);
    // Heads a tensor-parallel split of attention must divide.
    for (what, n) in [
        ("attention heads (num_attention_heads)", sizes.heads),
        ("key/value heads (num_key_value_heads)", sizes.kv_heads),
    ] {
        if let Some(n) = n.filter(|&n| tp > 1 && n % tp != 0) {
            return Err(refuse(format!("tp={tp} does not divide the {n} {what}")));
        }
    }
    // Pipeline stages: layers per stage.
    let layers = sizes.layers.unwrap_or(0);
    let stage_of_layer: Vec<u64> = if pp > 1 {
        let split: Vec<u64> = match &cfg.split {
            Some(s) => s.iter().map(|&x| u64::from(x)).collect(),
            None => {
                if !layers.is_multiple_of(pp) {
                    return Err(refuse(format!(
                        "pp={pp} does not divide the {layers} layers; give split=A:B:.."
                    )));
                }
                vec![layers / pp; pp as usize]
            }
        };
        if split.len() as u64 != pp || split.iter().sum::<u64>() != layers {
            return Err(refuse(format!(
                "split {split:?} does not give {layers} layers to {pp} stages"
            )));
        }
        split
            .iter()
            .enumerate()
            .flat_map(|(s, &n)| std::iter::repeat_n(s as u64, n as usize))
            .collect()
    } else {
        vec![0; layers as usize]
    };
    // Tensors before the first layer (embeddings) go to the first stage,
    // the others outside layers to the last: by their position in the files
    // does not tell, so by name.
    let stage = |name: &str| -> Result<u64> {
        match layer_of(name) {
            Some(l) => stage_of_layer.get(l as usize).copied().ok_or_else(|| {
                refuse(format!(
                    "tensor `{name}` is in layer {l}, beyond the config's {layers} layers"
                ))
            }),
            None if pp == 1 => Ok(0),
            None if name.contains("embed") || name.contains("wte") || name.contains("wpe") => Ok(0),
            None => Ok(pp - 1),
        }
    };
    // Each tensor's pieces on each tensor-parallel rank.
    let mut per_tensor: Vec<(u64, Vec<Vec<Region>>)> = Vec::with_capacity(tensors.len());
    for spec in tensors.iter() {
        let n = spec.shape.len();
        let full: Vec<std::ops::Range<u64>> = spec.shape.iter().map(|&x| 0..x).collect();
        let style = if tp > 1 {
            family.style(&spec.name)
        } else {
            TpStyle::Replicated
        };
        let bias = spec.name.ends_with(".bias");
        let dim = match style {
            TpStyle::Colwise | TpStyle::PackedColwise if n >= 2 => Some(n - 2),
            TpStyle::Colwise if bias => Some(0),
            TpStyle::Rowwise | TpStyle::PackedRowwise if n >= 2 => Some(n - 1),
            _ => None,
        };
        let segments = match dim {
            Some(d) => segments(&spec.name, style, spec.shape[d], &sizes),
            None => Vec::new(),
        };
        if let (Some(d), Some(&seg)) = (dim, segments.iter().find(|&&seg| seg % tp != 0)) {
            return Err(refuse(format!(
                "tensor `{}` of shape {:?}: tp={tp} does not divide its dimension {d} ({}{})",
                spec.name,
                spec.shape,
                spec.shape[d],
                if segments.len() > 1 {
                    format!(", fused as {segments:?}: {seg}")
                } else {
                    String::new()
                }
            )));
        }
        let mut ranks = Vec::with_capacity(tp as usize);
        for k in 0..tp {
            let regions = match dim {
                None => vec![Region::new(full.clone())?],
                // Each fused segment split on its own: rank k holds the k-th
                // part of every one.
                Some(d) => {
                    let mut start = 0;
                    let mut regions = Vec::with_capacity(segments.len());
                    for &seg in &segments {
                        let mut r = full.clone();
                        r[d] = part(start..start + seg, tp, k);
                        regions.push(Region::new(r)?);
                        start += seg;
                    }
                    regions
                }
            };
            ranks.push(regions);
        }
        per_tensor.push((stage(&spec.name)?, ranks));
    }
    let mut shards = Vec::with_capacity((tp * pp) as usize);
    for s in 0..pp {
        for k in 0..tp {
            let mut buffers = Vec::new();
            for (t, (spec, (st, ranks))) in tensors.iter().zip(&per_tensor).enumerate() {
                if *st != s {
                    continue;
                }
                let mut offset = 0;
                let pieces = ranks[k as usize]
                    .iter()
                    .map(|r| {
                        let p = Piece {
                            tensor: t as TensorId,
                            region: r.clone(),
                            offset,
                        };
                        offset += r.volume();
                        p
                    })
                    .collect();
                buffers.push(Buffer {
                    name: spec.name.clone(),
                    dtype: spec.dtype,
                    len: offset,
                    pieces,
                    partial: false,
                });
            }
            let replicas = (0..dp).map(|d| devices[(k + tp * (d + dp * s)) as usize]).collect();
            shards.push(Shard {
                name: format!("pp{s}.tp{k}"),
                devices: replicas,
                buffers,
            });
        }
    }
    Ok(Layout::new(tensors, shards)?)
}

#[cfg(test)]
mod tests {
    use tenplan_ptc::DType;

    use super::*;

    #[test]
    fn dtensor_placements_follow_torchs_styles() {
        let qwen2 = hf_family("qwen2").unwrap();
        let dim = |f: &HfFamily, n: &str, nd| f.dtensor_tp_dim(n, nd);
        // ColwiseParallel: Shard(0) of the weight and of its bias.
        assert_eq!(
            dim(qwen2, "model.model.layers.0.self_attn.q_proj.weight", 2),
            Ok(Some(0))
        );
        assert_eq!(dim(qwen2, "model.model.layers.0.self_attn.q_proj.bias", 1), Ok(Some(0)));
        // RowwiseParallel: Shard(1); its bias whole.
        assert_eq!(dim(qwen2, "model.model.layers.0.mlp.down_proj.weight", 2), Ok(Some(1)));
        assert_eq!(dim(qwen2, "model.model.layers.0.mlp.down_proj.bias", 1), Ok(None));
        // An optimizer moment as its parameter; a step counter whole.
        for moment in ["exp_avg", "exp_avg_sq", "momentum_buffer"] {
            let n = format!("optim.state.model.layers.1.mlp.up_proj.weight.{moment}");
            assert_eq!(dim(qwen2, &n, 2), Ok(Some(0)), "{n}");
        }
        assert_eq!(
            dim(qwen2, "optim.state.model.layers.1.mlp.up_proj.weight.step", 0),
            Ok(None)
        );
        // The causal LM's own plan: lm_head column-wise; norms and the
        // embedding (no plan entry) whole.
        assert_eq!(dim(qwen2, "model.lm_head.weight", 2), Ok(Some(0)));
        assert_eq!(dim(qwen2, "model.model.norm.weight", 1), Ok(None));
        assert_eq!(dim(qwen2, "model.model.embed_tokens.weight", 2), Ok(None));
        // A fused gate/up stack has no DTensor placement.
        let mixtral = hf_family("mixtral").unwrap();
        assert_eq!(
            dim(mixtral, "model.layers.0.mlp.experts.gate_up_proj", 3),
            Err(TpStyle::PackedColwise)
        );
    }

    #[test]
    fn plans_are_read_by_meaning() {
        let llama = hf_family("llama").unwrap();
        assert_eq!(llama.style("model.layers.3.self_attn.q_proj.weight"), TpStyle::Colwise);
        assert_eq!(llama.style("model.layers.3.self_attn.o_proj.weight"), TpStyle::Rowwise);
        assert_eq!(llama.style("lm_head.weight"), TpStyle::Colwise);
        assert_eq!(llama.style("model.embed_tokens.weight"), TpStyle::Replicated);
        assert_eq!(
            llama.style("model.layers.0.input_layernorm.weight"),
            TpStyle::Replicated
        );
        let phi3 = hf_family("phi3").unwrap();
        assert_eq!(phi3.style("model.layers.0.self_attn.qkv_proj.weight"), TpStyle::Colwise);
        let moe = hf_family("qwen3_moe").unwrap();
        assert_eq!(
            moe.style("model.layers.0.mlp.experts.gate_up_proj"),
            TpStyle::PackedColwise
        );
        // No plan: the usual names.
        let falcon = hf_family("falcon").unwrap();
        assert_eq!(
            falcon.style("transformer.h.0.self_attention.query_key_value.weight"),
            TpStyle::Colwise
        );
        assert!(transformers_version().starts_with('5'));
    }

    #[test]
    fn defaults_come_from_the_config_class() {
        let f = hf_family("qwen3_moe").unwrap();
        let config = serde_json::json!({"hidden_size": 64, "num_attention_heads": 4});
        assert_eq!(f.int(&config, "num_key_value_heads"), Some(4));
        assert_eq!(f.int(&config, "hidden_size"), Some(64));
    }

    #[test]
    fn a_layout_keeps_names_and_splits_by_the_plan() {
        let f = hf_family("llama").unwrap();
        let config = serde_json::json!({"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2});
        let tensors: Arc<[TensorSpec]> = vec![
            TensorSpec::new("model.embed_tokens.weight", DType::BF16, [10, 8]),
            TensorSpec::new("model.layers.0.self_attn.q_proj.weight", DType::BF16, [8, 8]),
            TensorSpec::new("model.layers.1.self_attn.o_proj.weight", DType::BF16, [8, 8]),
            TensorSpec::new("model.norm.weight", DType::BF16, [8]),
        ]
        .into();
        let cfg: ParallelConfig = "tp=2,pp=2".parse().unwrap();
        let l = hf_layout(f, &config, tensors.clone(), &cfg).unwrap();
        // Stage 0 holds the embedding and layer 0; q_proj's rows are split.
        let s0 = &l.shards()[0];
        assert_eq!(
            s0.buffers.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(),
            ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"]
        );
        assert_eq!(s0.buffers[1].pieces[0].region, Region::new([0..4, 0..8]).unwrap());
        // o_proj on stage 1, split by columns.
        let s3 = &l.shards()[3];
        assert_eq!(s3.buffers[0].pieces[0].region, Region::new([0..8, 4..8]).unwrap());
        let e = hf_layout(f, &config, tensors, &"tp=4".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("tp=4 does not divide the 2 key/value heads"), "{e}");
    }
}
