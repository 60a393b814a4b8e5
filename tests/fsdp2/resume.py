"""An FSDP2 training job's whole state (model and AdamW optimizer) moved to
a new layout by tenplan, and the job resumed from it, against PyTorch DCP's
own load-time reshard of the same checkpoint.

    python tests/fsdp2/resume.py TENPLAN WORKDIR [--json FILE]

1. A 4-rank FSDP2 job (gloo, CPU) trains a tiny transformers Llama with
   AdamW for a few steps and saves `get_state_dict(model, optim)` with
   `dcp.save` as trainers do: {"model": ..., "optim": ...}.
2. `tenplan reshard --to dp_shard=2` and `--to dp_replicate=2,dp_shard=2`
   (HSDP) write new DCP checkpoints.
3. New FSDP2 jobs on 2 ranks and on a 2x2 HSDP mesh load tenplan's output
   with plain `dcp.load` (the default reader) and `set_state_dict` into
   model and optimizer, then train on; the same jobs load the original
   checkpoint instead (DCP reshards it as it loads) and train on the same
   batches. The losses must be equal, bit for bit.

Prints (and writes with --json) one JSON object: the losses of every run,
whether they agree, the entries each checkpoint holds, and the times of
tenplan's reshard and of the loads.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

STEPS_BEFORE = 3
STEPS_AFTER = 8
GLOBAL_BATCH = 8
SEQ = 16


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg)


def batch(step, rank, world):
    """This rank's share of global batch `step` (the same global batches
    whatever the world size)."""
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, 128, (GLOBAL_BATCH, SEQ), generator=g)
    per = GLOBAL_BATCH // world
    return tokens[rank * per : (rank + 1) * per]


def shard(m, mesh_shape):
    if len(mesh_shape) == 1:
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dp_shard",))
    else:
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dp_replicate", "dp_shard"))
    for layer in m.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m


def train(m, optim, first, steps, rank, world):
    losses = []
    for step in range(first, first + steps):
        ids = batch(step, rank, world)
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
        # The global mean loss, as every rank sees it.
        l = loss.detach().clone()
        dist.all_reduce(l)
        losses.append(l.item() / world)
    return losses


def worker(rank, world, port, job, out):
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        m = shard(model(), job["mesh"])
        optim = torch.optim.AdamW(m.parameters(), lr=1e-2)
        if job["kind"] == "save":
            losses = train(m, optim, 0, STEPS_BEFORE, rank, world)
            msd, osd = get_state_dict(m, optim)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=job["dir"])
            result = {"losses": losses}
        else:
            # Materialize the optimizer state (AdamW creates it lazily), so
            # that the state dict to load into has every entry.
            msd, osd = get_state_dict(m, optim)
            sd = {"model": msd, "optim": osd}
            start = time.perf_counter()
            dcp.load(sd, checkpoint_id=job["dir"])
            set_state_dict(m, optim, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
            load_s = time.perf_counter() - start
            losses = train(m, optim, STEPS_BEFORE, STEPS_AFTER, rank, world)
            result = {"losses": losses, "load_s": load_s}
        if rank == 0:
            with open(out, "w") as f:
                json.dump(result, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run(job, world):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    mp.spawn(worker, args=(world, free_port(), job, out), nprocs=world, join=True)
    with open(out) as f:
        r = json.load(f)
    os.unlink(out)
    return r


def entries(directory):
    from torch.distributed.checkpoint import FileSystemReader

    md = FileSystemReader(directory).read_metadata()
    return sorted(md.state_dict_metadata)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("tenplan")
    p.add_argument("workdir")
    p.add_argument("--json")
    a = p.parse_args()
    src = os.path.join(a.workdir, "step3")
    saved = run({"kind": "save", "mesh": (4,), "dir": src}, 4)
    report = {"losses_before": saved["losses"], "source_entries": len(entries(src)), "runs": {}}
    ok = True
    for name, mesh, to in [("fsdp2-2", (2,), "dp_shard=2"), ("hsdp-2x2", (2, 2), "dp_replicate=2,dp_shard=2")]:
        out = os.path.join(a.workdir, name)
        start = time.perf_counter()
        r = subprocess.run([a.tenplan, "reshard", "--src", src, "--to", to, "--out", out, "--json"], capture_output=True, text=True)
        reshard_s = time.perf_counter() - start
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            sys.exit(f"tenplan reshard --to {to} failed")
        world = 1
        for n in mesh:
            world *= n
        via_tenplan = run({"kind": "load", "mesh": mesh, "dir": out}, world)
        via_dcp = run({"kind": "load", "mesh": mesh, "dir": src}, world)
        same = via_tenplan["losses"] == via_dcp["losses"]
        ok &= same and entries(out) == entries(src)
        report["runs"][name] = {
            "to": to,
            "entries": len(entries(out)),
            "same_entries": entries(out) == entries(src),
            "losses_tenplan": via_tenplan["losses"],
            "losses_dcp": via_dcp["losses"],
            "bit_identical": same,
            "tenplan_reshard_s": reshard_s,
            "tenplan": json.loads(r.stdout),
            "load_tenplan_output_s": via_tenplan["load_s"],
            "load_with_dcp_reshard_s": via_dcp["load_s"],
        }
    report["ok"] = ok
    text = json.dumps(report, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
