//! The model families, the hyper-parameters that determine a model's
//! tensors, and the named presets of the catalog.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Architecture family: which Hugging Face `model_type` a model comes from,
/// and with it the names its tensors have in Hugging Face checkpoints. What
/// tensors a model has is decided by the fields of [`ModelSpec`]; the family
/// only picks the defaults a `config.json` leaves out and the names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Family {
    /// GPT-3 as Megatron-LM builds it: LayerNorm with bias, biases on every
    /// linear layer, GeLU MLP, learned position embeddings, tied input/output
    /// embedding.
    Gpt,
    /// GPT-2 (`gpt2`): the same tensors as [`Family::Gpt`].
    Gpt2,
    /// LLaMA-1/2/3/3.1 (`llama`): RMSNorm, SwiGLU MLP, grouped-query attention.
    Llama,
    /// Mistral (`mistral`): LLaMA's tensors.
    Mistral,
    /// Qwen2/Qwen2.5 (`qwen2`): LLaMA with biases on the q, k and v projections.
    Qwen2,
    /// Qwen3 (`qwen3`): LLaMA with RMSNorm on each query and key head.
    Qwen3,
    /// Mixtral (`mixtral`): LLaMA attention with a mixture-of-experts SwiGLU MLP.
    Mixtral,
    /// Qwen2-MoE (`qwen2_moe`): Qwen2 attention, routed experts plus a gated
    /// shared expert.
    Qwen2Moe,
    /// Qwen3-MoE (`qwen3_moe`): Qwen3 attention, routed experts.
    Qwen3Moe,
    /// DeepSeek-V3 (`deepseek_v3`): multi-head latent attention, dense first
    /// layers, shared and routed experts with a router score bias.
    DeepseekV3,
}

impl Family {
    /// Every family, in the order `tenplan models` lists them.
    pub const ALL: [Family; 10] = [
        Family::Gpt,
        Family::Gpt2,
        Family::Llama,
        Family::Mistral,
        Family::Qwen2,
        Family::Qwen3,
        Family::Mixtral,
        Family::Qwen2Moe,
        Family::Qwen3Moe,
        Family::DeepseekV3,
    ];

    /// The Hugging Face `model_type` (`megatron-gpt` for Megatron's GPT-3).
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Gpt => "megatron-gpt",
            Family::Gpt2 => "gpt2",
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Mixtral => "mixtral",
            Family::Qwen2Moe => "qwen2_moe",
            Family::Qwen3Moe => "qwen3_moe",
            Family::DeepseekV3 => "deepseek_v3",
        }
    }

    /// True for the GPT families: LayerNorm with biases, a GeLU MLP with
    /// biases and learned position embeddings.
    pub fn is_gpt(self) -> bool {
        matches!(self, Family::Gpt | Family::Gpt2)
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.model_type())
    }
}

/// Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values
/// through low-rank projections, each followed by an RMSNorm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Mla {
    /// Rank of the query down-projection; 0 for a direct query projection.
    pub q_lora_rank: u64,
    /// Rank of the key/value down-projection.
    pub kv_lora_rank: u64,
    /// Per-head query/key dimensions without rotary embedding.
    pub qk_nope_head_dim: u64,
    /// Per-head query/key dimensions with rotary embedding (the key's are
    /// shared by all heads).
    pub qk_rope_head_dim: u64,
    /// Per-head value dimensions.
    pub v_head_dim: u64,
}

