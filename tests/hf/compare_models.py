"""Load two Hugging Face model directories with transformers and compare
every weight bit for bit: what `tenplan export` wrote against the model it
imported.

    python tests/hf/compare_models.py ORIGINAL:EXPORTED [ORIGINAL:EXPORTED ...]

Exit 0 when every exported model loads with no missing, unexpected or
mismatched keys, has the original's model class and dtype, holds every
tensor of the original's state dict with identical bits, and runs a forward
pass; where the original directory holds logits.pt (a batch and the
original's logits on it, tests/hf/make_families.py), the exported model's
logits on that batch must equal them exactly. A pair of one directory with
itself only checks that it loads cleanly.
"""

import os

import sys

import torch
import transformers


def load(path):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        path, output_loading_info=True, dtype="auto")
    return model, {k: v for k, v in info.items() if v}


def bits(t):
    # Compare bit patterns, so that NaNs and signed zeros count too.
    return t.reshape(-1).contiguous().view(torch.uint8) if t.dtype != torch.bool else t


def main(pairs):
    bad = 0
    for pair in pairs:
        original, path = pair.split(":")
        a, pa = load(original)
        assert not pa, f"{original}: {pa}"
        b, pb = load(path)
        if pb:
            print(f"{path}: loading reported {pb}")
            bad += 1
            continue
        if type(a) is not type(b) or a.dtype != b.dtype:
            print(f"{path}: {type(b).__name__} {b.dtype}, the original is {type(a).__name__} {a.dtype}")
            bad += 1
            continue
        sa, sb = a.state_dict(), b.state_dict()
        if sa.keys() != sb.keys():
            print(f"{path}: keys differ: {sorted(set(sa) ^ set(sb))[:5]}")
            bad += 1
            continue
        for k in sa:
            if sa[k].shape != sb[k].shape or sa[k].dtype != sb[k].dtype or not torch.equal(bits(sa[k]), bits(sb[k])):
                print(f"{path}: `{k}` differs")
                bad += 1
                break
        else:
            dtype = b.dtype
            expected = os.path.join(original, "logits.pt")
            if os.path.exists(expected):
                saved = torch.load(expected)
                with torch.no_grad():
                    logits = b(input_ids=saved["input_ids"]).logits
                if not torch.equal(bits(logits), bits(saved["logits"])):
                    diff = (logits.float() - saved["logits"].float()).abs().max().item()
                    print(f"{path}: logits differ from the original's (max |diff| {diff})")
                    bad += 1
                    continue
            # And it runs: a forward pass gives finite logits over the vocabulary.
            with torch.no_grad():
                # (in float32: CPU kernels of some MoE layers want 16-byte strides)
                logits = b.float()(torch.tensor([[1, 2, 3]])).logits
            if logits.shape[-1] != b.config.vocab_size or not torch.isfinite(logits.float()).all():
                print(f"{path}: a forward pass gives logits of shape {tuple(logits.shape)} that are not all finite")
                bad += 1
                continue
            same = ", logits equal" if os.path.exists(expected) else ""
            print(f"{path}: {len(sa)} tensors identical ({type(b).__name__}, {dtype}){same}, forward pass ok")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
