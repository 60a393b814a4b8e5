"""An FSDP2 training job's checkpoint moved to a new layout at a size where
bytes dominate: `tenplan reshard` of the files, then a plain `dcp.load`,
against PyTorch DCP's own load-time reshard of the same checkpoint, in the
same run, the two loaded states compared bit for bit.

    python benches/fsdp2_reshard.py TENPLAN [--hidden 1024] [--layers 12]
        [--reps 3] [--dir /dev/shm] [--json FILE]

1. A 4-rank FSDP2 job (gloo, CPU) holds a transformers Llama (hidden size
   --hidden, --layers layers, a 32,000-token vocabulary, untied output)
   and its AdamW state after one step (`exp_avg`, `exp_avg_sq` like each
   parameter, a 0-d `step`), and saves `get_state_dict(model, optim)`
   with `dcp.save({"model": ..., "optim": ...})` into --dir, as trainers
   do.
2. For each target (2 ranks, `dp_shard=2`; a 2x2 HSDP mesh,
   `dp_replicate=2,dp_shard=2`): `tenplan reshard --src CKPT --to TARGET`
   writes a new checkpoint (--reps times; the median of the process's wall
   time, start and exit included).
3. A job of that layout builds the same model and optimizer and loads
   tenplan's output with plain `dcp.load` (nothing left to reshard) and
   `set_state_dict`, and, beside it, the original checkpoint, which DCP
   reshards as it loads (--reps times each, alternating; medians). Every
   local shard of the model and optimizer state, and the parameter
   groups, must be bit-identical between the two.

Prints a table (and writes --json): per target, tenplan's reshard against
the floor of any reshard of files (`cp -r` of the checkpoint: every byte
read and written once), the plain load of its output, the two together,
and DCP's resharding load, with the ratio. Run: make bench-fsdp2.
"""

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
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

TARGETS = [
    ("fsdp2-2", (2,), ("dp_shard",), "dp_shard=2"),
    ("hsdp-2x2", (2, 2), ("dp_replicate", "dp_shard"), "dp_replicate=2,dp_shard=2"),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(hidden, layers):
    return LlamaConfig(
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 128,
        max_position_embeddings=512,
    )


def sharded(cfg, mesh_shape, names):
    """The model under FSDP2 (every layer, then the root), on `mesh_shape`
    (HSDP when it has a dp_replicate dimension), with its AdamW."""
    # Built on the meta device and materialized shard by shard, as large
    # jobs do: each rank holds its shards only.
    with torch.device("meta"):
        m = LlamaForCausalLM(cfg)
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    for layer in m.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    m.to_empty(device="cpu")
    g = torch.Generator().manual_seed(dist.get_rank())
    with torch.no_grad():
        for p in m.parameters():
            p.to_local().copy_(torch.randn(p.to_local().shape, generator=g) * 0.02)
    return m, torch.optim.AdamW(m.parameters(), lr=1e-3)


def local_state(sd):
    """Every tensor's local shard (its type, shape and the digest of its
    bytes), flattened by path; other values as they are."""
    import hashlib

    out = {}

    def walk(prefix, v):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}{k}.", x)
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(f"{prefix}{i}.", x)
        elif isinstance(v, torch.Tensor):
            t = (v.to_local() if hasattr(v, "to_local") else v).contiguous()
            raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
            out[prefix[:-1]] = (str(t.dtype), tuple(t.shape), hashlib.blake2b(raw, digest_size=16).hexdigest())
        else:
            out[prefix[:-1]] = v

    walk("", sd)
    return out


def same(a, b):
    if a.keys() != b.keys():
        return False
    differ = [k for k in a if a[k] != b[k]]
    for k in differ[:3]:
        print(f"`{k}` differs: {a[k]!r} against {b[k]!r}", file=sys.stderr)
    return not differ


