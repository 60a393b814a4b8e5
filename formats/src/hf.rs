//! Hugging Face safetensors models: their tensor names, and unsharded model
//! directories as a source of global tensors.
//!
//! A model directory holds `model.safetensors`, or shards
//! `model-0000k-of-0000N.safetensors` listed by `model.safetensors.index.json`
//! (`{"weight_map": {name: file}}`). Each tensor of the job's state is found
//! either under its own name (Megatron-core names, as tenplan's catalog uses)
//! or under the transformers names of the model's family, converted as
//! Megatron-LM's loaders do ([`links`]); [`crate::hf_export`] writes the same
//! names back.
//!
//! | tenplan | Hugging Face |
//! |---|---|
//! | `embedding.word_embeddings.weight` | `model.embed_tokens.weight` |
//! | `decoder.layers.L.input_layernorm.weight` | `model.layers.L.input_layernorm.weight` |
//! | `decoder.layers.L.self_attention.linear_qkv.weight` | `q_proj`, `k_proj`, `v_proj` of `model.layers.L.self_attn`, interleaved per query group: the group's query heads, then its key head, then its value head |
//! | `decoder.layers.L.self_attention.linear_proj.weight` | `model.layers.L.self_attn.o_proj.weight` |
//! | `decoder.layers.L.pre_mlp_layernorm.weight` | `model.layers.L.post_attention_layernorm.weight` |
//! | `decoder.layers.L.mlp.linear_fc1.weight` | `gate_proj` stacked on `up_proj` of `model.layers.L.mlp` |
//! | `decoder.layers.L.mlp.linear_fc2.weight` | `model.layers.L.mlp.down_proj.weight` |
//! | `decoder.layers.L.mlp.router.weight` (Mixtral) | `model.layers.L.block_sparse_moe.gate.weight` |
//! | `decoder.layers.L.mlp.experts.local_experts.E.linear_fc1.weight` (Mixtral) | `w1` stacked on `w3` of `model.layers.L.block_sparse_moe.experts.E` |
//! | `decoder.layers.L.mlp.experts.local_experts.E.linear_fc2.weight` (Mixtral) | `model.layers.L.block_sparse_moe.experts.E.w2.weight` |
//! | `decoder.layers.L.self_attention.linear_qkv.bias` | `q_proj`, `k_proj`, `v_proj` biases, interleaved as the weight |
//! | `decoder.layers.L.self_attention.{q,k}_layernorm.weight` | `model.layers.L.self_attn.{q,k}_norm.weight` |
//! | `decoder.layers.L.self_attention.linear_q_down_proj.weight` | `model.layers.L.self_attn.q_a_proj.weight` |
//! | `decoder.layers.L.self_attention.linear_q_up_proj.{layer_norm_weight,weight}` | `q_a_layernorm.weight`, `q_b_proj.weight` |
//! | `decoder.layers.L.self_attention.linear_kv_down_proj.weight` | `model.layers.L.self_attn.kv_a_proj_with_mqa.weight` |
//! | `decoder.layers.L.self_attention.linear_kv_up_proj.{layer_norm_weight,weight}` | `kv_a_layernorm.weight`, `kv_b_proj.weight` |
//! | `decoder.layers.L.mlp.router.weight` (Qwen-MoE, DeepSeek) | `model.layers.L.mlp.gate.weight` |
//! | `decoder.layers.L.mlp.router.expert_bias` | `model.layers.L.mlp.gate.e_score_correction_bias` |
//! | `decoder.layers.L.mlp.experts.local_experts.E.linear_fc{1,2}.weight` (Qwen-MoE, DeepSeek) | `gate_proj` stacked on `up_proj`; `down_proj` of `model.layers.L.mlp.experts.E` |
//! | `decoder.layers.L.mlp.shared_experts.linear_fc{1,2}.weight` | the same of `mlp.shared_expert` (Qwen2-MoE) or `mlp.shared_experts` (DeepSeek) |
//! | `decoder.layers.L.mlp.shared_experts.gate_weight` | `model.layers.L.mlp.shared_expert_gate.weight` |
//! | `decoder.final_layernorm.weight` | `model.norm.weight` |
//! | `output_layer.weight` | `lm_head.weight` |
//!
//! GPT-2 (and the catalog's GPT-3 models) use GPT-2's names, and its
//! `Conv1D` layers store the transpose of a linear layer's weight:
//!
//! | tenplan | GPT-2 |
//! |---|---|
//! | `embedding.word_embeddings.weight`, `embedding.position_embeddings.weight` | `transformer.wte.weight`, `transformer.wpe.weight` |
//! | `decoder.layers.L.{input,pre_mlp}_layernorm.{weight,bias}` | `transformer.h.L.{ln_1,ln_2}.{weight,bias}` |
//! | `decoder.layers.L.self_attention.linear_qkv.weight` | `transformer.h.L.attn.c_attn.weight` transposed; its columns are all query heads, all key heads, all value heads, interleaved per head as above |
//! | `decoder.layers.L.self_attention.linear_qkv.bias` | `transformer.h.L.attn.c_attn.bias`, interleaved as the weight |
//! | `decoder.layers.L.self_attention.linear_proj.{weight,bias}` | `transformer.h.L.attn.c_proj.{weight (transposed),bias}` |
//! | `decoder.layers.L.mlp.linear_fc1.{weight,bias}` | `transformer.h.L.mlp.c_fc.{weight (transposed),bias}` |
//! | `decoder.layers.L.mlp.linear_fc2.{weight,bias}` | `transformer.h.L.mlp.c_proj.{weight (transposed),bias}` |
//! | `decoder.final_layernorm.{weight,bias}` | `transformer.ln_f.{weight,bias}` |
//!
//! Files that name GPT-2's tensors without the `transformer.` prefix (the
//! original OpenAI conversion) are read too.
//!
//! The query and key rows are taken as stored (Hugging Face's rotary layout,
//! which Megatron-core's `rotate_half` rotary embedding also uses).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use serde::Deserialize;
use tenplan_models::{Family, ModelSpec};
use tenplan_ptc::{Buffer, DType, Layout, Piece, Region, Shard, TensorId, TensorSpec};

