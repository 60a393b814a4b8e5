"""Compare two Hugging Face model directories file by file and through
transformers: what `tenplan export` wrote against the files it imported,
where the files hold more than transformers loads (DeepSeek-V3's
multi-token-prediction layer, say).

    python tests/hf/compare_files.py ORIGINAL:EXPORTED [ORIGINAL:EXPORTED ...]

Exit 0 when, for every pair, the safetensors files hold the same tensor
names, each with the same dtype, shape and bits (however the files are
sharded), and transformers loads both with the same loading report
(missing, unexpected, mismatched keys) and equal logits on a fixed batch.
Prints one line per pair.
"""

import glob
import os
import sys

import torch
import transformers
from safetensors import safe_open


def tensors(path):
    out = {}
    for name in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        with safe_open(name, "pt") as f:
            for key in f.keys():
                out[key] = f.get_tensor(key)
    return out


def bits(t):
    return t.reshape(-1).contiguous().view(torch.uint8)


def load(path):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, dtype="auto")
    return model, {k: sorted(v) if isinstance(v, (set, list)) else v for k, v in info.items()}


def main(pairs):
    bad = 0
    for pair in pairs:
        original, path = pair.split(":")
        a, b = tensors(original), tensors(path)
        if a.keys() != b.keys():
            print(f"{path}: tensors differ: {sorted(set(a) ^ set(b))[:5]}")
            bad += 1
            continue
        differ = [k for k in a if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape
                  or not torch.equal(bits(a[k]), bits(b[k]))]
        if differ:
            print(f"{path}: {len(differ)} tensors differ, first `{differ[0]}`")
            bad += 1
            continue
        (ma, ia), (mb, ib) = load(original), load(path)
        if ia != ib:
            print(f"{path}: transformers reports {ib}, for the original {ia}")
            bad += 1
            continue
        batch = torch.tensor([[1, 2, 3, 4, 5]])
        with torch.no_grad():
            la, lb = ma.float()(batch).logits, mb.float()(batch).logits
        if not torch.equal(la, lb):
            print(f"{path}: logits differ (max |diff| {(la - lb).abs().max().item()})")
            bad += 1
            continue
        unexpected = len(ib.get("unexpected_keys", []))
        print(f"{path}: {len(a)} tensors bit-identical, same loading report ({unexpected} unexpected), logits equal")
    return bad


if __name__ == "__main__":
    sys.exit(1 if main(sys.argv[1:]) else 0)