/// The hyper-parameters that determine a model's tensors.
///
/// Build one from a Hugging Face `config.json` with [`crate::from_hf_config`]
/// or [`crate::resolve`], or take a preset of [`MODELS`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ModelSpec {
    /// Name used on the command line and in checkpoint manifests.
    pub name: Cow<'static, str>,
    /// Family.
    pub family: Family,
    /// Transformer layers.
    pub layers: u32,
    /// Hidden size.
    pub hidden: u64,
    /// Attention (query) heads.
    pub heads: u32,
    /// Query groups (KV heads); equal to `heads` without GQA and with MLA.
    pub groups: u32,
    /// Size of one attention head (Qwen3 and Llama-3.2 set it apart from
    /// `hidden / heads`).
    pub head_dim: u64,
    /// MLP intermediate size of the dense layers.
    pub ffn: u64,
    /// Vocabulary size (unpadded).
    pub vocab: u64,
    /// Maximum sequence length (learned position embeddings).
    pub seq_len: u64,
    /// Whether the output layer is the word embedding (`tie_word_embeddings`).
    pub tied: bool,
    /// Biases on the query, key and value projections.
    pub qkv_bias: bool,
    /// A bias on the attention output projection.
    pub proj_bias: bool,
    /// Biases on the gated MLP's projections (`mlp_bias`).
    pub mlp_bias: bool,
    /// RMSNorm over each query and key head.
    pub qk_norm: bool,
    /// Multi-head latent attention in place of q/k/v projections.
    pub mla: Option<Mla>,
    /// Routed experts (0 for dense models).
    pub experts: u32,
    /// Intermediate size of one routed expert.
    pub expert_ffn: u64,
    /// Intermediate size of the shared expert(s) of an MoE layer, all
    /// shared experts together (0 for none).
    pub shared_ffn: u64,
    /// A sigmoid gate on the shared expert's output (Qwen2-MoE).
    pub shared_gate: bool,
    /// A per-expert bias of the router's scores (DeepSeek-V3's
    /// `e_score_correction_bias`).
    pub router_bias: bool,
    /// Layers of an MoE model with a dense MLP instead of experts.
    pub dense_layers: Cow<'static, [u32]>,
    /// Multi-token-prediction modules the state holds after its layers
    /// (DeepSeek-V3's `num_nextn_predict_layers`, Megatron-Core's
    /// `mtp.layers`): each an RMSNorm of the embedding and of the hidden
    /// state, a projection of the two to the hidden size, one MoE layer and
    /// a final norm; the embedding and output layer are the model's own.
    /// A config says how many a model may have, its files whether they are
    /// there (transformers does not load them): configs give 0, sources
    /// what they hold ([`ModelSpec::with_mtp_layers`]).
    #[serde(default)]
    pub mtp_layers: u32,
}

impl ModelSpec {
    /// True when layer `l` has experts.
    pub fn is_moe_layer(&self, l: u32) -> bool {
        self.experts > 0 && !self.dense_layers.contains(&l)
    }

    /// The model with `n` multi-token-prediction modules (what a source
    /// holds).
    pub fn with_mtp_layers(&self, n: u32) -> ModelSpec {
        ModelSpec {
            mtp_layers: n,
            ..self.clone()
        }
    }

    /// True when `other` is this model, whatever multi-token-prediction
    /// modules either holds: what a `config.json` can say of a state.
    pub fn same_model(&self, other: &ModelSpec) -> bool {
        self.with_mtp_layers(0) == other.with_mtp_layers(0)
    }
}

/// Every size zero and every option off: what presets and configs start from.
pub(crate) const BASE: ModelSpec = ModelSpec {
    name: Cow::Borrowed(""),
    family: Family::Llama,
    layers: 0,
    hidden: 0,
    heads: 0,
    groups: 0,
    head_dim: 0,
    ffn: 0,
    vocab: 0,
    seq_len: 0,
    tied: false,
    qkv_bias: false,
    proj_bias: false,
    mlp_bias: false,
    qk_norm: false,
    mla: None,
    experts: 0,
    expert_ffn: 0,
    shared_ffn: 0,
    shared_gate: false,
    router_bias: false,
    dense_layers: Cow::Borrowed(&[]),
    mtp_layers: 0,
};

const fn gpt(name: &'static str, layers: u32, hidden: u64, heads: u32) -> ModelSpec {
    gpt_sized(name, layers, hidden, heads, 4 * hidden, 50257, 2048)
}

const fn gpt_sized(
    name: &'static str,
    layers: u32,
    hidden: u64,
    heads: u32,
    ffn: u64,
    vocab: u64,
    seq_len: u64,
) -> ModelSpec {
    ModelSpec {
        name: Cow::Borrowed(name),
        family: Family::Gpt,
        layers,
        hidden,
        heads,
        groups: heads,
        head_dim: hidden / heads as u64,
        ffn,
        vocab,
        seq_len,
        tied: true,
        qkv_bias: true,
        proj_bias: true,
        ..BASE
    }
}

#[allow(clippy::too_many_arguments)]
const fn llama(
    name: &'static str,
    layers: u32,
    hidden: u64,
    heads: u32,
    groups: u32,
    ffn: u64,
    vocab: u64,
    seq_len: u64,
) -> ModelSpec {
    ModelSpec {
        name: Cow::Borrowed(name),
        family: Family::Llama,
        layers,
        hidden,
        heads,
        groups,
        head_dim: hidden / heads as u64,
        ffn,
        vocab,
        seq_len,
        ..BASE
    }
}

