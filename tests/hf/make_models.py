"""Write small Hugging Face models of every family tenplan reads, with real
transformers, from configs (no downloads): the fixtures of tests/hf_models.rs.

    python tests/hf/make_models.py OUT [--dtype bfloat16] [--shard-size 200KB] [--only NAME ...] [--suffix S]
    python tests/hf/make_models.py OUT --mtp [--dtype bfloat16]

Each family goes to OUT/<name>/ (config.json, model.safetensors or shards and
an index), and OUT/<name>/expected.json records what transformers says of it:
the parameter count of the module and the sum of the shapes stored in the
safetensors files.
"""

import argparse
import json
import os
import sys

import torch
import transformers
from safetensors import safe_open

COMMON = dict(vocab_size=96, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
              max_position_embeddings=64)

CONFIGS = {
    # GQA 2:1, untied.
    "llama": ("LlamaConfig", dict(COMMON, num_key_value_heads=2, intermediate_size=48)),
    # Llama-3.2 style: tied, explicit head_dim apart from hidden/heads, biases.
    "llama-tied-bias": ("LlamaConfig", dict(COMMON, num_key_value_heads=1, intermediate_size=40,
                                            head_dim=16, tie_word_embeddings=True,
                                            attention_bias=True, mlp_bias=True)),
    "mistral": ("MistralConfig", dict(COMMON, num_key_value_heads=2, intermediate_size=48,
                                      sliding_window=16)),
    "qwen2": ("Qwen2Config", dict(COMMON, num_key_value_heads=2, intermediate_size=48,
                                  tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(COMMON, num_key_value_heads=2, intermediate_size=48,
                                  head_dim=12)),
    "mixtral": ("MixtralConfig", dict(COMMON, num_key_value_heads=2, intermediate_size=24,
                                      num_local_experts=4, num_experts_per_tok=2)),
    "qwen2-moe": ("Qwen2MoeConfig", dict(COMMON, num_key_value_heads=2, intermediate_size=40,
                                         moe_intermediate_size=16, shared_expert_intermediate_size=24,
                                         num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                                         mlp_only_layers=[1])),
    "qwen3-moe": ("Qwen3MoeConfig", dict(COMMON, num_key_value_heads=2, intermediate_size=40,
                                         moe_intermediate_size=16, num_experts=4,
                                         num_experts_per_tok=2, head_dim=8, decoder_sparse_step=2)),
    "deepseek-v3": ("DeepseekV3Config", dict(COMMON, num_key_value_heads=4, intermediate_size=40,
                                             moe_intermediate_size=12, n_routed_experts=4,
                                             n_shared_experts=2, num_experts_per_tok=2, n_group=2,
                                             topk_group=1, first_k_dense_replace=1, q_lora_rank=24,
                                             kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                                             v_head_dim=6)),
    "deepseek-v3-no-q-lora": ("DeepseekV3Config", dict(COMMON, num_key_value_heads=4, intermediate_size=40,
                                                       moe_intermediate_size=12, n_routed_experts=4,
                                                       n_shared_experts=1, num_experts_per_tok=2,
                                                       n_group=1, topk_group=1, first_k_dense_replace=2,
                                                       q_lora_rank=None, kv_lora_rank=16,
                                                       qk_nope_head_dim=8, qk_rope_head_dim=4,
                                                       v_head_dim=8)),
    "gpt2": ("GPT2Config", dict(vocab_size=96, n_embd=32, n_layer=3, n_head=4, n_positions=64,
                                bos_token_id=None, eos_token_id=None)),
}

# Published architectures at full size: written as config.json alone, their
# counts taken from the module built on the meta device (no memory, no
# download). DeepSeek-V3's multi-token-prediction layer is not part of the
# transformers module, so 671B, not the 685B of its published files.
PUBLISHED = {
    "Llama-3.1-8B": ("LlamaConfig", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                         max_position_embeddings=131072,
                                         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                           high_freq_factor=4.0,
                                                           original_max_position_embeddings=8192))),
    "Mistral-7B-v0.1": ("MistralConfig", dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                              num_hidden_layers=32, num_attention_heads=32,
                                              num_key_value_heads=8)),
    "Qwen2.5-0.5B": ("Qwen2Config", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                         tie_word_embeddings=True)),
    "Qwen2.5-7B": ("Qwen2Config", dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4)),
    "Qwen3-8B": ("Qwen3Config", dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                                     head_dim=128)),
    "Mixtral-8x7B": ("MixtralConfig", dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                           num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                           num_local_experts=8)),
    "Qwen1.5-MoE-A2.7B": ("Qwen2MoeConfig", dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632,
                                                 moe_intermediate_size=1408,
                                                 shared_expert_intermediate_size=5632, num_experts=60,
                                                 num_hidden_layers=24, num_attention_heads=16,
                                                 num_key_value_heads=16)),
    "Qwen3-235B-A22B": ("Qwen3MoeConfig", dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                                               moe_intermediate_size=1536, num_experts=128,
                                               num_experts_per_tok=8, num_hidden_layers=94,
                                               num_attention_heads=64, num_key_value_heads=4, head_dim=128)),
    "DeepSeek-V3": ("DeepseekV3Config", dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                                             moe_intermediate_size=2048, num_hidden_layers=61,
                                             num_attention_heads=128, num_key_value_heads=128,
                                             n_shared_experts=1, n_routed_experts=256, n_group=8, topk_group=4,
                                             num_experts_per_tok=8, first_k_dense_replace=3, q_lora_rank=1536,
                                             kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                                             v_head_dim=128, num_nextn_predict_layers=1)),
    "gpt2": ("GPT2Config", dict()),
}


