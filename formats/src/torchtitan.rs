//! torchtitan's names for a Llama or Qwen3 model's tensors, and the row
//! order its Llama's query and key projections keep.
//!
//! torchtitan's Llama keeps the state dict of Meta's original code
//! (`tok_embeddings`, `layers.N.attention.wq`, `feed_forward.w1`, `output`;
//! since torchtitan 0.3 the projections sit under
//! `attention.qkv_linear.` and the output layer is `lm_head`) and applies
//! rotary embeddings to interleaved pairs of each head's dimensions, where
//! transformers rotates its two halves. Its own converter
//! (`Llama3StateDictAdapter.to_hf`) therefore permutes the rows of `wq` and
//! `wk` within every head: Hugging Face row `h·d + a·d/2 + b` (head `h`,
//! half `a`, index `b`) is torchtitan row `h·d + 2b + a`. tenplan reads a
//! torchtitan checkpoint through the same map, one row at a time for the
//! permuted projections. torchtitan's dense Qwen3 uses the same names (and
//! `attention.q_norm`, `attention.k_norm`) and transformers' rotary
//! embedding (`CosSinRoPE`): its rows are in transformers' order, as its
//! converter (`Qwen3StateDictAdapter.to_hf`) says. Its Qwen3-MoE keeps a
//! layer's routed experts in three grouped stacks
//! (`moe.routed_experts.inner_experts.w1_EFD`, `w3_EFD` of shape
//! `[experts, ffn, hidden]`, `w2_EDF` of `[experts, hidden, ffn]`): expert
//! `e`'s `gate_proj`, `up_proj` and `down_proj` at index `e`
//! ([`titan_expert`]), and the router as `moe.router.gate`. Its
//! DeepSeek-V3 (`DeepSeekV3StateDictAdapter`) has the same MoE and dense
//! names, multi-head latent attention's projections as `attention.wq` (or
//! `wq_a`, `q_norm`, `wq_b` with a query low rank), `wkv_a`, `kv_norm`,
//! `wkv_b`, shared experts as `moe.shared_experts.w1..3`, and its routing
//! bias `moe.expert_bias_E` is transformers' `mlp.gate.e_score_correction_bias`;
//! its rotary embedding is interleaved, as transformers' DeepSeek-V3
//! (`rope_interleave`) keeps its weights, so rows are as saved.

use tenplan_models::{Family, ModelSpec};

/// The Hugging Face name of a torchtitan tensor (either convention) of a
/// model of transformers' `model_type` (`attention.q_norm` is Qwen3's
/// query norm, DeepSeek-V3's query low-rank norm), if it is one.
pub fn hf_name(model_type: Option<&str>, titan: &str) -> Option<String> {
    let deepseek = model_type == Some("deepseek_v3");
    match titan {
        "tok_embeddings.weight" => return Some("model.embed_tokens.weight".into()),
        "norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" | "lm_head.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    if let Some((k, what)) = titan.strip_prefix("mtp_layers.").and_then(|r| r.split_once('.')) {
        // An MTP module: its own norms and projection, and a decoder
        // layer's names. Numbered from 0 here (the name says what kind of
        // tensor it is, as a tensor-parallel plan's patterns ask).
        k.parse::<u32>().ok()?;
        return match what {
            "enorm.weight" | "hnorm.weight" | "eh_proj.weight" => Some(format!("model.layers.{k}.{what}")),
            "mtp_norm.weight" => Some(format!("model.layers.{k}.shared_head.norm.weight")),
            _ => hf_name(model_type, &format!("layers.{k}.{what}")),
        };
    }
    let (layer, what) = titan.strip_prefix("layers.")?.split_once('.')?;
    layer.parse::<u32>().ok()?;
    let what = what
        .strip_prefix("attention.qkv_linear.")
        .map_or(what.to_string(), |w| format!("attention.{w}"));
    let hf = match what.as_str() {
        "attention.wq.weight" => "self_attn.q_proj.weight",
        "attention.wk.weight" => "self_attn.k_proj.weight",
        "attention.wv.weight" => "self_attn.v_proj.weight",
        "attention.wo.weight" => "self_attn.o_proj.weight",
        "feed_forward.w1.weight" => "mlp.gate_proj.weight",
        "feed_forward.w2.weight" => "mlp.down_proj.weight",
        "feed_forward.w3.weight" => "mlp.up_proj.weight",
        "attention_norm.weight" => "input_layernorm.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "attention.q_norm.weight" if deepseek => "self_attn.q_a_layernorm.weight",
        "attention.q_norm.weight" => "self_attn.q_norm.weight",
        "attention.k_norm.weight" => "self_attn.k_norm.weight",
        "attention.wq_a.weight" => "self_attn.q_a_proj.weight",
        "attention.wq_b.weight" => "self_attn.q_b_proj.weight",
        "attention.wkv_a.weight" => "self_attn.kv_a_proj_with_mqa.weight",
        "attention.kv_norm.weight" => "self_attn.kv_a_layernorm.weight",
        "attention.wkv_b.weight" => "self_attn.kv_b_proj.weight",
        "moe.router.gate.weight" => "mlp.gate.weight",
        "moe.shared_experts.w1.weight" => "mlp.shared_experts.gate_proj.weight",
        "moe.shared_experts.w2.weight" => "mlp.shared_experts.down_proj.weight",
        "moe.shared_experts.w3.weight" => "mlp.shared_experts.up_proj.weight",
        "moe.expert_bias_E" if deepseek => "mlp.gate.e_score_correction_bias",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}"))
}

