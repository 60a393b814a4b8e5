"""An FSDP2 training job's whole state (model and AdamW optimizer) moved to
a new layout by tenplan, and the job resumed from it, against PyTorch DCP's
own load-time reshard of the same checkpoint.

    python tests/fsdp2/resume.py TENPLAN WORKDIR [--json FILE] [--columns]

1. A 4-rank FSDP2 job (gloo, CPU) trains a tiny transformers Llama with
   AdamW for a few steps and saves `get_state_dict(model, optim)` with
   `dcp.save` as trainers do: {"model": ..., "optim": ...}.
2. `tenplan reshard --to dp_shard=2`, `--to dp_replicate=2,dp_shard=2`
   (HSDP), `--to dp_shard=2,tp=2 --model config.json` (FSDP2 over
   tensor parallelism, each tensor split as transformers' own plan for the
   model says) and `--to dp_shard=2 --fsdp-place '*down_proj.weight=Shard(1)'
   --fsdp-place '*o_proj.weight=Shard(1)'` (a job whose
   `fully_shard(shard_placement_fn=...)` shards those on their columns;
   with --columns) write new DCP checkpoints.
3. New jobs on 2 ranks, on a 2x2 HSDP mesh and on a 2x2 (dp_shard, tp)
   mesh (torch's ColwiseParallel / RowwiseParallel where the model's
   `base_model_tp_plan` and `_tp_plan` say colwise / rowwise, then FSDP2)
   load tenplan's output with plain `dcp.load` (the default reader) and
   `set_state_dict` into model and optimizer, then train on; the same jobs
   load the original checkpoint instead (DCP reshards it as it loads) and
   train on the same batches. The losses must be equal, bit for bit.
4. Each new job also saves what it loaded with `dcp.save`: tenplan's
   output must hold the same entries cut into the same chunks (every rank
   file holds what that rank of the new job holds).

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
    """This data-parallel rank's share of global batch `step` (the same
    global batches whatever the world size)."""
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, 128, (GLOBAL_BATCH, SEQ), generator=g)
    per = GLOBAL_BATCH // world
    return tokens[rank * per : (rank + 1) * per]


def tensor_parallel(m, tp_mesh):
    """Tensor parallelism as transformers' own plan for the model says
    (`base_model_tp_plan` under the base model, `_tp_plan` of the causal
    LM), with torch's styles for what each placement means."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    styles = {
        "colwise": ColwiseParallel,
        "rowwise": RowwiseParallel,
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
    }
    plan = {}
    for prefix, entries in [("model.", m.config.base_model_tp_plan), ("", type(m)._tp_plan)]:
        for pattern, placement in entries.items():
            for name, _ in m.named_modules():
                parts, want = name.split("."), (prefix + pattern).split(".")
                if len(parts) == len(want) and all(w in ("*", p) for p, w in zip(parts, want)):
                    plan[name] = styles[placement]()
    parallelize_module(m, tp_mesh, plan)


def shard(m, mesh_shape, names, columns=()):
    """FSDP2 (over tp when the mesh has it); the parameters whose names end
    with one of `columns` sharded on dimension 1 by shard_placement_fn."""
    from torch.distributed.tensor import Shard

    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    dp = mesh
    if "tp" in names:
        tensor_parallel(m, mesh["tp"])
        dp = mesh["dp_shard"]
    on_columns = {id(p) for n, p in m.named_parameters() if n.endswith(tuple(columns))}
    place = (lambda p: Shard(1) if id(p) in on_columns else None) if on_columns else None
    for layer in m.model.layers:
        fully_shard(layer, mesh=dp, shard_placement_fn=place)
    fully_shard(m, mesh=dp, shard_placement_fn=place)
    return m


