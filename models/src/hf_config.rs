//! Models from Hugging Face `config.json` files.
//!
//! `--model` takes a catalog preset's name, a path to a `config.json`, or a
//! model directory holding one. The family comes from `model_type` (or, when
//! that is missing, from `architectures`); each family's fields are read as
//! transformers reads them, with the defaults of its configuration class
//! where a field may be left out. Fields that only change computation (rope
//! scaling, sliding windows, activation, dropout, `num_experts_per_tok`)
//! are ignored: they do not change what tensors a model has. DeepSeek's
//! `num_nextn_predict_layers` is not read either: whether a state holds its
//! multi-token-prediction modules is for the files to say (transformers
//! neither loads nor saves them), so a config's model has none
//! ([`ModelSpec::mtp_layers`]).

use std::borrow::Cow;
use std::path::Path;

use serde_json::{Map, Value};
use tenplan_ptc::limits::MAX_TENSOR_ELEMENTS;

use crate::catalog::BASE;
use crate::{find, Error, Family, Mla, ModelSpec, Result, MODELS};

/// Largest `config.json` read: real ones are a few kB.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Largest value of a size field: beyond it no tensor fits the PTC's limits.
const MAX_SIZE: u64 = 1 << 32;

/// Most tensors a model may have (DeepSeek-V3 has about 92,000).
const MAX_TENSORS: u64 = 1 << 22;

/// Most layers, and most experts per layer, read from a config (checked
/// before per-layer lists are built).
const MAX_COUNT: u64 = 1 << 16;

/// A catalog preset by name, or the model a `config.json` (or a directory
/// holding one) describes. Named after the directory the config lies in.
pub fn resolve(model: &str) -> Result<ModelSpec> {
    if let Ok(spec) = find(model) {
        return Ok(spec.clone());
    }
    let path = Path::new(model);
    if !path.is_dir() && !path.is_file() {
        return Err(Error::UnknownModel {
            name: model.to_string(),
            known: MODELS.iter().map(|m| m.name.as_ref()).collect::<Vec<_>>().join(", ")
                + ", or a path to a Hugging Face config.json or model directory",
        });
    }
    from_config_path(path)
}

/// The model a `config.json`, or a model directory holding one, describes,
/// named after the directory the config lies in.
pub fn from_config_path(path: &Path) -> Result<ModelSpec> {
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    let in_file = |why: String| Error::Config {
        file: file.display().to_string(),
        why,
    };
    if !file.is_file() {
        return Err(in_file("no config.json in the model directory".into()));
    }
    let len = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
    if len > MAX_CONFIG_BYTES {
        return Err(in_file(format!(
            "{len} bytes is too large for a model config (at most {MAX_CONFIG_BYTES})"
        )));
    }
    let text = std::fs::read_to_string(&file).map_err(|e| in_file(format!("cannot read: {e}")))?;
    let name = file
        .canonicalize()
        .ok()
        .and_then(|p| {
            p.parent()
                .and_then(|d| d.file_name())
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "model".into());
    from_hf_config(&name, &text).map_err(|e| match e {
        Error::Config { why, .. } => in_file(why),
        other => other,
    })
}

/// A config error not yet tied to a file (`resolve` names the file).
fn invalid(why: impl Into<String>) -> Error {
    Error::Config {
        file: String::new(),
        why: why.into(),
    }
}

/// The fields of one config, read with the names of the errors in mind.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    family: Family,
}