/// Whether torchtitan has a model of `model`'s family and shape: its
/// Llama 3 (no attention biases or query/key norms), its Qwen3 and
/// Qwen3-MoE, its DeepSeek-V3.
fn torchtitan_has(model: &ModelSpec) -> bool {
    match model.family {
        Family::Llama => !model.qkv_bias && !model.qk_norm,
        Family::Qwen3 | Family::Qwen3Moe => !model.qkv_bias,
        Family::DeepseekV3 => true,
        _ => false,
    }
}

/// Whether `model` is a MoE family whose experts torchtitan groups.
fn grouped_experts(model: &ModelSpec) -> bool {
    matches!(model.family, Family::Qwen3Moe | Family::DeepseekV3) && torchtitan_has(model)
}

/// The names torchtitan may save a Hugging Face tensor of `model` under,
/// newest convention first (none for a family torchtitan does not
/// describe).
pub fn titan_names(model: &ModelSpec, hf: &str) -> Vec<String> {
    if !torchtitan_has(model) {
        return Vec::new();
    }
    match hf {
        "model.embed_tokens.weight" => return vec!["tok_embeddings.weight".into()],
        "model.norm.weight" => return vec!["norm.weight".into()],
        "lm_head.weight" => return vec!["lm_head.weight".into(), "output.weight".into()],
        _ => {}
    }
    let Some((layer, what)) = hf.strip_prefix("model.layers.").and_then(|r| r.split_once('.')) else {
        return Vec::new();
    };
    // DeepSeek-V3's MTP modules (layers after the last in Hugging Face's
    // files) are torchtitan's `mtp_layers.K`, named as its converter maps
    // them; it keeps no copies of the embedding and output head.
    if let Some(k) = mtp_index(model, layer) {
        let p = format!("mtp_layers.{k}.");
        return match what {
            "enorm.weight" | "hnorm.weight" | "eh_proj.weight" => vec![format!("{p}{what}")],
            "shared_head.norm.weight" => vec![format!("{p}mtp_norm.weight")],
            "embed_tokens.weight" | "shared_head.head.weight" => Vec::new(),
            _ => titan_names(&model.with_mtp_layers(0), &format!("model.layers.{layer}.{what}"))
                .into_iter()
                .map(|n| n.replacen(&format!("layers.{layer}."), &p, 1))
                .collect(),
        };
    }
    let attention = |w: &str| {
        vec![
            format!("layers.{layer}.attention.qkv_linear.{w}.weight"),
            format!("layers.{layer}.attention.{w}.weight"),
        ]
    };
    let one = |w: &str| vec![format!("layers.{layer}.{w}")];
    match what {
        "self_attn.q_proj.weight" => attention("wq"),
        "self_attn.k_proj.weight" => attention("wk"),
        "self_attn.v_proj.weight" => attention("wv"),
        "self_attn.o_proj.weight" => one("attention.wo.weight"),
        "mlp.gate_proj.weight" => one("feed_forward.w1.weight"),
        "mlp.down_proj.weight" => one("feed_forward.w2.weight"),
        "mlp.up_proj.weight" => one("feed_forward.w3.weight"),
        "input_layernorm.weight" => one("attention_norm.weight"),
        "post_attention_layernorm.weight" => one("ffn_norm.weight"),
        "self_attn.q_norm.weight" => one("attention.q_norm.weight"),
        "self_attn.k_norm.weight" => one("attention.k_norm.weight"),
        "self_attn.q_a_proj.weight" => one("attention.wq_a.weight"),
        "self_attn.q_a_layernorm.weight" => one("attention.q_norm.weight"),
        "self_attn.q_b_proj.weight" => one("attention.wq_b.weight"),
        "self_attn.kv_a_proj_with_mqa.weight" => one("attention.wkv_a.weight"),
        "self_attn.kv_a_layernorm.weight" => one("attention.kv_norm.weight"),
        "self_attn.kv_b_proj.weight" => one("attention.wkv_b.weight"),
        "mlp.gate.weight" if grouped_experts(model) => one("moe.router.gate.weight"),
        "mlp.gate.e_score_correction_bias" if model.family == Family::DeepseekV3 => one("moe.expert_bias_E"),
        "mlp.shared_experts.gate_proj.weight" => one("moe.shared_experts.w1.weight"),
        "mlp.shared_experts.down_proj.weight" => one("moe.shared_experts.w2.weight"),
        "mlp.shared_experts.up_proj.weight" => one("moe.shared_experts.w3.weight"),
        _ => Vec::new(),
    }
}

