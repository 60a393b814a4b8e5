//! Unsharded Hugging Face safetensors models as a source of global tensors.
//!
//! A model directory holds `model.safetensors`, or shards
//! `model-0000k-of-0000N.safetensors` listed by `model.safetensors.index.json`
//! (`{"weight_map": {name: file}}`). Each tensor of the job's state is found
//! either under its own name (Megatron-core names, as tenplan's catalog uses)
//! or, for LLaMA- and Mixtral-style models, under the Hugging Face
//! transformers names, converted as Megatron-LM's loaders do:
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
//! | `decoder.layers.L.mlp.router.weight` | `model.layers.L.block_sparse_moe.gate.weight` |
//! | `decoder.layers.L.mlp.experts.local_experts.E.linear_fc1.weight` | `w1` stacked on `w3` of `model.layers.L.block_sparse_moe.experts.E` |
//! | `decoder.layers.L.mlp.experts.local_experts.E.linear_fc2.weight` | `model.layers.L.block_sparse_moe.experts.E.w2.weight` |
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
//! The query and key rows are taken as stored (Hugging Face's rotary layout,
//! which Megatron-core's `rotate_half` rotary embedding also uses).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde::Deserialize;
use tenplan_ptc::{DType, Region, TensorId, TensorSpec};

use crate::checkpoint::{map, parse_safetensors};
use crate::{Error, Result, SourceBox};

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

/// The stored boxes of one tensor: row ranges of it, with their bytes.
pub type RowSources<'a> = Vec<(Region, &'a [u8])>;

/// The head layout needed to split a fused QKV weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    /// Query heads.
    pub heads: u64,
    /// Key/value groups.
    pub groups: u64,
    /// Size of one head.
    pub head_dim: u64,
}

/// A row range of a global tensor taken from rows of a Hugging Face tensor.
#[derive(Clone, Debug)]
struct Rows {
    hf: String,
    /// Rows of the tenplan tensor.
    to: Range<u64>,
    /// First row in the Hugging Face tensor.
    from: u64,
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
            let f = File::open(&path).map_err(Error::io("open", &path))?;
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