impl Fields<'_> {
    /// A positive integer field; `default` where transformers has one.
    fn size(&self, key: &str, default: Option<u64>) -> Result<u64> {
        match self.map.get(key) {
            None | Some(Value::Null) => {
                default.ok_or_else(|| invalid(format!("missing field `{key}` (a {} config needs it)", self.family)))
            }
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 && n <= MAX_SIZE => Ok(n),
                Some(0) => Err(invalid(format!("field `{key}` is 0; it must be positive"))),
                Some(n) => Err(invalid(format!(
                    "field `{key}` is {n}, more than the limit of {MAX_SIZE}"
                ))),
                None => Err(invalid(format!("field `{key}` is {v}, not a positive integer"))),
            },
        }
    }

    /// A non-negative integer field (0 allowed, `null` reads as 0).
    fn count(&self, key: &str, default: u64) -> Result<u64> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n <= MAX_SIZE) => Ok(n.as_u64().unwrap_or(0)),
            Some(v) => Err(invalid(format!("field `{key}` is {v}, not a non-negative integer"))),
        }
    }

    fn flag(&self, key: &str, default: bool) -> Result<bool> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(invalid(format!("field `{key}` is {v}, not true or false"))),
        }
    }

    /// The first of several names a field has had across transformers
    /// versions (v5 renamed `num_experts` to `num_local_experts`).
    fn u32_any(&self, keys: &[&str]) -> Result<u32> {
        let key = keys
            .iter()
            .find(|k| self.map.get(**k).is_some_and(|v| !v.is_null()))
            .unwrap_or(&keys[0]);
        self.u32(key, None)
    }

    /// A count of layers, heads or experts: at most [`MAX_COUNT`].
    fn u32(&self, key: &str, default: Option<u64>) -> Result<u32> {
        let n = self.size(key, default)?;
        if n > MAX_COUNT {
            return Err(invalid(format!(
                "field `{key}` is {n}, more than the limit of {MAX_COUNT}"
            )));
        }
        Ok(n as u32)
    }

    fn layer_list(&self, key: &str, layers: u32) -> Result<Vec<u32>> {
        let Some(v) = self.map.get(key).filter(|v| !v.is_null()) else {
            return Ok(Vec::new());
        };
        let list = v
            .as_array()
            .ok_or_else(|| invalid(format!("field `{key}` is {v}, not a list of layer indices")))?;
        let mut out = Vec::with_capacity(list.len());
        for x in list {
            match x.as_u64() {
                Some(l) if l < layers as u64 => out.push(l as u32),
                _ => {
                    return Err(invalid(format!(
                        "field `{key}` holds {x}, not a layer index below num_hidden_layers={layers}"
                    )))
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

/// The family of a config: its `model_type`, or its first architecture.
fn family_of(map: &Map<String, Value>) -> Result<Family> {
    let known = || {
        Family::ALL
            .iter()
            .filter(|f| **f != Family::Gpt)
            .map(|f| f.model_type())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(t) = map.get("model_type") {
        let t = t
            .as_str()
            .ok_or_else(|| invalid(format!("field `model_type` is {t}, not a string")))?;
        return Family::ALL
            .into_iter()
            .find(|f| *f != Family::Gpt && f.model_type() == t)
            .ok_or_else(|| invalid(format!("unknown model_type `{t}` (known: {})", known())));
    }
    let arch = map
        .get("architectures")
        .and_then(|a| a.as_array())
        .and_then(|a| a.first())
        .and_then(|a| a.as_str())
        .ok_or_else(|| invalid(format!("missing field `model_type` (one of {})", known())))?;
    let prefix = arch
        .strip_suffix("ForCausalLM")
        .or(arch.strip_suffix("LMHeadModel"))
        .unwrap_or(arch);
    let flat = |s: &str| s.replace('_', "").to_ascii_lowercase();
    Family::ALL
        .into_iter()
        .find(|f| *f != Family::Gpt && flat(f.model_type()) == flat(prefix))
        .ok_or_else(|| {
            invalid(format!(
                "unknown architecture `{arch}` and no model_type (known: {})",
                known()
            ))
        })
}

/// The model a Hugging Face `config.json` describes, named `name`.
pub fn from_hf_config(name: &str, text: &str) -> Result<ModelSpec> {
    let value: Value = serde_json::from_str(text).map_err(|e| invalid(format!("not valid JSON: {e}")))?;
    let map = value.as_object().ok_or_else(|| invalid("not a JSON object"))?;
    let family = family_of(map)?;
    let f = Fields { map, family };
    let mut spec = if family == Family::Gpt2 {
        let hidden = f.size("n_embd", None)?;
        ModelSpec {
            name: Cow::Owned(name.to_string()),
            family,
            layers: f.u32("n_layer", None)?,
            hidden,
            heads: f.u32("n_head", None)?,
            groups: f.u32("n_head", None)?,
            head_dim: 0,
            ffn: f.size("n_inner", Some(4 * hidden))?,
            vocab: f.size("vocab_size", None)?,
            seq_len: f.size("n_positions", None)?,
            tied: f.flag("tie_word_embeddings", true)?,
            qkv_bias: true,
            proj_bias: true,
            ..BASE
        }
    } else {
        llama_like(name, &f)?
    };
    if spec.head_dim == 0 {
        if !spec.hidden.is_multiple_of(spec.heads as u64) {
            return Err(invalid(format!(
                "hidden size {} is not a multiple of num_attention_heads={} (and no head_dim is given)",
                spec.hidden, spec.heads
            )));
        }
        spec.head_dim = spec.hidden / spec.heads as u64;
    }
    if spec.family.is_gpt() && !spec.tied {
        return Err(invalid(
            "field `tie_word_embeddings` is false: GPT-2 models tie their output layer",
        ));
    }
    spec.check()?;
    Ok(spec)
}

fn llama_like(name: &str, f: &Fields<'_>) -> Result<ModelSpec> {
    use Family::*;
    let family = f.family;
    let layers = f.u32("num_hidden_layers", None)?;
    let heads = f.u32("num_attention_heads", None)?;
    let moe = matches!(family, Mixtral | Qwen2Moe | Qwen3Moe | DeepseekV3);
    // Fields a config may leave out take its configuration class's default
    // (Qwen3's head_dim is 128, Qwen3-MoE's derived from the hidden size;
    // Qwen2's num_key_value_heads is 32), or, where the class has none,
    // what transformers derives.
    let class_default =
        |key: &str| crate::hf_family(family.model_type()).and_then(|c| c.defaults.get(key).and_then(Value::as_u64));
    let head_dim_default = class_default("head_dim").unwrap_or(0);
    let groups_default = class_default("num_key_value_heads").unwrap_or(heads as u64);
    let attention_bias = f.flag("attention_bias", false)?;
    let mut spec = ModelSpec {
        name: Cow::Owned(name.to_string()),
        family,
        layers,
        hidden: f.size("hidden_size", None)?,
        heads,
        groups: f.u32("num_key_value_heads", Some(groups_default))?,
        head_dim: f.count("head_dim", head_dim_default)?,
        // MoE families whose every layer has experts keep no dense size.
        ffn: if family == Mixtral {
            0
        } else {
            f.size("intermediate_size", None)?
        },
        vocab: f.size("vocab_size", None)?,
        seq_len: f.count("max_position_embeddings", 0)?,
        tied: f.flag("tie_word_embeddings", false)?,
        // Mistral and Mixtral have no biases whatever the config says.
        qkv_bias: match family {
            Qwen2 | Qwen2Moe => true,
            Mistral | Mixtral => false,
            _ => attention_bias,
        },
        proj_bias: match family {
            Qwen2 | Qwen2Moe | Mistral | Mixtral => false,
            _ => attention_bias,
        },
        mlp_bias: family == Llama && f.flag("mlp_bias", false)?,
        qk_norm: matches!(family, Qwen3 | Qwen3Moe),
        ..BASE
    };
    if !moe {
        return Ok(spec);
    }
    match family {
        Mixtral => {
            spec.experts = f.u32_any(&["num_local_experts", "num_experts"])?;
            spec.ffn = f.size("intermediate_size", None)?;
            spec.expert_ffn = spec.ffn;
        }
        Qwen2Moe | Qwen3Moe => {
            spec.experts = f.u32_any(&["num_experts", "num_local_experts"])?;
            spec.expert_ffn = f.size("moe_intermediate_size", None)?;
            if family == Qwen2Moe {
                spec.shared_ffn = f.size("shared_expert_intermediate_size", None)?;
                spec.shared_gate = true;
            }
            // transformers: a layer has experts unless listed in
            // mlp_only_layers, and only every decoder_sparse_step-th layer.
            let step = f.size("decoder_sparse_step", Some(1))?;
            let mut dense = f.layer_list("mlp_only_layers", layers)?;
            dense.extend((0..layers).filter(|l| !(*l as u64 + 1).is_multiple_of(step)));
            dense.sort_unstable();
            dense.dedup();
            spec.dense_layers = Cow::Owned(dense);
        }
        DeepseekV3 => {
            spec.experts = f.u32_any(&["n_routed_experts", "num_local_experts"])?;
            spec.expert_ffn = f.size("moe_intermediate_size", None)?;
            let shared = f.count("n_shared_experts", 0)?;
            spec.shared_ffn = spec
                .expert_ffn
                .checked_mul(shared)
                .filter(|&n| n <= MAX_SIZE)
                .ok_or_else(|| {
                    invalid(format!(
                        "n_shared_experts={shared} × moe_intermediate_size={} is more than the limit of {MAX_SIZE}",
                        spec.expert_ffn
                    ))
                })?;
            spec.router_bias = true;
            let first_dense = f.count("first_k_dense_replace", 0)?.min(layers as u64) as u32;
            spec.dense_layers = Cow::Owned((0..first_dense).collect());
            // MLA: every head has its own key and value.
            spec.groups = heads;
            spec.proj_bias = attention_bias;
            spec.mla = Some(Mla {
                q_lora_rank: f.count("q_lora_rank", 0)?,
                kv_lora_rank: f.size("kv_lora_rank", None)?,
                qk_nope_head_dim: f.size("qk_nope_head_dim", None)?,
                qk_rope_head_dim: f.size("qk_rope_head_dim", None)?,
                v_head_dim: f.size("v_head_dim", None)?,
            });
            // The query and key head size (values have their own).
            let a = spec.mla.unwrap_or_else(|| unreachable!());
            spec.head_dim = a.qk_nope_head_dim + a.qk_rope_head_dim;
        }
        _ => unreachable!("only MoE families reach here"),
    }
    Ok(spec)
}

/// The transformers configuration class and architecture of a family.
fn classes(family: Family) -> (&'static str, &'static str) {
    match family {
        Family::Gpt | Family::Gpt2 => ("gpt2", "GPT2LMHeadModel"),
        Family::Llama => ("llama", "LlamaForCausalLM"),
        Family::Mistral => ("mistral", "MistralForCausalLM"),
        Family::Qwen2 => ("qwen2", "Qwen2ForCausalLM"),
        Family::Qwen3 => ("qwen3", "Qwen3ForCausalLM"),
        Family::Mixtral => ("mixtral", "MixtralForCausalLM"),
        Family::Qwen2Moe => ("qwen2_moe", "Qwen2MoeForCausalLM"),
        Family::Qwen3Moe => ("qwen3_moe", "Qwen3MoeForCausalLM"),
        Family::DeepseekV3 => ("deepseek_v3", "DeepseekV3ForCausalLM"),
    }
}

/// A Hugging Face `config.json` for a model: the fields that decide its
/// tensors, written so that [`from_hf_config`] reads the same model back
/// (checked: a model the family's config cannot express, such as a Llama
/// with query biases but no output bias, is an error naming the field).
/// Fields that only change computation (rope, norms' epsilon) keep
/// transformers' defaults; `num_experts_per_tok` is at most 2.
pub fn to_hf_config(m: &ModelSpec) -> Result<Value> {
    use serde_json::json;
    use Family::*;
    let (model_type, arch) = classes(m.family);
    let mut c = Map::new();
    c.insert("architectures".into(), json!([arch]));
    c.insert("model_type".into(), json!(model_type));
    c.insert("vocab_size".into(), json!(m.vocab));
    c.insert("tie_word_embeddings".into(), json!(m.tied));
    if m.family.is_gpt() {
        c.insert("n_embd".into(), json!(m.hidden));
        c.insert("n_layer".into(), json!(m.layers));
        c.insert("n_head".into(), json!(m.heads));
        c.insert("n_inner".into(), json!(m.ffn));
        c.insert("n_positions".into(), json!(m.seq_len));
        // GPT-2's configuration class defaults these to token ids beyond a
        // small vocabulary.
        c.insert("bos_token_id".into(), Value::Null);
        c.insert("eos_token_id".into(), Value::Null);
    } else {
        c.insert("hidden_size".into(), json!(m.hidden));
        c.insert("num_hidden_layers".into(), json!(m.layers));
        c.insert("num_attention_heads".into(), json!(m.heads));
        c.insert("num_key_value_heads".into(), json!(m.groups));
        if m.family != DeepseekV3 {
            c.insert("head_dim".into(), json!(m.head_dim));
        }
        if m.seq_len > 0 {
            c.insert("max_position_embeddings".into(), json!(m.seq_len));
        }
        let dense_ffn = if m.ffn > 0 { m.ffn } else { m.expert_ffn };
        c.insert("intermediate_size".into(), json!(dense_ffn));
        if matches!(m.family, Llama | Qwen3 | Qwen3Moe | DeepseekV3) {
            c.insert("attention_bias".into(), json!(m.qkv_bias));
        }
        if m.family == Llama {
            c.insert("mlp_bias".into(), json!(m.mlp_bias));
        }
        let top_k = m.experts.min(2);
        match m.family {
            Mixtral => {
                c.insert("intermediate_size".into(), json!(m.expert_ffn));
                c.insert("num_local_experts".into(), json!(m.experts));
                c.insert("num_experts_per_tok".into(), json!(top_k));
            }
            Qwen2Moe | Qwen3Moe => {
                c.insert("num_experts".into(), json!(m.experts));
                c.insert("num_experts_per_tok".into(), json!(top_k));
                c.insert("moe_intermediate_size".into(), json!(m.expert_ffn));
                c.insert("decoder_sparse_step".into(), json!(1));
                c.insert("mlp_only_layers".into(), json!(m.dense_layers));
                if m.family == Qwen2Moe {
                    c.insert("shared_expert_intermediate_size".into(), json!(m.shared_ffn));
                }
            }
            DeepseekV3 => {
                let a = m.mla.unwrap_or_default();
                c.insert("n_routed_experts".into(), json!(m.experts));
                c.insert("num_experts_per_tok".into(), json!(top_k));
                c.insert("n_group".into(), json!(1));
                c.insert("topk_group".into(), json!(1));
                c.insert("moe_intermediate_size".into(), json!(m.expert_ffn));
                c.insert("n_shared_experts".into(), json!(m.shared_ffn / m.expert_ffn.max(1)));
                c.insert("first_k_dense_replace".into(), json!(m.dense_layers.len()));
                let q = if a.q_lora_rank > 0 {
                    json!(a.q_lora_rank)
                } else {
                    Value::Null
                };
                c.insert("q_lora_rank".into(), q);
                c.insert("kv_lora_rank".into(), json!(a.kv_lora_rank));
                c.insert("qk_nope_head_dim".into(), json!(a.qk_nope_head_dim));
                c.insert("qk_rope_head_dim".into(), json!(a.qk_rope_head_dim));
                c.insert("v_head_dim".into(), json!(a.v_head_dim));
                if m.mtp_layers > 0 {
                    c.insert("num_nextn_predict_layers".into(), json!(m.mtp_layers));
                }
            }
            _ => {}
        }
    }
    let config = Value::Object(c);
    let back = from_hf_config(&m.name, &config.to_string())?;
    // A config says what MTP modules a model may have, not which a state
    // holds.
    let norm = |s: &ModelSpec| ModelSpec {
        family: if s.family.is_gpt() { Gpt2 } else { s.family },
        mtp_layers: 0,
        ..s.clone()
    };
    if norm(&back) != norm(m) {
        let (a, b) = (
            serde_json::to_value(norm(m)).unwrap_or_default(),
            serde_json::to_value(norm(&back)).unwrap_or_default(),
        );
        let field = a
            .as_object()
            .and_then(|a| {
                a.iter()
                    .find(|(k, v)| b.get(k.as_str()) != Some(v))
                    .map(|(k, _)| k.clone())
            })
            .unwrap_or_default();
        return Err(invalid(format!(
            "{}: a {model_type} config.json cannot express this model (its `{field}` would read back as {})",
            m.name,
            b.get(&field).unwrap_or(&Value::Null)
        )));
    }
    Ok(config)
}

impl ModelSpec {
    /// Check that the hyper-parameters describe a model tenplan can build:
    /// positive sizes, query heads a multiple of the key/value heads, every
    /// tensor within the PTC's element limit and at most 4 Mi tensors.
    /// Specs read from files (configs, manifests) pass here before any
    /// tensor is built.
    pub fn check(&self) -> Result<()> {
        check_sizes(self).map_err(|why| invalid(format!("{}: {why}", self.name)))
    }
}

fn check_sizes(m: &ModelSpec) -> Result<(), String> {
    let gated = !m.family.is_gpt();
    for (what, v) in [
        ("layers", m.layers as u64),
        ("hidden size", m.hidden),
        ("attention heads", m.heads as u64),
        ("key/value heads", m.groups as u64),
        ("head_dim", m.head_dim),
        ("vocab_size", m.vocab),
    ] {
        if v == 0 {
            return Err(format!("{what} is 0"));
        }
    }
    if m.ffn == 0 && (!gated || (0..m.layers).any(|l| !m.is_moe_layer(l))) {
        return Err("intermediate_size is 0".into());
    }
    if m.experts > 0 && m.expert_ffn == 0 {
        return Err("moe_intermediate_size is 0".into());
    }
    if m.family.is_gpt() && m.seq_len == 0 {
        return Err("n_positions is 0".into());
    }
    if !m.heads.is_multiple_of(m.groups) {
        return Err(format!(
            "num_attention_heads={} is not a multiple of num_key_value_heads={}",
            m.heads, m.groups
        ));
    }
    if let Some(&l) = m.dense_layers.iter().find(|&&l| l >= m.layers) {
        return Err(format!("dense layer {l} is beyond the {} layers", m.layers));
    }
    if m.mtp_layers > m.layers {
        return Err(format!(
            "{} multi-token-prediction modules for {} layers",
            m.mtp_layers, m.layers
        ));
    }
    let per_layer = 40 + 2 * m.experts as u64;
    if (m.layers + m.mtp_layers) as u64 * per_layer > MAX_TENSORS {
        return Err(format!(
            "{} layers of {} experts is more than {MAX_TENSORS} tensors",
            m.layers, m.experts
        ));
    }
    // Shapes depend on the kind of a layer, not on how many there are:
    // check the tensors of a model with one layer of each kind it has and
    // one expert.
    let dense = (0..m.layers).any(|l| !m.is_moe_layer(l));
    let moe = (0..m.layers).any(|l| m.is_moe_layer(l));
    let probe = ModelSpec {
        layers: 2,
        experts: m.experts.min(1),
        dense_layers: Cow::Owned(match (dense, moe) {
            (true, true) => vec![0],
            (true, false) => vec![0, 1],
            _ => vec![],
        }),
        ..m.clone()
    };
    for p in crate::state::params_of(&probe) {
        let elements = p.shape.iter().fold(1u128, |a, &d| a * d as u128);
        if elements > MAX_TENSOR_ELEMENTS as u128 {
            return Err(format!(
                "`{}` of shape {:?} has {elements} elements, more than the limit of {MAX_TENSOR_ELEMENTS}",
                p.name
                    .replace("decoder.layers.0.", "decoder.layers.L.")
                    .replace("decoder.layers.1.", "decoder.layers.L."),
                p.shape
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ModelState, ParallelConfig, StateKind};
    use tenplan_ptc::DType;

    const QWEN2: &str = r#"{"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "vocab_size": 151936, "tie_word_embeddings": true, "rope_scaling": null}"#;

    fn err(text: &str) -> String {
        from_hf_config("m", text).unwrap_err().to_string()
    }

    #[test]
    fn qwen2_half_billion_counts_its_biases_and_ties() {
        let spec = from_hf_config("Qwen2.5-0.5B", QWEN2).unwrap();
        assert!(spec.tied && spec.qkv_bias && !spec.proj_bias);
        let state = ModelState::new(&spec, StateKind::Weights(DType::BF16));
        // transformers' own count of Qwen2.5-0.5B.
        assert_eq!(state.parameter_count(), 494_032_768);
        let cfg: ParallelConfig = "tp=2,pp=2".parse().unwrap();
        state.layout(&cfg).unwrap();
    }

    #[test]
    fn bad_configs_name_the_field() {
        assert_eq!(
            err(r#"{"model_type": "bert", "hidden_size": 8}"#),
            "unknown model_type `bert` (known: gpt2, llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, deepseek_v3)"
        );
        assert_eq!(
            err(
                r#"{"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 2, "intermediate_size": 4, "vocab_size": 9}"#
            ),
            "missing field `num_attention_heads` (a llama config needs it)"
        );
        assert_eq!(
            err(&QWEN2.replace("\"hidden_size\": 896", "\"hidden_size\": \"896\"")),
            "field `hidden_size` is \"896\", not a positive integer"
        );
        assert_eq!(
            err(&QWEN2.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3")),
            "m: num_attention_heads=14 is not a multiple of num_key_value_heads=3"
        );
        assert_eq!(
            err(&QWEN2.replace("\"vocab_size\": 151936", "\"vocab_size\": 8589934592")),
            "field `vocab_size` is 8589934592, more than the limit of 4294967296"
        );
        let huge = r#"{"model_type": "llama", "hidden_size": 1048576, "num_hidden_layers": 2,
            "num_attention_heads": 16, "intermediate_size": 4, "vocab_size": 4294967296}"#;
        assert_eq!(
            err(huge),
            "m: `embedding.word_embeddings.weight` of shape [4294967296, 1048576] has 4503599627370496 elements, more than the limit of 281474976710656"
        );
        assert!(err(r#"{"architectures": ["BertModel"]}"#).contains("unknown architecture `BertModel`"));
        assert!(err("[1, 2]").contains("not a JSON object"));
        assert!(err("{").contains("not valid JSON"));
        let spec = from_hf_config("Qwen2.5-0.5B", QWEN2).unwrap();
        let state = ModelState::new(&spec, StateKind::Training);
        let e = state.layout(&"tp=4".parse().unwrap()).unwrap_err().to_string();
        assert_eq!(
            e,
            "tp=4 does not divide the 14 attention heads (num_attention_heads) of Qwen2.5-0.5B"
        );
    }

    #[test]
    fn architectures_stand_in_for_a_missing_model_type() {
        let text = QWEN2.replace("\"model_type\": \"qwen2\"", "\"architectures\": [\"Qwen2ForCausalLM\"]");
        assert_eq!(from_hf_config("m", &text).unwrap().family, Family::Qwen2);
    }

    #[test]
    fn generated_configs_read_back_as_the_same_model() {
        for m in MODELS {
            let c = to_hf_config(m).unwrap();
            let back = from_hf_config(&m.name, &c.to_string()).unwrap();
            assert_eq!(back.tied, m.tied);
            assert_eq!(
                ModelState::new(&back, StateKind::Training).tensors(),
                ModelState::new(m, StateKind::Training).tensors(),
                "{}",
                m.name
            );
        }
        let dsv3 = r#"{"model_type":"deepseek_v3","hidden_size":32,"intermediate_size":40,"moe_intermediate_size":8,
            "num_hidden_layers":3,"num_attention_heads":4,"n_routed_experts":4,"n_shared_experts":2,
            "first_k_dense_replace":1,"q_lora_rank":null,"kv_lora_rank":8,"qk_nope_head_dim":4,
            "qk_rope_head_dim":2,"v_head_dim":4,"vocab_size":50}"#;
        let qmoe = r#"{"model_type":"qwen2_moe","hidden_size":32,"intermediate_size":40,"moe_intermediate_size":8,
            "shared_expert_intermediate_size":16,"num_experts":4,"num_hidden_layers":4,"num_attention_heads":4,
            "num_key_value_heads":1,"vocab_size":50,"decoder_sparse_step":2,"mlp_only_layers":[2]}"#;
        for text in [dsv3, qmoe, QWEN2] {
            let m = from_hf_config("m", text).unwrap();
            let back = from_hf_config("m", &to_hf_config(&m).unwrap().to_string()).unwrap();
            assert_eq!(back, m);
        }
        // A Llama with query biases but none on the output projection.
        let odd = ModelSpec {
            qkv_bias: true,
            ..find("llama-tiny").unwrap().clone()
        };
        let e = to_hf_config(&odd).unwrap_err().to_string();
        assert!(e.contains("cannot express") && e.contains("proj_bias"), "{e}");
    }

    #[test]
    fn catalog_presets_are_specs_of_the_same_code() {
        for m in MODELS {
            m.check().unwrap();
            assert_eq!(&resolve(&m.name).unwrap(), m);
        }
        let e = resolve("no-such-model").unwrap_err().to_string();
        assert!(e.contains("or a path to a Hugging Face config.json"), "{e}");
    }
}