/// Which MTP module Hugging Face's layer `layer` of `model` is, if it is
/// one (DeepSeek-V3 numbers them after the model's layers).
fn mtp_index(model: &ModelSpec, layer: &str) -> Option<u32> {
    let k = layer.parse::<u32>().ok()?.checked_sub(model.layers)?;
    (k < model.mtp_layers).then_some(k)
}

/// The tensors torchtitan's model of `model` saves beside its weights,
/// with their shapes: its Qwen3-MoE layers' routing bias
/// (`moe.expert_bias_E`), which transformers' Qwen3-MoE has no place for
/// (DeepSeek-V3's is a weight of transformers' model).
pub fn titan_buffers(model: &ModelSpec) -> Vec<(String, Vec<u64>)> {
    if model.family != Family::Qwen3Moe || !torchtitan_has(model) {
        return Vec::new();
    }
    (0..model.layers)
        .filter(|&l| model.is_moe_layer(l))
        .map(|l| (format!("layers.{l}.moe.expert_bias_E"), vec![u64::from(model.experts)]))
        .collect()
}

/// Where torchtitan's MoE keeps a Hugging Face expert tensor of `model`:
/// the grouped stack's name and the expert's index on its first axis
/// (the tensor lies whole from the stack's first row on).
pub fn titan_expert(model: &ModelSpec, hf: &str) -> Option<(String, u64)> {
    if !grouped_experts(model) {
        return None;
    }
    let (layer, rest) = hf.strip_prefix("model.layers.")?.split_once(".mlp.experts.")?;
    layer.parse::<u32>().ok()?;
    let (expert, what) = rest.split_once('.')?;
    let stack = match what {
        "gate_proj.weight" => "w1_EFD",
        "up_proj.weight" => "w3_EFD",
        "down_proj.weight" => "w2_EDF",
        _ => return None,
    };
    let at = match mtp_index(model, layer) {
        Some(k) => format!("mtp_layers.{k}"),
        None => format!("layers.{layer}"),
    };
    Some((
        format!("{at}.moe.routed_experts.inner_experts.{stack}"),
        expert.parse().ok()?,
    ))
}