def meta_counts(model):
    """Elements a save_pretrained would store: every parameter once (tied
    ones once) and the persistent buffers."""
    keys = set(model.state_dict().keys())
    params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() for n, b in model.named_buffers() if n in keys)
    return params, params + buffers


def write_mtp(out, dtype, shard_size):
    """DeepSeek-V3 as DeepSeek publishes it: the model transformers saves,
    plus its multi-token-prediction module as layer `num_hidden_layers`
    (README_WEIGHTS.md of deepseek-ai/DeepSeek-V3): `enorm`, `hnorm`,
    `eh_proj`, `shared_head.norm`, one MoE decoder layer, and copies of the
    embedding and output layer (`embed_tokens`, `shared_head.head`), which
    transformers neither builds nor loads. Writes OUT/deepseek-v3-mtp and
    OUT/deepseek-v3-mtp-unshared (whose `embed_tokens` copy differs)."""
    from safetensors.torch import save_file

    cls, kw = CONFIGS["deepseek-v3"]
    layers = kw["num_hidden_layers"]
    for name, unshared in (("deepseek-v3-mtp", False), ("deepseek-v3-mtp-unshared", True)):
        torch.manual_seed(1)
        config = getattr(transformers, cls)(**kw, num_nextn_predict_layers=1)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
        # One more layer, written as transformers writes layers: its files
        # give the decoder layer of the MTP module.
        deeper = transformers.AutoModelForCausalLM.from_config(
            getattr(transformers, cls)(**dict(kw, num_hidden_layers=layers + 1)), dtype=dtype)
        with torch.no_grad():
            for p in list(model.parameters()) + list(deeper.parameters()):
                p.copy_(torch.randn(p.shape, dtype=torch.float32).to(dtype))
        path = os.path.join(out, name)
        model.save_pretrained(path, max_shard_size=shard_size)
        deeper_path = path + ".deeper"
        deeper.save_pretrained(deeper_path)
        mtp = {}
        prefix = f"model.layers.{layers}."
        with safe_open(os.path.join(deeper_path, "model.safetensors"), "pt") as f:
            for key in f.keys():
                if key.startswith(prefix):
                    mtp[key] = f.get_tensor(key)
        h = kw["hidden_size"]
        for norm in ("enorm", "hnorm", "shared_head.norm"):
            mtp[f"{prefix}{norm}.weight"] = torch.randn(h).to(dtype)
        mtp[f"{prefix}eh_proj.weight"] = torch.randn(h, 2 * h).to(dtype)
        state = model.state_dict()
        mtp[f"{prefix}embed_tokens.weight"] = state["model.embed_tokens.weight"].clone()
        mtp[f"{prefix}shared_head.head.weight"] = state["lm_head.weight"].clone()
        if unshared:
            mtp[f"{prefix}embed_tokens.weight"][0, 0] += 1
        save_file(mtp, os.path.join(path, "model-mtp.safetensors"), metadata={"format": "pt"})
        index_path = os.path.join(path, "model.safetensors.index.json")
        with open(index_path) as f:
            index = json.load(f)
        for key in mtp:
            index["weight_map"][key] = "model-mtp.safetensors"
        with open(index_path, "w") as f:
            json.dump(index, f, indent=2)
        for entry in os.listdir(deeper_path):
            os.remove(os.path.join(deeper_path, entry))
        os.rmdir(deeper_path)
        print(name, len(mtp), "MTP tensors", file=sys.stderr)


def stored_elements(path):
    files = []
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    total, tensors = 0, 0
    for name in files:
        with safe_open(os.path.join(path, name), "pt") as f:
            for key in f.keys():
                n = 1
                for d in f.get_slice(key).get_shape():
                    n *= d
                total += n
                tensors += 1
    return total, tensors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--shard-size", default="200KB")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--suffix", default="", help="appended to each model's directory name")
    ap.add_argument("--published", action="store_true",
                    help="full-size published architectures: config.json and counts only")
    ap.add_argument("--mtp", action="store_true",
                    help="DeepSeek-V3 with its multi-token-prediction module, as DeepSeek publishes it")
    args = ap.parse_args()
    if args.mtp:
        write_mtp(args.out, getattr(torch, args.dtype), args.shard_size)
        return
    if args.published:
        for name, (cls, kw) in PUBLISHED.items():
            if args.only and name not in args.only:
                continue
            config = getattr(transformers, cls)(**kw)
            with torch.device("meta"):
                model = transformers.AutoModelForCausalLM.from_config(config)
            module, stored = meta_counts(model)
            path = os.path.join(args.out, name)
            config.save_pretrained(path)
            expected = {"family": cls, "module_parameters": module, "stored_elements": stored,
                        "transformers": transformers.__version__}
            with open(os.path.join(path, "expected.json"), "w") as f:
                json.dump(expected, f, indent=1)
            print(name, json.dumps(expected), file=sys.stderr)
        return
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    for name, (cls, kw) in CONFIGS.items():
        if args.only and name not in args.only:
            continue
        config = getattr(transformers, cls)(**kw)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
        # Random weights everywhere (norms too), so a wrong mapping shows.
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, dtype=torch.float32).to(dtype))
        path = os.path.join(args.out, name + args.suffix)
        model.save_pretrained(path, max_shard_size=args.shard_size)
        elements, tensors = stored_elements(path)
        expected = {
            "family": cls,
            "module_parameters": sum(p.numel() for p in model.parameters()),
            "stored_elements": elements,
            "stored_tensors": tensors,
            "transformers": transformers.__version__,
        }
        with open(os.path.join(path, "expected.json"), "w") as f:
            json.dump(expected, f, indent=1)
        print(name, json.dumps(expected), file=sys.stderr)


if __name__ == "__main__":
    main()