    /// The source boxes of every tensor of the job, in tensor order, checking
    /// every name, shape and element type.
    pub fn sources(&self, tensors: &[TensorSpec], heads: Heads) -> Result<Vec<RowSources<'_>>> {
        tensors
            .iter()
            .map(|spec| {
                let rows = self.rows_of(spec, heads)?;
                let cols: u64 = spec.shape[1..].iter().product();
                let elem = spec.dtype.size();
                rows.into_iter()
                    .map(|r| {
                        let t = &self.tensors[&r.hf];
                        let start = t.range.start + (r.from * cols * elem) as usize;
                        let len = ((r.to.end - r.to.start) * cols * elem) as usize;
                        let region = Region::full(&spec.shape).with_range(0, r.to.clone());
                        Ok((region, &self.files[t.file][start..start + len]))
                    })
                    .collect()
            })
            .collect()
    }

    fn get(&self, name: &str, spec: &TensorSpec, shape: &[u64]) -> Result<&HfTensor> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| Error::file(&self.dir, format!("no tensor `{name}` (needed for `{}`)", spec.name)))?;
        if t.shape != shape {
            return Err(Error::file(
                &self.dir,
                format!(
                    "tensor `{name}` has shape {:?}, `{}` needs {shape:?}",
                    t.shape, spec.name
                ),
            ));
        }
        if t.dtype != spec.dtype {
            return Err(Error::file(
                &self.dir,
                format!(
                    "tensor `{name}` is {}, the state wants {} (choose the element type with --dtype)",
                    t.dtype, spec.dtype
                ),
            ));
        }
        Ok(t)
    }

    /// Where the rows of one tenplan tensor come from.
    fn rows_of(&self, spec: &TensorSpec, h: Heads) -> Result<Vec<Rows>> {
        let whole = |hf: &str| -> Result<Vec<Rows>> {
            self.get(hf, spec, &spec.shape)?;
            Ok(vec![Rows {
                hf: hf.into(),
                to: 0..spec.shape[0],
                from: 0,
            }])
        };
        if self.tensors.contains_key(&spec.name) {
            return whole(&spec.name);
        }
        let name = spec.name.as_str();
        let cols = &spec.shape[1..];
        let with_rows = |rows: u64| -> Vec<u64> { std::iter::once(rows).chain(cols.iter().copied()).collect() };
        // Two Hugging Face tensors stacked along rows.
        let stacked = |a: &str, b: &str| -> Result<Vec<Rows>> {
            let half = spec.shape[0] / 2;
            self.get(a, spec, &with_rows(half))?;
            self.get(b, spec, &with_rows(half))?;
            Ok(vec![
                Rows {
                    hf: a.into(),
                    to: 0..half,
                    from: 0,
                },
                Rows {
                    hf: b.into(),
                    to: half..2 * half,
                    from: 0,
                },
            ])
        };
        match name {
            "embedding.word_embeddings.weight" => return whole("model.embed_tokens.weight"),
            "decoder.final_layernorm.weight" => return whole("model.norm.weight"),
            "output_layer.weight" => return whole("lm_head.weight"),
            _ => {}
        }
        let Some(rest) = name.strip_prefix("decoder.layers.") else {
            return whole(name);
        };
        let (layer, what) = rest.split_once('.').unwrap_or((rest, ""));
        let p = format!("model.layers.{layer}");
        // Mixtral keeps its router and experts under `block_sparse_moe` with
        // w1/w2/w3; the other MoE families under `mlp` with gate/up/down.
        let mixtral = self.tensors.contains_key(&format!("{p}.block_sparse_moe.gate.weight"));
        let attn = |s: &str| format!("{p}.self_attn.{s}");
        match what {
            "input_layernorm.weight" => whole(&format!("{p}.input_layernorm.weight")),
            "pre_mlp_layernorm.weight" => whole(&format!("{p}.post_attention_layernorm.weight")),
            "self_attention.linear_proj.weight" => whole(&attn("o_proj.weight")),
            "self_attention.linear_proj.bias" => whole(&attn("o_proj.bias")),
            "self_attention.q_layernorm.weight" => whole(&attn("q_norm.weight")),
            "self_attention.k_layernorm.weight" => whole(&attn("k_norm.weight")),
            "self_attention.linear_q_down_proj.weight" => whole(&attn("q_a_proj.weight")),
            "self_attention.linear_q_down_proj.bias" => whole(&attn("q_a_proj.bias")),
            "self_attention.linear_q_up_proj.layer_norm_weight" => whole(&attn("q_a_layernorm.weight")),
            "self_attention.linear_q_up_proj.weight" => whole(&attn("q_b_proj.weight")),
            "self_attention.linear_q_proj.weight" => whole(&attn("q_proj.weight")),
            "self_attention.linear_kv_down_proj.weight" => whole(&attn("kv_a_proj_with_mqa.weight")),
            "self_attention.linear_kv_down_proj.bias" => whole(&attn("kv_a_proj_with_mqa.bias")),
            "self_attention.linear_kv_up_proj.layer_norm_weight" => whole(&attn("kv_a_layernorm.weight")),
            "self_attention.linear_kv_up_proj.weight" => whole(&attn("kv_b_proj.weight")),
            "mlp.linear_fc2.weight" => whole(&format!("{p}.mlp.down_proj.weight")),
            "mlp.linear_fc2.bias" => whole(&format!("{p}.mlp.down_proj.bias")),
            "mlp.linear_fc1.weight" => {
                stacked(&format!("{p}.mlp.gate_proj.weight"), &format!("{p}.mlp.up_proj.weight"))
            }
            "mlp.linear_fc1.bias" => stacked(&format!("{p}.mlp.gate_proj.bias"), &format!("{p}.mlp.up_proj.bias")),
            "mlp.router.weight" if mixtral => whole(&format!("{p}.block_sparse_moe.gate.weight")),
            "mlp.router.weight" => whole(&format!("{p}.mlp.gate.weight")),
            "mlp.router.expert_bias" => whole(&format!("{p}.mlp.gate.e_score_correction_bias")),
            "mlp.shared_experts.gate_weight" => whole(&format!("{p}.mlp.shared_expert_gate.weight")),
            "self_attention.linear_qkv.weight" | "self_attention.linear_qkv.bias" => {
                let kind = if what.ends_with("weight") { "weight" } else { "bias" };
                let (q, k, v) = (
                    attn(&format!("q_proj.{kind}")),
                    attn(&format!("k_proj.{kind}")),
                    attn(&format!("v_proj.{kind}")),
                );
                let per = h.heads / h.groups.max(1);
                self.get(&q, spec, &with_rows(h.heads * h.head_dim))?;
                self.get(&k, spec, &with_rows(h.groups * h.head_dim))?;
                self.get(&v, spec, &with_rows(h.groups * h.head_dim))?;
                let block = (per + 2) * h.head_dim;
                let mut rows = Vec::new();
                for g in 0..h.groups {
                    let at = g * block;
                    let qn = per * h.head_dim;
                    rows.push(Rows {
                        hf: q.clone(),
                        to: at..at + qn,
                        from: g * qn,
                    });
                    rows.push(Rows {
                        hf: k.clone(),
                        to: at + qn..at + qn + h.head_dim,
                        from: g * h.head_dim,
                    });
                    rows.push(Rows {
                        hf: v.clone(),
                        to: at + qn + h.head_dim..at + block,
                        from: g * h.head_dim,
                    });
                }
                Ok(rows)
            }
            other => {
                if let Some(w) = other.strip_prefix("mlp.shared_experts.") {
                    // Qwen2-MoE has one `shared_expert`, DeepSeek `shared_experts`.
                    let one = format!("{p}.mlp.shared_expert");
                    let x = if self.tensors.contains_key(&format!("{one}.gate_proj.weight")) {
                        one
                    } else {
                        format!("{p}.mlp.shared_experts")
                    };
                    match w {
                        "linear_fc1.weight" => {
                            return stacked(&format!("{x}.gate_proj.weight"), &format!("{x}.up_proj.weight"))
                        }
                        "linear_fc2.weight" => return whole(&format!("{x}.down_proj.weight")),
                        _ => {}
                    }
                }
                if let Some(e) = other.strip_prefix("mlp.experts.local_experts.") {
                    let (e, w) = e.split_once('.').unwrap_or((e, ""));
                    let (x, [gate, up, down]) = if mixtral {
                        (format!("{p}.block_sparse_moe.experts.{e}"), ["w1", "w3", "w2"])
                    } else {
                        (format!("{p}.mlp.experts.{e}"), ["gate_proj", "up_proj", "down_proj"])
                    };
                    match w {
                        "linear_fc1.weight" => {
                            return stacked(&format!("{x}.{gate}.weight"), &format!("{x}.{up}.weight"))
                        }
                        "linear_fc2.weight" => return whole(&format!("{x}.{down}.weight")),
                        _ => {}
                    }
                }
                whole(name)
            }
        }
    }
}

/// Borrow source boxes in the form the writers take.
pub fn as_boxes<'a>(tensor: TensorId, rows: &'a [(Region, &'a [u8])]) -> Vec<SourceBox<'a>> {
    rows.iter()
        .map(|(region, data)| SourceBox { tensor, region, data })
        .collect()
}
