"""Load what tenplan writes with real torch.distributed.checkpoint.load
(HuggingFaceStorageReader) into DTensors of other placements, on 4 gloo
processes (CPU), and compare every local shard bit for bit with the same
placement of the expected tensors.

    python tests/dcp/load_hf.py PAIRS.json

PAIRS.json is a list of {"export": DIR, "original": DIR} (a Hugging Face
directory tenplan exported, and the transformers original) and of
{"ckpt": DIR, "original": DIR} (a tenplan checkpoint, its rank files read by
DCP through their DCP_SHARDING_INFO, under tenplan's names). A checkpoint's
expected tensors are its files assembled by scripts/read_checkpoint.py
(every element stored once, digests equal to the manifest's), and its fused
QKV and SwiGLU tensors must equal the Megatron layout torch builds from the
original (tests/hf/check_fused.py). Placements: a 1-D
mesh of 4 ranks with Shard(0) (uneven where 4 does not divide the rows), and
a 2x2 mesh with Shard(0) x Shard(1) for matrices, Replicate x Shard(0) for
vectors. Prints one JSON object (pairs, tensors and elements compared,
mismatches) and exits 1 on any mismatch.
"""

import glob
import json
import os
import socket
import sys
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from safetensors import safe_open
from torch.distributed.checkpoint import HuggingFaceStorageReader
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

WORLD = 4
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
sys.path.insert(0, os.path.join(HERE, "..", "hf"))
from check_fused import expected as megatron_layout  # noqa: E402
from read_checkpoint import assemble  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_all(d):
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        with safe_open(f, "pt") as s:
            for k in s.keys():
                out[k] = s.get_tensor(k)
    return out


def checkpoint_tensors(ckpt, original):
    """The tensors of a tenplan checkpoint, assembled without tenplan and
    checked against the manifest and against the original's Megatron layout."""
    import xxhash
    arrays, covered, manifest, _ = assemble(ckpt)
    dtypes = {t["name"]: t["dtype"] for t in manifest["tensors"]}
    out = {}
    for t in manifest["tensors"]:
        name = t["name"]
        assert (covered[name] == 1).all(), f"{ckpt}: {name} not stored exactly once"
        digest = "xxh3-128:" + xxhash.xxh3_128(arrays[name].tobytes()).hexdigest()
        assert digest == t["digest"], f"{ckpt}: {name} digest"
        x = torch.from_numpy(arrays[name].copy())
        out[name] = x.view(torch.bfloat16) if dtypes[name] == "bf16" else x
    config = json.load(open(os.path.join(original, "config.json")))
    fused = megatron_layout(read_all(original), config)
    assert fused, f"{ckpt}: no fused tensor to check"
    for name, want in fused.items():
        assert torch.equal(bits(out[name]), bits(want)), f"{ckpt}: {name} is not the Megatron layout of {original}"
    return out


def bits(t):
    # Bit patterns, so that the comparison is exact (NaNs and signed zeros too).
    view = {2: torch.int16, 4: torch.int32, 8: torch.int64, 1: torch.uint8}[t.element_size()]
    return t.contiguous().view(view)


def run(rank, port, pairs, result_path):
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    flat = init_device_mesh("cpu", (WORLD,))
    grid = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tensors = elements = 0
    bad = []
    try:
        for pair in pairs:
            path = pair.get("export") or pair["ckpt"]
            if "ckpt" in pair:
                exported = original = checkpoint_tensors(pair["ckpt"], pair["original"])
            else:
                exported = read_all(pair["export"])
                original = read_all(pair["original"])
            for mesh, place_of in [
                (flat, lambda t: [Shard(0)]),
                (grid, lambda t: [Shard(0), Shard(1)] if t.dim() >= 2 else [Replicate(), Shard(0)]),
            ]:
                state = {
                    k: distribute_tensor(torch.zeros(v.shape, dtype=v.dtype), mesh, place_of(v))
                    for k, v in exported.items()
                }
                dcp.load(state, storage_reader=HuggingFaceStorageReader(path))
                for k, dt in state.items():
                    want = original.get(k)
                    if want is None:
                        bad.append(f"{path}: {k} is not in the original")
                        continue
                    mine = distribute_tensor(want, mesh, place_of(want)).to_local()
                    got = dt.to_local()
                    if got.dtype != mine.dtype or got.shape != mine.shape or not torch.equal(bits(got), bits(mine)):
                        bad.append(f"{path}: {k} differs on rank {rank} ({mesh.mesh.tolist()})")
                    tensors += 1
                    elements += got.numel()
            missing = set(original) - set(exported)
            if missing and rank == 0:
                bad.append(f"{path}: lacks {sorted(missing)[:3]}")
        gathered = [None] * WORLD
        dist.all_gather_object(gathered, dict(tensors=tensors, elements=elements, bad=bad))
        if rank == 0:
            total = dict(pairs=len(pairs), shards_compared=sum(g["tensors"] for g in gathered),
                         elements=sum(g["elements"] for g in gathered),
                         mismatches=[b for g in gathered for b in g["bad"]])
            with open(result_path, "w") as f:
                json.dump(total, f)
    finally:
        dist.destroy_process_group()


def main():
    pairs = json.load(open(sys.argv[1]))
    result = sys.argv[1] + ".result"
    mp.spawn(run, args=(free_port(), pairs, result), nprocs=WORLD, join=True)
    total = json.load(open(result))
    print(json.dumps(total))
    sys.exit(1 if total["mismatches"] else 0)


if __name__ == "__main__":
    main()
