"""Check a tenplan checkpoint imported from a Hugging Face model against the
model as transformers loads it, element by element, with the fused layouts
written the way Megatron-LM's checkpoint converters build them (torch ops,
not tenplan's mapping):

- QKV per query group: `cat([q.view(g, per*d, h), k.view(g, d, h),
  v.view(g, d, h)], 1)`; GPT-2's `c_attn` transposed first;
- SwiGLU `linear_fc1` as `cat([gate, up])` (Mixtral: `w1`, `w3`);
- GPT-2's Conv1D weights transposed.

    python tests/hf/check_fused.py HF_DIR:CKPT_DIR [HF_DIR:CKPT_DIR ...]

Reads the checkpoint without tenplan (scripts/read_checkpoint.py). Exit 0
when every weight of the checkpoint equals its Hugging Face original.
"""

import json
import os
import sys

import numpy as np
import torch
from safetensors import safe_open

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
from read_checkpoint import assemble  # noqa: E402


def hf_tensors(d):
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else ["model.safetensors"]
    out = {}
    for f in files:
        with safe_open(os.path.join(d, f), "pt") as s:
            for k in s.keys():
                out[k] = s.get_tensor(k)
    return out


def fuse_qkv(q, k, v, groups):
    per = q.shape[0] // groups
    d = k.shape[0] // groups
    rest = q.shape[1:]
    return torch.cat([q.reshape(groups, per, *rest), k.reshape(groups, d, *rest),
                      v.reshape(groups, d, *rest)], 1).reshape(-1, *rest)


def expected(hf, config):
    """The Megatron-core tensors of the model, by name."""
    out = {}
    gpt2 = config["model_type"] == "gpt2"
    if gpt2:
        heads = config["n_head"]
        hd = config["n_embd"] // heads
        p = "transformer." if "transformer.wte.weight" in hf else ""
        out["embedding.word_embeddings.weight"] = hf[p + "wte.weight"]
        out["embedding.position_embeddings.weight"] = hf[p + "wpe.weight"]
        for key in ["weight", "bias"]:
            out[f"decoder.final_layernorm.{key}"] = hf[f"{p}ln_f.{key}"]
        for l in range(config["n_layer"]):
            h = f"{p}h.{l}."
            m = f"decoder.layers.{l}."
            for key in ["weight", "bias"]:
                out[m + f"input_layernorm.{key}"] = hf[h + f"ln_1.{key}"]
                out[m + f"pre_mlp_layernorm.{key}"] = hf[h + f"ln_2.{key}"]
            w = hf[h + "attn.c_attn.weight"].t()
            b = hf[h + "attn.c_attn.bias"]
            n = heads * hd
            out[m + "self_attention.linear_qkv.weight"] = fuse_qkv(w[:n], w[n:2 * n], w[2 * n:], heads)
            out[m + "self_attention.linear_qkv.bias"] = fuse_qkv(b[:n], b[n:2 * n], b[2 * n:], heads)
            out[m + "self_attention.linear_proj.weight"] = hf[h + "attn.c_proj.weight"].t()
            out[m + "self_attention.linear_proj.bias"] = hf[h + "attn.c_proj.bias"]
            out[m + "mlp.linear_fc1.weight"] = hf[h + "mlp.c_fc.weight"].t()
            out[m + "mlp.linear_fc1.bias"] = hf[h + "mlp.c_fc.bias"]
            out[m + "mlp.linear_fc2.weight"] = hf[h + "mlp.c_proj.weight"].t()
            out[m + "mlp.linear_fc2.bias"] = hf[h + "mlp.c_proj.bias"]
        return out
    groups = config.get("num_key_value_heads") or config["num_attention_heads"]
    for name, t in hf.items():
        if not name.startswith("model.layers."):
            continue
        parts = name.split(".")
        l, rest = parts[2], ".".join(parts[3:])
        m = f"decoder.layers.{l}."
        for kind in ["weight", "bias"]:
            if rest == f"self_attn.q_proj.{kind}" and f"model.layers.{l}.self_attn.k_proj.{kind}" in hf:
                a = f"model.layers.{l}.self_attn."
                out[m + f"self_attention.linear_qkv.{kind}"] = fuse_qkv(
                    t, hf[a + f"k_proj.{kind}"], hf[a + f"v_proj.{kind}"], groups)
        for gate, up, fused in [("mlp.gate_proj", "mlp.up_proj", "mlp.linear_fc1"),
                                ("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj",
                                 "mlp.shared_experts.linear_fc1"),
                                ("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj",
                                 "mlp.shared_experts.linear_fc1")]:
            if rest == gate + ".weight":
                out[m + fused + ".weight"] = torch.cat([t, hf[f"model.layers.{l}.{up}.weight"]])
        for prefix, (g, u) in [("mlp.experts.", ("gate_proj", "up_proj")),
                               ("block_sparse_moe.experts.", ("w1", "w3"))]:
            if rest.startswith(prefix) and rest.endswith(f".{g}.weight"):
                e = rest[len(prefix):].split(".")[0]
                upw = hf[f"model.layers.{l}.{prefix}{e}.{u}.weight"]
                out[m + f"mlp.experts.local_experts.{e}.linear_fc1.weight"] = torch.cat([t, upw])
    return out


def main(hf_dir, ckpt):
    config = json.load(open(os.path.join(hf_dir, "config.json")))
    hf = hf_tensors(hf_dir)
    arrays, covered, _, _ = assemble(ckpt)
    want = expected(hf, config)
    checked = 0
    for name, t in want.items():
        got = arrays[name]
        assert (covered[name] == 1).all(), name
        ref = t.contiguous()
        ref = ref.view(torch.uint16).numpy() if ref.dtype == torch.bfloat16 else ref.numpy()
        if got.shape != ref.shape or not np.array_equal(got.view(np.uint8), np.ascontiguousarray(ref).view(np.uint8)):
            print(f"{ckpt}: `{name}` differs from the Megatron layout of {hf_dir}")
            return 1
        checked += 1
    if checked == 0:
        print(f"{ckpt}: no fused tensor checked")
        return 1
    print(f"{ckpt}: {checked} fused tensors equal their Megatron layout")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(max(main(*pair.split(":")) for pair in sys.argv[1:]))