use crate::checkpoint::{map, parse_safetensors};
use crate::{Error, Result, Source};
use tenplan_ptc::{read_box, SourceBox};

/// Where a run of rows of a tenplan tensor is kept in a Hugging Face tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// The Hugging Face tensor.
    pub hf: String,
    /// Its shape.
    pub hf_shape: Vec<u64>,
    /// Rows of the tenplan tensor (elements, for a vector).
    pub rows: Range<u64>,
    /// The Hugging Face tensor's row where they start; its column, when
    /// `transposed`.
    pub at: u64,
    /// The Hugging Face tensor stores the transpose (GPT-2's `Conv1D`): row
    /// `r` of the tenplan matrix is column `at + r - rows.start` of it.
    pub transposed: bool,
}

impl Link {
    pub(crate) fn rows(hf: String, hf_shape: Vec<u64>, rows: Range<u64>, at: u64) -> Link {
        Link {
            hf,
            hf_shape,
            rows,
            at,
            transposed: false,
        }
    }

    /// Elements of the Hugging Face tensor per unit of `at`: a row's, or one
    /// element when transposed.
    fn hf_row_elements(&self) -> u64 {
        self.hf_shape[1..].iter().product()
    }
}

/// A fused tensor's three parts (query, key, value): each a Hugging Face
/// tensor, its shape, and the row (or column) where the part starts in it.
struct Qkv {
    parts: [(String, Vec<u64>, u64); 3],
    transposed: bool,
}

/// The rows of a fused QKV tensor, per query group: the group's query heads,
/// its key head, its value head (Megatron-core's order).
fn qkv_links(m: &ModelSpec, f: Qkv) -> Vec<Link> {
    let d = m.head_dim;
    let per = (m.heads / m.groups.max(1)) as u64;
    let (qn, block) = (per * d, (per + 2) * d);
    let [(q, qs, qb), (k, ks, kb), (v, vs, vb)] = f.parts;
    let mut out = Vec::with_capacity(3 * m.groups as usize);
    for g in 0..m.groups as u64 {
        let at = g * block;
        for (hf, shape, rows, from) in [
            (&q, &qs, at..at + qn, qb + g * qn),
            (&k, &ks, at + qn..at + qn + d, kb + g * d),
            (&v, &vs, at + qn + d..at + block, vb + g * d),
        ] {
            out.push(Link {
                hf: hf.clone(),
                hf_shape: shape.clone(),
                rows,
                at: from,
                transposed: f.transposed,
            });
        }
    }
    out
}

