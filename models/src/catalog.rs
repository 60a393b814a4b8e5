//! The model families and their sizes.

use crate::{Error, Result};

/// Architecture family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Family {
    /// GPT-3 as Megatron-LM builds it: LayerNorm with bias, biases on every
    /// linear layer, GeLU MLP, learned position embeddings, tied input/output
    /// embedding.
    Gpt,
    /// LLaMA-2/3: RMSNorm, no biases, SwiGLU MLP, grouped-query attention,
    /// untied output layer.
    Llama,
    /// Mixtral: LLaMA attention with a mixture-of-experts SwiGLU MLP.
    Mixtral,
}

/// The hyper-parameters that determine a model's tensors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    /// Name used on the command line.
    pub name: &'static str,
    /// Family.
    pub family: Family,
    /// Transformer layers.
    pub layers: u32,
    /// Hidden size.
    pub hidden: u64,
    /// Attention (query) heads.
    pub heads: u32,
    /// Query groups (KV heads); equal to `heads` without GQA.
    pub groups: u32,
    /// MLP intermediate size (per expert for MoE).
    pub ffn: u64,
    /// Vocabulary size (unpadded).
    pub vocab: u64,
    /// Maximum sequence length (learned position embeddings).
    pub seq_len: u64,
    /// Number of experts (0 for dense models).
    pub experts: u32,
}

impl ModelSpec {
    /// Size of one attention head.
    pub fn head_dim(&self) -> u64 {
        self.hidden / self.heads as u64
    }
}

const fn gpt(name: &'static str, layers: u32, hidden: u64, heads: u32) -> ModelSpec {
    ModelSpec {
        name,
        family: Family::Gpt,
        layers,
        hidden,
        heads,
        groups: heads,
        ffn: 4 * hidden,
        vocab: 50257,
        seq_len: 2048,
        experts: 0,
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
        name,
        family: Family::Llama,
        layers,
        hidden,
        heads,
        groups,
        ffn,
        vocab,
        seq_len,
        experts: 0,
    }
}

/// Every model tenplan knows. GPT-3 sizes follow Table 2.1 of the GPT-3 paper
/// with Megatron-LM's head counts (1.3B: 16 heads of 128; 13B: hidden 5120),
/// vocabulary 50257 (GPT-2 BPE) and 2048 positions. LLaMA sizes follow the
/// published `config.json` files; Mixtral-8x7B likewise. The `*-tiny` models
/// are small members of each family for tests and examples.
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
    ModelSpec {
        name: "mixtral-8x7b",
        family: Family::Mixtral,
        layers: 32,
        hidden: 4096,
        heads: 32,
        groups: 8,
        ffn: 14336,
        vocab: 32000,
        seq_len: 32768,
        experts: 8,
    },
    ModelSpec {
        name: "gpt-tiny",
        family: Family::Gpt,
        layers: 8,
        hidden: 16,
        heads: 8,
        groups: 8,
        ffn: 64,
        vocab: 100,
        seq_len: 32,
        experts: 0,
    },
    llama("llama-tiny", 4, 16, 8, 4, 24, 100, 32),
    ModelSpec {
        name: "mixtral-tiny",
        family: Family::Mixtral,
        layers: 2,
        hidden: 16,
        heads: 4,
        groups: 2,
        ffn: 16,
        vocab: 64,
        seq_len: 32,
        experts: 4,
    },
];

/// Look a model up by name.
pub fn find(name: &str) -> Result<&'static ModelSpec> {
    MODELS
        .iter()
        .find(|m| m.name == name)
        .ok_or_else(|| Error::UnknownModel {
            name: name.to_string(),
            known: MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", "),
        })
}