/// For a Hugging Face tensor whose rows torchtitan keeps in its rotary
/// order (its Llama's query and key projections), the map from a Hugging
/// Face row to torchtitan's; `None` for every other tensor.
pub fn rotary_rows(model: &ModelSpec, hf: &str) -> Option<impl Fn(u64) -> u64> {
    if model.family != Family::Llama {
        return None;
    }
    let d = model.head_dim;
    let projection = hf.strip_prefix("model.layers.")?.split_once('.')?.1;
    if !matches!(projection, "self_attn.q_proj.weight" | "self_attn.k_proj.weight") || !d.is_multiple_of(2) {
        return None;
    }
    Some(move |row: u64| {
        let (head, within) = (row / d, row % d);
        let (half, index) = (within / (d / 2), within % (d / 2));
        head * d + 2 * index + half
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenplan_models::find;

    #[test]
    fn names_map_both_ways_in_both_conventions() {
        let m = find("llama-tiny").unwrap();
        for hf in [
            "model.embed_tokens.weight",
            "model.layers.3.self_attn.q_proj.weight",
            "model.layers.0.self_attn.o_proj.weight",
            "model.layers.1.mlp.gate_proj.weight",
            "model.layers.1.post_attention_layernorm.weight",
            "lm_head.weight",
        ] {
            let names = titan_names(m, hf);
            assert!(!names.is_empty(), "{hf}");
            for t in names {
                assert_eq!(hf_name(Some("llama"), &t).as_deref(), Some(hf), "{t}");
            }
        }
        assert_eq!(
            titan_names(m, "model.layers.2.self_attn.k_proj.weight"),
            [
                "layers.2.attention.qkv_linear.wk.weight",
                "layers.2.attention.wk.weight"
            ]
        );
        assert!(titan_names(find("mixtral-tiny").unwrap(), "model.embed_tokens.weight").is_empty());
        // Qwen3: its query and key norms too, its rows as transformers'.
        let mut q = m.clone();
        (q.family, q.qk_norm) = (Family::Qwen3, true);
        let norm = "model.layers.1.self_attn.k_norm.weight";
        assert_eq!(titan_names(&q, norm), ["layers.1.attention.k_norm.weight"]);
        assert_eq!(
            hf_name(Some("qwen3"), "layers.1.attention.k_norm.weight").as_deref(),
            Some(norm)
        );
        assert!(rotary_rows(&q, "model.layers.0.self_attn.q_proj.weight").is_none());
        assert!(rotary_rows(m, "model.layers.0.self_attn.q_proj.weight").is_some());
        // Qwen3-MoE: each expert at its index of a grouped stack.
        (q.family, q.experts) = (Family::Qwen3Moe, 4);
        assert_eq!(
            titan_expert(&q, "model.layers.1.mlp.experts.3.down_proj.weight"),
            Some(("layers.1.moe.routed_experts.inner_experts.w2_EDF".into(), 3))
        );
        assert_eq!(
            titan_names(&q, "model.layers.0.mlp.gate.weight"),
            ["layers.0.moe.router.gate.weight"]
        );
        assert!(titan_expert(m, "model.layers.1.mlp.experts.3.down_proj.weight").is_none());
        // DeepSeek-V3: latent attention, shared experts, its routing bias a
        // weight of transformers' model; both ways.
        (q.family, q.qk_norm) = (Family::DeepseekV3, false);
        for (hf, titan) in [
            (
                "model.layers.1.self_attn.q_a_layernorm.weight",
                "layers.1.attention.q_norm.weight",
            ),
            (
                "model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
                "layers.1.attention.wkv_a.weight",
            ),
            (
                "model.layers.0.self_attn.kv_b_proj.weight",
                "layers.0.attention.wkv_b.weight",
            ),
            (
                "model.layers.1.mlp.shared_experts.up_proj.weight",
                "layers.1.moe.shared_experts.w3.weight",
            ),
            (
                "model.layers.1.mlp.gate.e_score_correction_bias",
                "layers.1.moe.expert_bias_E",
            ),
            ("model.layers.1.mlp.gate.weight", "layers.1.moe.router.gate.weight"),
        ] {
            assert_eq!(titan_names(&q, hf), [titan]);
            assert_eq!(hf_name(Some("deepseek_v3"), titan).as_deref(), Some(hf), "{titan}");
        }
        assert!(titan_buffers(&q).is_empty());
        assert_eq!(
            titan_expert(&q, "model.layers.2.mlp.experts.0.gate_proj.weight"),
            Some(("layers.2.moe.routed_experts.inner_experts.w1_EFD".into(), 0))
        );
        // Its MTP module: DeepSeek's layer `layers`, torchtitan's
        // `mtp_layers.0`, as its converter maps them; no copies of the
        // embedding and head.
        let mtp = q.with_mtp_layers(1);
        let l = mtp.layers;
        for (what, titan) in [
            ("enorm.weight", "mtp_layers.0.enorm.weight"),
            ("eh_proj.weight", "mtp_layers.0.eh_proj.weight"),
            ("shared_head.norm.weight", "mtp_layers.0.mtp_norm.weight"),
            ("self_attn.kv_b_proj.weight", "mtp_layers.0.attention.wkv_b.weight"),
            ("mlp.gate.e_score_correction_bias", "mtp_layers.0.moe.expert_bias_E"),
        ] {
            assert_eq!(titan_names(&mtp, &format!("model.layers.{l}.{what}")), [titan]);
        }
        assert!(titan_names(&mtp, &format!("model.layers.{l}.embed_tokens.weight")).is_empty());
        assert!(titan_names(&q, &format!("model.layers.{l}.eh_proj.weight")).is_empty());
        assert_eq!(
            titan_expert(&mtp, &format!("model.layers.{l}.mlp.experts.3.down_proj.weight")),
            Some(("mtp_layers.0.moe.routed_experts.inner_experts.w2_EDF".into(), 3))
        );
        // Its tensor-parallel kind: as a decoder layer's.
        assert_eq!(
            hf_name(Some("deepseek_v3"), "mtp_layers.0.attention.wo.weight").as_deref(),
            Some("model.layers.0.self_attn.o_proj.weight")
        );
    }

    #[test]
    fn rotary_rows_are_torchtitans_permutation() {
        // transformers' permute: w.view(heads, d/2, 2, in).transpose(1, 2)
        // takes torchtitan row h·d + 2b + a to Hugging Face row h·d + a·d/2 + b.
        let mut m = find("llama-tiny").unwrap().clone();
        m.head_dim = 8;
        let p = rotary_rows(&m, "model.layers.0.self_attn.q_proj.weight").unwrap();
        let rows: Vec<u64> = (0..16).map(&p).collect();
        assert_eq!(rows, [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15]);
        assert!(rotary_rows(&m, "model.layers.0.self_attn.v_proj.weight").is_none());
    }
}