/// Where each row of a tenplan weight tensor is kept in the Hugging Face
/// files of the model's family (the tables above). A name of no mapping
/// keeps its own name.
pub fn links(m: &ModelSpec, t: &TensorSpec) -> Vec<Link> {
    if m.family.is_gpt() {
        return gpt2_links(m, t);
    }
    let shape = &t.shape;
    let rows = shape[0];
    let with_rows = |n: u64| -> Vec<u64> { std::iter::once(n).chain(shape[1..].iter().copied()).collect() };
    let whole = |hf: String| vec![Link::rows(hf, shape.clone(), 0..rows, 0)];
    // Two Hugging Face tensors stacked along rows (SwiGLU's gate and up).
    let stacked = |a: String, b: String| {
        let half = rows / 2;
        vec![
            Link::rows(a, with_rows(half), 0..half, 0),
            Link::rows(b, with_rows(half), half..rows, 0),
        ]
    };
    let name = t.name.as_str();
    match name {
        "embedding.word_embeddings.weight" => return whole("model.embed_tokens.weight".into()),
        "decoder.final_layernorm.weight" => return whole("model.norm.weight".into()),
        "output_layer.weight" => return whole("lm_head.weight".into()),
        _ => {}
    }
    if let Some((k, what)) = name.strip_prefix("mtp.layers.").and_then(|r| r.split_once('.')) {
        // DeepSeek-V3's files keep MTP module k as layer `layers + k`.
        let Some(layer) = k.parse::<u32>().ok().and_then(|k| m.layers.checked_add(k)) else {
            return whole(name.into());
        };
        let p = format!("model.layers.{layer}");
        return match what {
            "enorm.weight" | "hnorm.weight" | "eh_proj.weight" => whole(format!("{p}.{what}")),
            "final_layernorm.weight" => whole(format!("{p}.shared_head.norm.weight")),
            _ => match what.strip_prefix("transformer_layer.") {
                Some(rest) => {
                    let inner = TensorSpec::new(format!("decoder.layers.{layer}.{rest}"), t.dtype, shape.clone());
                    links(m, &inner)
                }
                None => whole(name.into()),
            },
        };
    }
    let Some((layer, what)) = name.strip_prefix("decoder.layers.").and_then(|r| r.split_once('.')) else {
        return whole(name.into());
    };
    let p = format!("model.layers.{layer}");
    let attn = |s: &str| format!("{p}.self_attn.{s}");
    let mlp = |s: &str| format!("{p}.mlp.{s}");
    let mixtral = m.family == Family::Mixtral;
    match what {
        "input_layernorm.weight" => whole(format!("{p}.input_layernorm.weight")),
        "pre_mlp_layernorm.weight" => whole(format!("{p}.post_attention_layernorm.weight")),
        "self_attention.linear_proj.weight" => whole(attn("o_proj.weight")),
        "self_attention.linear_proj.bias" => whole(attn("o_proj.bias")),
        "self_attention.q_layernorm.weight" => whole(attn("q_norm.weight")),
        "self_attention.k_layernorm.weight" => whole(attn("k_norm.weight")),
        "self_attention.linear_q_down_proj.weight" => whole(attn("q_a_proj.weight")),
        "self_attention.linear_q_down_proj.bias" => whole(attn("q_a_proj.bias")),
        "self_attention.linear_q_up_proj.layer_norm_weight" => whole(attn("q_a_layernorm.weight")),
        "self_attention.linear_q_up_proj.weight" => whole(attn("q_b_proj.weight")),
        "self_attention.linear_q_proj.weight" => whole(attn("q_proj.weight")),
        "self_attention.linear_kv_down_proj.weight" => whole(attn("kv_a_proj_with_mqa.weight")),
        "self_attention.linear_kv_down_proj.bias" => whole(attn("kv_a_proj_with_mqa.bias")),
        "self_attention.linear_kv_up_proj.layer_norm_weight" => whole(attn("kv_a_layernorm.weight")),
        "self_attention.linear_kv_up_proj.weight" => whole(attn("kv_b_proj.weight")),
        "self_attention.linear_qkv.weight" | "self_attention.linear_qkv.bias" => {
            let kind = what.rsplit('.').next().unwrap_or("weight");
            let (q, kv) = (m.heads as u64 * m.head_dim, m.groups as u64 * m.head_dim);
            qkv_links(
                m,
                Qkv {
                    parts: [
                        (attn(&format!("q_proj.{kind}")), with_rows(q), 0),
                        (attn(&format!("k_proj.{kind}")), with_rows(kv), 0),
                        (attn(&format!("v_proj.{kind}")), with_rows(kv), 0),
                    ],
                    transposed: false,
                },
            )
        }
        "mlp.linear_fc1.weight" => stacked(mlp("gate_proj.weight"), mlp("up_proj.weight")),
        "mlp.linear_fc1.bias" => stacked(mlp("gate_proj.bias"), mlp("up_proj.bias")),
        "mlp.linear_fc2.weight" => whole(mlp("down_proj.weight")),
        "mlp.linear_fc2.bias" => whole(mlp("down_proj.bias")),
        "mlp.router.weight" if mixtral => whole(format!("{p}.block_sparse_moe.gate.weight")),
        "mlp.router.weight" => whole(mlp("gate.weight")),
        "mlp.router.expert_bias" => whole(mlp("gate.e_score_correction_bias")),
        "mlp.shared_experts.gate_weight" => whole(mlp("shared_expert_gate.weight")),
        other => {
            if let Some(w) = other.strip_prefix("mlp.shared_experts.") {
                // Qwen2-MoE has one `shared_expert`, DeepSeek `shared_experts`.
                let x = if m.family == Family::Qwen2Moe {
                    mlp("shared_expert")
                } else {
                    mlp("shared_experts")
                };
                match w {
                    "linear_fc1.weight" => {
                        return stacked(format!("{x}.gate_proj.weight"), format!("{x}.up_proj.weight"))
                    }
                    "linear_fc2.weight" => return whole(format!("{x}.down_proj.weight")),
                    _ => {}
                }
            }
            if let Some((e, w)) = other
                .strip_prefix("mlp.experts.local_experts.")
                .and_then(|e| e.split_once('.'))
            {
                let (x, [gate, up, down]) = if mixtral {
                    (format!("{p}.block_sparse_moe.experts.{e}"), ["w1", "w3", "w2"])
                } else {
                    (mlp(&format!("experts.{e}")), ["gate_proj", "up_proj", "down_proj"])
                };
                match w {
                    "linear_fc1.weight" => return stacked(format!("{x}.{gate}.weight"), format!("{x}.{up}.weight")),
                    "linear_fc2.weight" => return whole(format!("{x}.{down}.weight")),
                    _ => {}
                }
            }
            whole(name.into())
        }
    }
}