def worker(rank, world, port, job, out):
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        m, optim = sharded(config(*job["size"]), job["mesh"], job["names"])
        if job["kind"] == "save":
            # One AdamW step on gradients of its own: every moment holds
            # values, every step is 1.
            g = torch.Generator().manual_seed(rank)
            for p in m.parameters():
                local = p.to_local()
                p.grad = p.__class__.from_local(
                    torch.randn(local.shape, generator=g), p.device_mesh, p.placements, shape=p.shape, stride=p.stride()
                )
            optim.step()
            msd, osd = get_state_dict(m, optim)
            dist.barrier()
            start = time.perf_counter()
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=job["dir"])
            dist.barrier()
            result = {"save_s": time.perf_counter() - start}
        else:
            times = {"plain": [], "dcp": []}
            states = {}
            for _ in range(job["reps"]):
                for which, directory in (("plain", job["tenplan"]), ("dcp", job["original"])):
                    msd, osd = get_state_dict(m, optim)
                    sd = {"model": msd, "optim": osd}
                    dist.barrier()
                    start = time.perf_counter()
                    dcp.load(sd, checkpoint_id=directory)
                    set_state_dict(m, optim, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
                    dist.barrier()
                    times[which].append(time.perf_counter() - start)
                    msd, osd = get_state_dict(m, optim)
                    states[which] = local_state({"model": msd, "optim": osd})
            identical = torch.tensor([int(same(states["plain"], states["dcp"]))])
            dist.all_reduce(identical, op=dist.ReduceOp.MIN)
            result = {
                "plain_load_s": statistics.median(times["plain"]),
                "dcp_load_s": statistics.median(times["dcp"]),
                "identical": bool(identical.item()),
                "entries": len(states["plain"]),
            }
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("tenplan")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", default="/dev/shm")
    p.add_argument("--json")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="tenplan-fsdp2-bench-", dir=a.dir)
    try:
        size = (a.hidden, a.layers)
        src = os.path.join(work, "step1")
        saved = run({"kind": "save", "size": size, "mesh": (4,), "names": ("dp_shard",), "dir": src}, 4)
        data = sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src))
        with torch.device("meta"):
            params = sum(t.numel() for t in LlamaForCausalLM(config(*size)).parameters())
        # The floor of any reshard of files: every byte read and written
        # once, as `cp -r` of the checkpoint does.
        copies = []
        for _ in range(a.reps):
            start = time.perf_counter()
            subprocess.run(["cp", "-r", src, os.path.join(work, "copy")], check=True)
            copies.append(time.perf_counter() - start)
            shutil.rmtree(os.path.join(work, "copy"))
        copy_s = statistics.median(copies)
        rows = []
        for name, mesh, names, to in TARGETS:
            out = os.path.join(work, name)
            walls, summary = [], None
            for _ in range(a.reps):
                shutil.rmtree(out, ignore_errors=True)
                start = time.perf_counter()
                r = subprocess.run([a.tenplan, "reshard", "--src", src, "--to", to, "--out", out, "--json"],
                                   capture_output=True, text=True)
                walls.append(time.perf_counter() - start)
                if r.returncode != 0:
                    sys.exit(f"tenplan reshard --to {to}: {r.stderr}")
                summary = json.loads(r.stdout)
            world = 1
            for n in mesh:
                world *= n
            loads = run({"kind": "load", "size": size, "mesh": mesh, "names": names, "tenplan": out,
                         "original": src, "reps": a.reps}, world)
            reshard_s = statistics.median(walls)
            rows.append({
                "target": to,
                "ranks": world,
                "tenplan_reshard_s": reshard_s,
                "tenplan_reported_s": summary["seconds"],
                "plan_s": summary["plan_seconds"],
                "execute_s": summary["execute_seconds"],
                "copies": summary["copies"],
                "plain_load_s": loads["plain_load_s"],
                "tenplan_total_s": reshard_s + loads["plain_load_s"],
                "dcp_resharding_load_s": loads["dcp_load_s"],
                "identical": loads["identical"],
                "entries": loads["entries"],
            })
            shutil.rmtree(out, ignore_errors=True)
        print(f"FSDP2 AdamW checkpoint of a Llama with {params / 1e6:.0f}M parameters ({data / 1e9:.2f} GB of files, "
              f"saved by dcp.save on 4 gloo ranks in {saved['save_s']:.2f} s) in {a.dir}; median of {a.reps}; "
              f"{os.cpu_count()} cores; floor of a reshard of the files: `cp -r` of the checkpoint {copy_s:.2f} s")
        print("| target | tenplan reshard (process; plan) | vs cp -r | plain dcp.load of its output | both | DCP's load with its own reshard | DCP / both | state identical |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for r in rows:
            print(f"| {r['target']} ({r['ranks']} ranks) | {r['tenplan_reshard_s']:.2f} s; {r['plan_s'] * 1e3:.1f} ms | "
                  f"{r['tenplan_reshard_s'] / copy_s:.2f}x | {r['plain_load_s']:.2f} s | "
                  f"{r['tenplan_total_s']:.2f} s | {r['dcp_resharding_load_s']:.2f} s | "
                  f"{r['dcp_resharding_load_s'] / r['tenplan_total_s']:.2f}x | {'yes' if r['identical'] else 'NO'} |")
        report = {
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__},
            "model": {"hidden": a.hidden, "layers": a.layers, "parameters": params},
            "checkpoint_bytes": data,
            "save_s": saved["save_s"],
            "copy_floor_s": copy_s,
            "reps": a.reps,
            "dir": a.dir,
            "rows": rows,
        }
        if a.json:
            with open(a.json, "w") as f:
                json.dump(report, f, indent=1)
        if not all(r["identical"] for r in rows):
            sys.exit(1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
