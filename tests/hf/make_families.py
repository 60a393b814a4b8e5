"""Write one tiny causal-LM per transformers family, from the family's own
config class (no downloads): the fixtures of tests/hf_families.rs.

    python tests/hf/make_families.py OUT [--dtype bfloat16|float32] [--only TYPE ...]

Each family goes to OUT/<model_type>/ (config.json and model.safetensors, as
`save_pretrained` writes them after `from_pretrained` read them back: what a
user's files look like, DeepSeek's f32 router bias in a bf16 model
included) with OUT/<model_type>/logits.pt, a fixed batch and the model's
logits on it. OUT/families.json lists what was written and, for a family
transformers itself cannot build at these sizes, why.
"""

import argparse
import inspect
import json
import os
import sys
import traceback

import torch
import transformers
from transformers import CONFIG_MAPPING, AutoModelForCausalLM

# The 36 widely used causal-LM families the round trip covers.
FAMILIES = [
    "llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v3", "gpt2",
    "gemma", "gemma2", "gemma3_text", "phi", "phi3", "starcoder2", "olmo", "olmo2", "cohere", "cohere2",
    "glm", "glm4", "gpt_neox", "falcon", "llama4_text", "gpt_oss", "granite", "granitemoe", "exaone4",
    "qwen3_next", "minimax", "ernie4_5", "hunyuan_v1_dense", "smollm3", "seed_oss", "apertus",
    "deepseek_v2",
]

# Small sizes, offered to every config class under the names families use;
# each class takes the ones it declares. Heads split by 2 (tp=2).
SIZES = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
    # GPT-2 and Falcon's older names.
    n_embd=64, n_layer=2, n_head=4, n_positions=64, n_inner=96,
    # Mixtures of experts.
    num_local_experts=4, num_experts=4, n_routed_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=32, shared_expert_intermediate_size=48, n_shared_experts=1,
    n_group=1, topk_group=1, first_k_dense_replace=1, decoder_sparse_step=1,
    # Multi-head latent attention.
    q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
    # Hybrid attention (qwen3_next): small linear-attention heads.
    linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4, full_attention_interval=2,
    # MiniMax: its layer types, and no lightning attention block size surprises.
    block_size=16, sliding_window=16,
    # A padding token inside the small vocabulary.
    pad_token_id=0,
)

# Fields some families need set otherwise to build at these sizes.
OVERRIDES = {
    "gpt2": dict(bos_token_id=None, eos_token_id=None),
    "phi": dict(partial_rotary_factor=0.5),
    "falcon": dict(new_decoder_architecture=True, num_kv_heads=2, alibi=False, parallel_attn=True, bias=False),
    "gpt_neox": dict(rotary_pct=0.5, use_parallel_residual=True),
    "llama4_text": dict(interleave_moe_layer_step=1, intermediate_size_mlp=96, no_rope_layers=[1, 1],
                        attention_chunk_size=16),
    "gpt_oss": dict(num_local_experts=4, layer_types=["sliding_attention", "full_attention"]),
    "minimax": dict(layer_types=["linear_attention", "full_attention"]),
    "qwen3_next": dict(layer_types=["linear_attention", "full_attention"], mlp_only_layers=[]),
    # MLA: every head has its keys and values; the rotary part is the
    # head_dim its rotary embedding sees.
    "deepseek_v2": dict(head_dim=8, num_key_value_heads=4),
    "deepseek_v3": dict(head_dim=8, num_key_value_heads=4),
}


def accepted(cls):
    """The keyword arguments a config class declares."""
    names = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            names |= set(inspect.signature(init).parameters)
        names |= set(getattr(klass, "__annotations__", {}))
    return names


def build(model_type, dtype):
    cls = CONFIG_MAPPING[model_type]
    names = accepted(cls)
    kwargs = {k: v for k, v in SIZES.items() if k in names}
    kwargs.update(OVERRIDES.get(model_type, {}))
    config = cls(**kwargs)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    # Weights a fresh module leaves at a constant (norms at one, biases at
    # zero) get noise, so that a misplaced one shows.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p, dtype=torch.float32).to(p.dtype) * 0.02)
    return model.eval()


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 128, (2, 12), generator=g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    os.makedirs(a.out, exist_ok=True)
    written, failed = [], {}
    for model_type in a.only or FAMILIES:
        d = os.path.join(a.out, model_type)
        try:
            build(model_type, dtype).save_pretrained(d)
            # Read back and saved again, as a user's files are.
            model = AutoModelForCausalLM.from_pretrained(d, dtype=dtype).eval()
            model.save_pretrained(d)
            ids = batch()
            with torch.no_grad():
                logits = model(input_ids=ids).logits
            torch.save({"input_ids": ids, "logits": logits}, os.path.join(d, "logits.pt"))
            written.append(model_type)
        except Exception as e:  # transformers' own failure at these sizes
            failed[model_type] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            if os.environ.get("TENPLAN_DEBUG"):
                traceback.print_exc()
    with open(os.path.join(a.out, "families.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "dtype": a.dtype, "written": written,
                   "failed": failed}, f, indent=1)
    print(json.dumps({"written": len(written), "failed": failed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