/// The tensors DeepSeek-V3's files hold twice: each MTP module's
/// `embed_tokens` and `shared_head.head`, copies of the model's embedding
/// and output layer (which Megatron-Core's MTP modules share, so a state
/// keeps them once): (the copy, the model's own tensor), in module order.
pub fn mtp_copies(m: &ModelSpec) -> Vec<(String, &'static str)> {
    let head = if m.tied {
        "model.embed_tokens.weight"
    } else {
        "lm_head.weight"
    };
    (0..m.mtp_layers)
        .flat_map(|k| {
            let p = format!("model.layers.{}", m.layers + k);
            [
                (format!("{p}.embed_tokens.weight"), "model.embed_tokens.weight"),
                (format!("{p}.shared_head.head.weight"), head),
            ]
        })
        .collect()
}

/// How many multi-token-prediction modules a source holds after the layers
/// of `model`: modules 0, 1, ... as long as `holds` finds one of module K's
/// `eh_proj` names (`names(K)`; DeepSeek's files name it as layer
/// `layers + K`, [`mtp_eh_proj`]). None for GPT families.
pub(crate) fn mtp_modules_held(
    model: &ModelSpec,
    names: impl Fn(u32) -> Vec<String>,
    holds: impl Fn(&str) -> bool,
) -> u32 {
    if model.family.is_gpt() {
        return 0;
    }
    (0..=model.layers)
        .take_while(|&k| names(k).iter().any(|n| holds(n)))
        .count() as u32
}

/// MTP module `k`'s `eh_proj` in DeepSeek-V3's files.
pub(crate) fn mtp_eh_proj(model: &ModelSpec, k: u32) -> String {
    format!("model.layers.{}.eh_proj.weight", model.layers + k)
}

/// GPT-2's names; its `Conv1D` weights are stored transposed.
fn gpt2_links(m: &ModelSpec, t: &TensorSpec) -> Vec<Link> {
    let shape = &t.shape;
    let whole = |hf: String| vec![Link::rows(hf, shape.clone(), 0..shape[0], 0)];
    let transposed = |hf: String| {
        vec![Link {
            hf,
            hf_shape: vec![shape[1], shape[0]],
            rows: 0..shape[0],
            at: 0,
            transposed: true,
        }]
    };
    let name = t.name.as_str();
    match name {
        "embedding.word_embeddings.weight" => return whole("transformer.wte.weight".into()),
        "embedding.position_embeddings.weight" => return whole("transformer.wpe.weight".into()),
        "decoder.final_layernorm.weight" => return whole("transformer.ln_f.weight".into()),
        "decoder.final_layernorm.bias" => return whole("transformer.ln_f.bias".into()),
        "output_layer.weight" => return whole("lm_head.weight".into()),
        _ => {}
    }
    let Some((layer, what)) = name.strip_prefix("decoder.layers.").and_then(|r| r.split_once('.')) else {
        return whole(name.into());
    };
    let h = |s: &str| format!("transformer.h.{layer}.{s}");
    let fused = |kind: &str, transposed: bool| {
        let (q, kv) = (m.heads as u64 * m.head_dim, m.groups as u64 * m.head_dim);
        let hf = h(&format!("attn.c_attn.{kind}"));
        let hf_shape = if transposed {
            vec![shape[1], shape[0]]
        } else {
            vec![shape[0]]
        };
        qkv_links(
            m,
            Qkv {
                parts: [
                    (hf.clone(), hf_shape.clone(), 0),
                    (hf.clone(), hf_shape.clone(), q),
                    (hf, hf_shape, q + kv),
                ],
                transposed,
            },
        )
    };
    match what {
        "input_layernorm.weight" => whole(h("ln_1.weight")),
        "input_layernorm.bias" => whole(h("ln_1.bias")),
        "pre_mlp_layernorm.weight" => whole(h("ln_2.weight")),
        "pre_mlp_layernorm.bias" => whole(h("ln_2.bias")),
        "self_attention.linear_qkv.weight" if shape.len() == 2 => fused("weight", true),
        "self_attention.linear_qkv.bias" => fused("bias", false),
        "self_attention.linear_proj.weight" if shape.len() == 2 => transposed(h("attn.c_proj.weight")),
        "self_attention.linear_proj.bias" => whole(h("attn.c_proj.bias")),
        "mlp.linear_fc1.weight" if shape.len() == 2 => transposed(h("mlp.c_fc.weight")),
        "mlp.linear_fc1.bias" => whole(h("mlp.c_fc.bias")),
        "mlp.linear_fc2.weight" if shape.len() == 2 => transposed(h("mlp.c_proj.weight")),
        "mlp.linear_fc2.bias" => whole(h("mlp.c_proj.bias")),
        _ => whole(name.into()),
    }
}