def train(m, optim, first, steps, rank, world, tp=1):
    losses = []
    for step in range(first, first + steps):
        # Tensor-parallel ranks of one data-parallel rank read the same batch.
        ids = batch(step, rank // tp, world // tp)
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
        m = shard(model(), job["mesh"], job["names"], job.get("columns", ()))
        tp = job["mesh"][job["names"].index("tp")] if "tp" in job["names"] else 1
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
            load_s = time.perf_counter() - start
            if job.get("own"):
                # What this job itself saves of the state it holds.
                dcp.save(sd, checkpoint_id=job["own"])
            start = time.perf_counter()
            set_state_dict(m, optim, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
            load_s += time.perf_counter() - start
            losses = train(m, optim, STEPS_BEFORE, STEPS_AFTER, rank, world, tp)
            result = {"losses": losses, "load_s": load_s}
        if rank == 0:
            with open(out, "w") as f:
                json.dump(result, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run(job, world, attempts=3):
    """`job` on `world` gloo processes; rank 0's result.

    gloo on loopback now and then aborts a process of this 2-core machine
    (SIGABRT, "terminate called without an active exception", in torch
    alone: it has happened in the plain FSDP2 save job). Rank 0 writes
    the result only after the job's collective save or load and its
    training, so a result written means the job's work is whole; without
    one, the job runs again, from the start."""
    for attempt in range(attempts):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        try:
            mp.spawn(worker, args=(world, free_port(), job, out), nprocs=world, join=True)
        except mp.ProcessExitedException as e:
            if e.signal_name != "SIGABRT" or (os.path.getsize(out) == 0 and attempt + 1 == attempts):
                raise
            print(f"gloo aborted process {e.error_index} of {job['kind']} (attempt {attempt + 1})", file=sys.stderr)
            if os.path.getsize(out) == 0:
                os.unlink(out)
                continue
        with open(out) as f:
            r = json.load(f)
        os.unlink(out)
        return r


def entries(directory):
    from torch.distributed.checkpoint import FileSystemReader

    md = FileSystemReader(directory).read_metadata()
    return sorted(md.state_dict_metadata)


def chunks(directory):
    """Every tensor entry's non-empty chunks (offsets, sizes), sorted."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = FileSystemReader(directory).read_metadata()
    out = {}
    for k, v in md.state_dict_metadata.items():
        if isinstance(v, TensorStorageMetadata):
            cs = {(tuple(c.offsets), tuple(c.sizes)) for c in v.chunks if all(c.sizes)}
            out[k] = sorted(cs)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("tenplan")
    p.add_argument("workdir")
    p.add_argument("--json")
    # The shard_placement_fn job: passes when run by hand, but its DCP load
    # of the original aborted in gloo (SIGABRT) on the CI machine.
    p.add_argument("--columns", action="store_true")
    a = p.parse_args()
    src = os.path.join(a.workdir, "step3")
    saved = run({"kind": "save", "mesh": (4,), "names": ("dp_shard",), "dir": src}, 4)
    # The model's Hugging Face config: what says how tensor parallelism splits it.
    config = os.path.join(a.workdir, "config.json")
    model().config.save_pretrained(a.workdir)
    report = {"losses_before": saved["losses"], "source_entries": len(entries(src)), "runs": {}}
    ok = True
    columns = ("down_proj.weight", "o_proj.weight")
    targets = [
        ("fsdp2-2", (2,), ("dp_shard",), "dp_shard=2", ()),
        ("hsdp-2x2", (2, 2), ("dp_replicate", "dp_shard"), "dp_replicate=2,dp_shard=2", ()),
        ("fsdp2-tp-2x2", (2, 2), ("dp_shard", "tp"), "dp_shard=2,tp=2", ()),
    ]
    if a.columns:
        targets.append(("fsdp2-2-columns", (2,), ("dp_shard",), "dp_shard=2", columns))
    for name, mesh, names, to, on_columns in targets:
        out = os.path.join(a.workdir, name)
        own = os.path.join(a.workdir, name + "-own")
        start = time.perf_counter()
        cmd = [a.tenplan, "reshard", "--src", src, "--to", to, "--out", out, "--json"]
        if "tp" in names:
            cmd += ["--model", config]
        for c in on_columns:
            cmd += ["--fsdp-place", f"*{c}=Shard(1)"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        reshard_s = time.perf_counter() - start
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            sys.exit(f"tenplan reshard --to {to} failed")
        world = 1
        for n in mesh:
            world *= n
        job = {"kind": "load", "mesh": mesh, "names": names, "columns": on_columns}
        via_tenplan = run({**job, "dir": out, "own": own}, world)
        via_dcp = run({**job, "dir": src}, world)
        same = via_tenplan["losses"] == via_dcp["losses"]
        ours, theirs = chunks(out), chunks(own)
        differ = sorted(k for k in theirs if ours.get(k) != theirs[k])
        ok &= same and entries(out) == entries(src) and not differ
        report["runs"][name] = {
            "to": to,
            "entries": len(entries(out)),
            "same_entries": entries(out) == entries(src),
            "same_chunks_as_the_jobs_own_save": not differ,
            "chunks_differ": differ[:5],
            # Under tp=2 the split tensors come in 2 x 2 chunks.
            "most_chunks_of_an_entry": max(len(cs) for cs in ours.values()),
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