#[allow(clippy::too_many_arguments)]
const fn mixtral(
    name: &'static str,
    layers: u32,
    hidden: u64,
    heads: u32,
    groups: u32,
    ffn: u64,
    vocab: u64,
    seq_len: u64,
    experts: u32,
) -> ModelSpec {
    let mut m = llama(name, layers, hidden, heads, groups, ffn, vocab, seq_len);
    m.family = Family::Mixtral;
    m.experts = experts;
    m.expert_ffn = ffn;
    m
}

/// DeepSeek-V3 (671B) as its `config.json` describes it: multi-head latent
/// attention, three dense layers, then 256 routed experts and one shared
/// expert per layer (the multi-token-prediction layer, which transformers
/// does not load, is left out).
const DEEPSEEK_V3: ModelSpec = ModelSpec {
    name: Cow::Borrowed("deepseek-v3"),
    family: Family::DeepseekV3,
    layers: 61,
    hidden: 7168,
    heads: 128,
    groups: 128,
    head_dim: 192,
    ffn: 18432,
    vocab: 129280,
    seq_len: 163840,
    mla: Some(Mla {
        q_lora_rank: 1536,
        kv_lora_rank: 512,
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
    }),
    experts: 256,
    expert_ffn: 2048,
    shared_ffn: 2048,
    router_bias: true,
    dense_layers: Cow::Borrowed(&[0, 1, 2]),
    ..BASE
};

/// A Kimi-K2-like model: DeepSeek-V3's architecture with 384 routed experts,
/// 64 attention heads, one dense layer and a 163,840-token vocabulary
/// (moonshotai/Kimi-K2-Instruct's `config.json`), about 1.03T parameters.
const KIMI_K2: ModelSpec = ModelSpec {
    name: Cow::Borrowed("kimi-k2"),
    heads: 64,
    groups: 64,
    vocab: 163840,
    seq_len: 131072,
    experts: 384,
    dense_layers: Cow::Borrowed(&[0]),
    ..DEEPSEEK_V3
};

/// A Qwen3-235B-A22B-like model: 94 layers, 64 query heads over 4 key/value
/// heads of 128, QK-norm, 128 routed experts of 1536 (Qwen/Qwen3-235B-A22B's
/// `config.json`), about 235B parameters.
const QWEN3_235B: ModelSpec = ModelSpec {
    name: Cow::Borrowed("qwen3-235b-a22b"),
    family: Family::Qwen3Moe,
    layers: 94,
    hidden: 4096,
    heads: 64,
    groups: 4,
    head_dim: 128,
    ffn: 12288,
    vocab: 151936,
    seq_len: 40960,
    qk_norm: true,
    experts: 128,
    expert_ffn: 1536,
    ..BASE
};

/// Every model preset tenplan knows by name. GPT-3 sizes follow Table 2.1 of
/// the GPT-3 paper with Megatron-LM's head counts (1.3B: 16 heads of 128;
/// 13B: hidden 5120), vocabulary 50257 (GPT-2 BPE) and 2048 positions. LLaMA
/// sizes (Llama 3.1 405B included) follow the published `config.json` files;
/// Mixtral-8x7B and DeepSeek-V3 likewise. The
/// `*-tiny` models are small members of each family for tests and examples.
/// Any other model comes from its Hugging Face `config.json` through the same
/// code ([`crate::resolve`]).
pub const MODELS: &[ModelSpec] = &[
    gpt("gpt3-350m", 24, 1024, 16),
    gpt("gpt3-1.3b", 24, 2048, 16),
    gpt("gpt3-2.7b", 32, 2560, 32),
    gpt("gpt3-6.7b", 32, 4096, 32),
    gpt("gpt3-13b", 40, 5120, 40),
    gpt("gpt3-175b", 96, 12288, 96),
    llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
    llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
    mixtral("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768, 8),
    llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256, 131072),
    DEEPSEEK_V3,
    KIMI_K2,
    QWEN3_235B,
    gpt_sized("gpt-tiny", 8, 16, 8, 64, 100, 32),
    llama("llama-tiny", 4, 16, 8, 4, 24, 100, 32),
    mixtral("mixtral-tiny", 2, 16, 4, 2, 16, 64, 32, 4),
];

/// Look a catalog preset up by name.
pub fn find(name: &str) -> Result<&'static ModelSpec> {
    MODELS
        .iter()
        .find(|m| m.name == name)
        .ok_or_else(|| Error::UnknownModel {
            name: name.to_string(),
            known: MODELS.iter().map(|m| m.name.as_ref()).collect::<Vec<_>>().join(", "),
        })
}