/// `dst[j * dst_stride + i] = src[i * src_stride + j]` for `i < rows`,
/// `j < cols`, elements of `elem` bytes; the slices start at element (0, 0).
pub(crate) fn transpose(
    src: &[u8],
    src_stride: usize,
    dst: &mut [u8],
    dst_stride: usize,
    rows: usize,
    cols: usize,
    elem: usize,
) {
    // Tiles, so that both sides stay in cache.
    const TILE: usize = 32;
    for i0 in (0..rows).step_by(TILE) {
        for j0 in (0..cols).step_by(TILE) {
            for i in i0..(i0 + TILE).min(rows) {
                for j in j0..(j0 + TILE).min(cols) {
                    let s = (i * src_stride + j) * elem;
                    let d = (j * dst_stride + i) * elem;
                    dst[d..d + elem].copy_from_slice(&src[s..s + elem]);
                }
            }
        }
    }
}

/// An open Hugging Face model: every tensor's file, type, shape and bytes.
#[derive(Debug)]
pub struct HfModel {
    dir: PathBuf,
    files: Vec<Mmap>,
    tensors: BTreeMap<String, HfTensor>,
}

#[derive(Clone, Debug)]
struct HfTensor {
    file: usize,
    dtype: DType,
    shape: Vec<u64>,
    range: Range<usize>,
}

#[derive(Deserialize)]
struct Index {
    weight_map: BTreeMap<String, String>,
}

/// Largest `model.safetensors.index.json` read.
const MAX_INDEX_BYTES: u64 = 256 << 20;

/// Tensors transformers' files may hold that are no weights: attention mask
/// and rotary buffers of older versions.
const BUFFER_SUFFIXES: [&str; 3] = [".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq"];

/// The Hugging Face tensors a model's state is read from.
#[derive(Debug)]
pub struct HfSources<'a> {
    /// Per tenplan tensor: boxes of rows stored as they are.
    rows: Vec<Vec<(Region, &'a [u8])>>,
    /// Per tenplan tensor: runs stored transposed, with the whole Hugging
    /// Face tensor's bytes.
    columns: Vec<Vec<(Link, &'a [u8])>>,
    unused: Vec<String>,
    differing: Vec<String>,
}

impl HfSources<'_> {
    /// Tensors of the files that no tensor of the state reads (besides
    /// known buffers), sorted: weights of layers the config does not
    /// describe, say, or DeepSeek-V3's multi-token-prediction layer.
    pub fn unused(&self) -> &[String] {
        &self.unused
    }

    /// Why some of [`HfSources::unused`] are: MTP modules' copies of the
    /// embedding or output layer that do not equal them (one line each).
    pub fn differing_copies(&self) -> &[String] {
        &self.differing
    }

    /// Fill `region` of tenplan tensor `tensor` (row-major bytes `out`).
    pub fn fill(&self, tensor: TensorId, spec: &TensorSpec, region: &Region, out: &mut [u8]) {
        let t = tensor as usize;
        let elem = spec.dtype.size() as usize;
        let boxes: Vec<SourceBox<'_>> = self.rows[t]
            .iter()
            .map(|(r, data)| SourceBox {
                tensor,
                region: r,
                data,
                file: None,
            })
            .collect();
        read_box(&boxes, region, out, elem);
        for (link, data) in &self.columns[t] {
            let (r, c) = (region.range(0), region.range(1));
            let (lo, hi) = (r.start.max(link.rows.start), r.end.min(link.rows.end));
            if lo >= hi {
                continue;
            }
            // Rows lo..hi of the region are columns of the stored matrix,
            // whose rows are the region's columns.
            let stride = link.hf_shape[1] as usize;
            let first = c.start as usize * stride + (link.at + lo - link.rows.start) as usize;
            let width = (c.end - c.start) as usize;
            transpose(
                &data[first * elem..],
                stride,
                &mut out[(lo - r.start) as usize * width * elem..],
                width,
                width,
                (hi - lo) as usize,
                elem,
            );
        }
    }
}

/// A Hugging Face model's files as they are ([`HfModel::state`]): every
/// tensor under its own name and in its own element type (a file that
/// mixes types keeps them), one stored box each on device 0.
#[derive(Debug)]
pub struct HfState {
    hf: Arc<HfModel>,
    layout: Layout,
    regions: Vec<Region>,
    scalars: BTreeSet<String>,
}

