"""Write PyTorch DCP checkpoints of Hugging Face models with real
torch.distributed.checkpoint.save on gloo processes (CPU): the DCP fixtures
of tests/dcp.rs.

    python tests/dcp/make_dcp.py MODELS OUT

MODELS holds models written by tests/hf/make_models.py. Four processes start
once; each case loads its model with transformers on the ranks of its
process group, shards the state as a training job would, and saves it with
the default FileSystemWriter into OUT/<case>/ (.metadata and
__<rank>_<i>.distcp):

- fsdp2: FSDP2 (`fully_shard` per decoder layer and at the root) on a 1-D
  mesh of 2, 3 or 4 ranks; every parameter a DTensor with Shard(0), uneven
  where the ranks do not divide the rows (torch.chunk's rule, empty shards
  included); transformers 5 MoE models keep their experts as 3-D stacks;
- 2d: every parameter distributed on a 2x2 mesh, Shard(0) x Shard(1) for
  matrices and expert stacks, Replicate x Shard(0) for vectors;
- nested: FSDP2, saved as {"model": state_dict, "step": 7} (keys prefixed
  `model.`, and a non-tensor entry), as trainers save;
- nested-safetensors: the same, written with
  `FileSystemWriter(serialization_format=SerializationFormat.SAFETENSORS)`
  (each rank's file: the pickled step, then one safetensors blob).

OUT/cases.json lists the cases: name, model, ranks, placement.
"""

import argparse
import json
import os
import socket
import sys
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import transformers
from torch.distributed.checkpoint.filesystem import FileSystemWriter, SerializationFormat
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

WORLD = 4
# (case, model, ranks, placement)
CASES = [
    ("llama-fsdp2-3", "llama", 3, "fsdp2"),
    ("llama-2d", "llama", 4, "2d"),
    ("qwen2-fsdp2-2", "qwen2", 2, "fsdp2"),
    ("qwen3-moe-fsdp2-4", "qwen3-moe", 4, "fsdp2"),
    ("mixtral-2d", "mixtral", 4, "2d"),
    ("deepseek-v3-fsdp2-3", "deepseek-v3", 3, "fsdp2"),
    ("llama-tied-bias-nested", "llama-tied-bias", 2, "nested"),
    ("llama-nested-safetensors", "llama", 2, "nested-safetensors"),
    ("gpt2-2d", "gpt2", 4, "2d"),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fsdp2(model, mesh):
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model.state_dict()


def two_d(model, mesh):
    out = {}
    for name, p in model.state_dict().items():
        place = [Shard(0), Shard(1)] if p.dim() >= 2 else [Replicate(), Shard(0)]
        out[name] = distribute_tensor(p.detach().clone(), mesh, place)
    return out


def run(rank, port, models, out):
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        # Every rank creates every group, in the same order.
        groups = {n: dist.new_group(list(range(n))) for n in (2, 3)}
        for case, model_name, n, placement in CASES:
            if rank < n:
                model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(models, model_name))
                if placement == "2d":
                    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
                    state = two_d(model, mesh)
                else:
                    mesh = (init_device_mesh("cpu", (WORLD,)) if n == WORLD
                            else DeviceMesh.from_group(groups[n], "cpu"))
                    state = fsdp2(model, mesh)
                if placement.startswith("nested"):
                    state = {"model": state, "step": 7}
                path = os.path.join(out, case)
                writer = None
                if placement.endswith("safetensors"):
                    writer = FileSystemWriter(path, serialization_format=SerializationFormat.SAFETENSORS)
                dcp.save(state, checkpoint_id=path, storage_writer=writer,
                         process_group=None if n == WORLD else groups[n])
            dist.barrier()
    finally:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models")
    ap.add_argument("out")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    mp.spawn(run, args=(free_port(), a.models, a.out), nprocs=WORLD, join=True)
    cases = [dict(case=c, model=m, ranks=n, placement=p) for c, m, n, p in CASES]
    with open(os.path.join(a.out, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)
    for c in cases:
        print(f"{c['case']}: {c['model']} on {c['ranks']} gloo ranks ({c['placement']})", file=sys.stderr)


if __name__ == "__main__":
    main()