impl HfState {
    /// Tensors saved with no dimension, held as one element each.
    pub fn scalars(&self) -> &BTreeSet<String> {
        &self.scalars
    }
}

impl Source for HfState {
    fn location(&self) -> &Path {
        &self.hf.dir
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn all_boxes(&self) -> Vec<Vec<SourceBox<'_>>> {
        self.hf
            .tensors
            .values()
            .zip(&self.regions)
            .enumerate()
            .map(|(t, (h, region))| {
                vec![SourceBox {
                    tensor: t as TensorId,
                    region,
                    data: &self.hf.files[h.file][h.range.clone()],
                    file: None,
                }]
            })
            .collect()
    }

    fn prefetch(&self) {}

    fn digests(&self) -> Option<Vec<String>> {
        None
    }
}

impl HfModel {
    /// Open `model.safetensors` or an indexed set of shards.
    pub fn open(dir: &Path) -> Result<HfModel> {
        let index_path = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let names: Vec<String> = if index_path.exists() {
            // An index lists names, not data: a few MB for the largest models.
            let len = fs::metadata(&index_path).map_err(Error::io("read", &index_path))?.len();
            if len > MAX_INDEX_BYTES {
                return Err(Error::file(
                    &index_path,
                    format!("{len} bytes is too large for a safetensors index (at most {MAX_INDEX_BYTES})"),
                ));
            }
            let text = fs::read_to_string(&index_path).map_err(Error::io("read", &index_path))?;
            let index: Index = serde_json::from_str(&text)
                .map_err(|e| Error::file(&index_path, format!("not a valid safetensors index: {e}")))?;
            let mut files: Vec<String> = index.weight_map.into_values().collect();
            files.sort();
            files.dedup();
            files
        } else if single.exists() {
            vec!["model.safetensors".into()]
        } else {
            return Err(Error::file(
                dir,
                "holds neither model.safetensors nor model.safetensors.index.json",
            ));
        };
        let mut files = Vec::new();
        let mut tensors = BTreeMap::new();
        for (fi, name) in names.iter().enumerate() {
            if name.contains(['/', '\\']) || name.starts_with('.') {
                return Err(Error::file(
                    &index_path,
                    format!("file name `{name}` is not a plain name"),
                ));
            }
            let path = dir.join(name);
            let f = File::open(&path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Error::file(&index_path, format!("names shard `{name}`, which is not there"))
                } else {
                    Error::io("open", &path)(e)
                }
            })?;
            let m = map(&f).map_err(Error::io("map", &path))?;
            let (entries, _) = parse_safetensors(&path, &m)?;
            for (key, dtype, shape, range) in entries {
                let t = HfTensor {
                    file: fi,
                    dtype,
                    shape,
                    range,
                };
                if tensors.insert(key.clone(), t).is_some() {
                    return Err(Error::file(&path, format!("tensor `{key}` appears in two files")));
                }
            }
            files.push(m);
        }
        Ok(HfModel {
            dir: dir.into(),
            files,
            tensors,
        })
    }

    /// The files' state as it is: every tensor under its own name (see
    /// [`HfState`]); a tensor with a zero extent is refused by name.
    pub fn state(self: &Arc<Self>) -> Result<HfState> {
        let mut specs = Vec::with_capacity(self.tensors.len());
        let mut buffers = Vec::with_capacity(self.tensors.len());
        let mut regions = Vec::with_capacity(self.tensors.len());
        let mut scalars = BTreeSet::new();
        for (t, (name, h)) in self.tensors.iter().enumerate() {
            let shape = if h.shape.is_empty() {
                scalars.insert(name.clone());
                vec![1]
            } else {
                h.shape.clone()
            };
            if shape.contains(&0) {
                return Err(Error::file(
                    &self.dir,
                    format!("tensor `{name}` has shape {shape:?}, with no elements"),
                ));
            }
            let region = Region::full(&shape);
            buffers.push(Buffer {
                name: name.clone(),
                dtype: h.dtype,
                len: region.volume(),
                pieces: vec![Piece {
                    tensor: t as TensorId,
                    region: region.clone(),
                    offset: 0,
                }],
                partial: false,
            });
            specs.push(TensorSpec::new(name.clone(), h.dtype, shape));
            regions.push(region);
        }
        let shards = vec![Shard {
            name: "files".into(),
            devices: vec![0],
            buffers,
        }];
        let layout = Layout::new(specs.into(), shards).map_err(|e| Error::file(&self.dir, e.to_string()))?;
        Ok(HfState {
            hf: self.clone(),
            layout,
            regions,
            scalars,
        })
    }

    /// The element types of the files' tensors.
    pub fn dtypes(&self) -> BTreeSet<DType> {
        self.tensors.values().map(|t| t.dtype).collect()
    }

    /// The element type of most tensors in the files.
    pub fn dtype(&self) -> Option<DType> {
        let mut count: BTreeMap<DType, usize> = BTreeMap::new();
        for t in self.tensors.values() {
            *count.entry(t.dtype).or_default() += 1;
        }
        count
            .into_iter()
            .max_by_key(|&(d, n)| (n, std::cmp::Reverse(d)))
            .map(|(d, _)| d)
    }

    /// Number of tensors in the model files.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when the files hold no tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// A tensor by name; GPT-2's may lack the `transformer.` prefix.
    fn find(&self, name: &str) -> Option<(&str, &HfTensor)> {
        let alias = name.strip_prefix("transformer.");
        std::iter::once(name)
            .chain(alias)
            .find_map(|n| self.tensors.get_key_value(n))
            .map(|(k, t)| (k.as_str(), t))
    }

    /// How many multi-token-prediction modules the files hold after the
    /// layers of `model` (DeepSeek-V3 keeps module k as layer
    /// `layers + k`, with an `eh_proj`), not counting those whose
    /// `eh_proj` a pattern of `exclude` names (left out on purpose).
    pub fn mtp_layers(&self, model: &ModelSpec, exclude: &[String]) -> u32 {
        mtp_modules_held(
            model,
            |k| vec![mtp_eh_proj(model, k)],
            |name| self.tensors.contains_key(name) && !exclude.iter().any(|p| name.contains(p.as_str())),
        )
    }

    /// `model` with the multi-token-prediction modules the files hold
    /// ([`HfModel::mtp_layers`]).
    pub fn held(&self, model: &ModelSpec, exclude: &[String]) -> ModelSpec {
        model.with_mtp_layers(self.mtp_layers(model, exclude))
    }

    /// Where every tensor of the job's state comes from, in tensor order,
    /// checking every name, shape and element type.
    pub fn sources(&self, model: &ModelSpec, tensors: &[TensorSpec]) -> Result<HfSources<'_>> {
        let mut used: BTreeSet<&str> = BTreeSet::new();
        let mut rows = Vec::with_capacity(tensors.len());
        let mut columns = Vec::with_capacity(tensors.len());
        for spec in tensors {
            let list = if self.tensors.contains_key(&spec.name) {
                vec![Link::rows(spec.name.clone(), spec.shape.clone(), 0..spec.shape[0], 0)]
            } else {
                links(model, spec)
            };
            let (mut r, mut c) = (Vec::new(), Vec::new());
            for link in list {
                let (key, t) = self.find(&link.hf).ok_or_else(|| {
                    Error::file(
                        &self.dir,
                        format!("no tensor `{}` (needed for `{}`)", link.hf, spec.name),
                    )
                })?;
                if t.shape != link.hf_shape {
                    return Err(Error::file(
                        &self.dir,
                        format!(
                            "tensor `{key}` has shape {:?}, `{}` needs {:?}",
                            t.shape, spec.name, link.hf_shape
                        ),
                    ));
                }
                if t.dtype != spec.dtype {
                    return Err(Error::file(
                        &self.dir,
                        format!(
                            "tensor `{key}` is {}, the state wants {} (choose the element type with --dtype)",
                            t.dtype, spec.dtype
                        ),
                    ));
                }
                used.insert(key);
                let data = &self.files[t.file][t.range.clone()];
                if link.transposed {
                    c.push((link, data));
                } else {
                    let bytes = (link.hf_row_elements() * spec.dtype.size()) as usize;
                    let n = (link.rows.end - link.rows.start) as usize;
                    let start = link.at as usize * bytes;
                    let region = Region::full(&spec.shape).with_range(0, link.rows.clone());
                    r.push((region, &data[start..start + n * bytes]));
                }
            }
            rows.push(r);
            columns.push(c);
        }
        // The MTP modules' copies of the embedding and output layer are read
        // as the tensors they copy: equal bits, or left unused (named).
        let mut differing = Vec::new();
        for (copy, original) in mtp_copies(model) {
            let (Some((key, c)), Some((_, o))) = (self.find(&copy), self.find(original)) else {
                continue;
            };
            let same = c.shape == o.shape
                && c.dtype == o.dtype
                && self.files[c.file][c.range.clone()] == self.files[o.file][o.range.clone()];
            if same && used.contains(original) {
                used.insert(key);
            } else {
                differing.push(format!("`{copy}` is not `{original}`"));
            }
        }
        let unused = self
            .tensors
            .keys()
            .filter(|k| !used.contains(k.as_str()) && !BUFFER_SUFFIXES.iter().any(|s| k.ends_with(s)))
            .cloned()
            .collect();
        Ok(HfSources {
            rows,
            columns,
            unused,
            differing,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenplan_models::{find, resolve, ModelState, StateKind, MODELS};

    /// Every tenplan row goes somewhere once, and every Hugging Face
    /// tensor's rows (or columns) come from exactly one run
    /// ([`crate::hf_export::plan_hf_tensors`] checks that).
    fn check_tiling(spec: &ModelSpec) {
        let state = ModelState::new(spec, StateKind::Weights(DType::BF16));
        for t in state.tensors().iter() {
            let mut covered: Vec<Range<u64>> = links(spec, t).iter().map(|l| l.rows.clone()).collect();
            covered.sort_by_key(|r| r.start);
            let mut next = 0;
            for r in &covered {
                assert_eq!(r.start, next, "{}: rows tile", t.name);
                next = r.end;
            }
            assert_eq!(next, t.shape[0], "{}", t.name);
        }
        crate::hf_export::plan_hf_tensors(spec, state.tensors()).unwrap();
    }

    #[test]
    fn every_catalog_model_maps_onto_hugging_face_tensors_exactly_once() {
        for m in MODELS.iter().filter(|m| m.layers <= 8) {
            check_tiling(m);
        }
        // Families beyond the catalog, from small configs.
        let dir = std::env::temp_dir().join(format!("tenplan-hf-links-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in [
            (
                "qwen2",
                r#"{"model_type":"qwen2","hidden_size":32,"intermediate_size":40,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":50}"#,
            ),
            (
                "dsv3",
                r#"{"model_type":"deepseek_v3","hidden_size":32,"intermediate_size":40,"moe_intermediate_size":8,"num_hidden_layers":2,"num_attention_heads":4,"n_routed_experts":4,"n_shared_experts":1,"first_k_dense_replace":1,"q_lora_rank":8,"kv_lora_rank":8,"qk_nope_head_dim":4,"qk_rope_head_dim":2,"v_head_dim":4,"vocab_size":50}"#,
            ),
            (
                "qmoe",
                r#"{"model_type":"qwen2_moe","hidden_size":32,"intermediate_size":40,"moe_intermediate_size":8,"shared_expert_intermediate_size":16,"num_experts":4,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":1,"vocab_size":50}"#,
            ),
        ] {
            let p = dir.join(format!("{name}.json"));
            std::fs::write(&p, text).unwrap();
            check_tiling(&resolve(p.to_str().unwrap()).unwrap());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn mtp_modules_are_deepseeks_layers_after_the_last() {
        let m = find("deepseek-v3").unwrap().with_mtp_layers(1);
        check_tiling(&m);
        let state = ModelState::new(&m, StateKind::Weights(DType::BF16));
        let hf = |name: &str| {
            let t = state.tensors().iter().find(|t| t.name == name).unwrap();
            links(&m, t).into_iter().map(|l| l.hf).collect::<Vec<_>>()
        };
        assert_eq!(hf("mtp.layers.0.eh_proj.weight"), ["model.layers.61.eh_proj.weight"]);
        assert_eq!(
            hf("mtp.layers.0.final_layernorm.weight"),
            ["model.layers.61.shared_head.norm.weight"]
        );
        assert_eq!(
            hf("mtp.layers.0.transformer_layer.mlp.experts.local_experts.7.linear_fc1.weight"),
            [
                "model.layers.61.mlp.experts.7.gate_proj.weight",
                "model.layers.61.mlp.experts.7.up_proj.weight"
            ]
        );
        assert_eq!(
            mtp_copies(&m),
            [
                (
                    "model.layers.61.embed_tokens.weight".to_string(),
                    "model.embed_tokens.weight"
                ),
                ("model.layers.61.shared_head.head.weight".to_string(), "lm_head.weight"),
            ]
        );
    }

    #[test]
    fn gpt_weights_are_transposed_and_heads_interleaved() {
        let m = find("gpt-tiny").unwrap(); // hidden 16, 8 heads of 2
        let t = TensorSpec::new(
            "decoder.layers.3.self_attention.linear_qkv.weight",
            DType::F32,
            [48, 16],
        );
        let ls = links(m, &t);
        assert_eq!(ls.len(), 24);
        assert!(ls
            .iter()
            .all(|l| l.transposed && l.hf == "transformer.h.3.attn.c_attn.weight"));
        assert!(ls.iter().all(|l| l.hf_shape == [16, 48]));
        // Head 1: query rows 6..8 are columns 2..4; its key columns 18..20; value 34..36.
        let head1: Vec<(Range<u64>, u64)> = ls[3..6].iter().map(|l| (l.rows.clone(), l.at)).collect();
        assert_eq!(head1, vec![(6..8, 2), (8..10, 18), (10..12, 34)]);
    }

    #[test]
    fn transpose_moves_every_element() {
        // A 3x5 matrix of u16 into its 5x3 transpose.
        let src: Vec<u8> = (0u16..15).flat_map(|x| x.to_le_bytes()).collect();
        let mut dst = vec![0u8; 30];
        transpose(&src, 5, &mut dst, 3, 3, 5, 2);
        let got: Vec<u16> = dst.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        assert_eq!(got, [0, 5, 10, 1, 6, 11, 2, 7, 12, 3, 8, 13, 4, 9, 14]);
    }
}
