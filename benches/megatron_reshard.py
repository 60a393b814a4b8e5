"""A Megatron-Core job's state moved from tp=2,pp=2 to tp=1,pp=2,dp=2 on 4
gloo processes (CPU), three ways, measured in the same run:

- Megatron's own path: `dist_checkpointing.save` under the old
  configuration, `dist_checkpointing.load` under the new one (through
  --dir, /dev/shm by default);
- tenplan live: `tenplan.megatron.reshard` from the old model's
  `sharded_state_dict()` into the new model's, in memory (time split into
  describe + gather the layouts, plan, bind, execute);
- tenplan checkpoint to checkpoint: `tenplan reshard` (the release binary)
  of the saved checkpoint to the new configuration, then Megatron's load of
  it (against Megatron's load of the original, which reshards as it loads).

Every path's result is compared with Megatron's load, tensor for tensor.
The model is a Llama-shaped GPTModel (tests/megatron/make_checkpoints.py's
builder) of the sizes given: by default 156M parameters in fp32 (0.62 GB),
which with four processes holding up to three models' shards each fits a
24 GiB, 2-core machine with room to spare.

Run: make bench-megatron (or: python benches/megatron_reshard.py TENPLAN --json out.json)
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import torch
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "megatron"))
import make_checkpoints as mk  # noqa: E402

WORLD = 4
SOURCE, TARGET = (2, 2), (1, 2)


def _garbled(model):
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    return model


def worker(rank, world, port, size, directory, tenplan_bin, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    import tenplan.megatron
    from megatron.core import dist_checkpointing, parallel_state

    mk.cpu_only_save_patches()
    barrier = torch.distributed.barrier

    def timed(fn):
        barrier()
        t = time.perf_counter()
        value = fn()
        barrier()
        return value, time.perf_counter() - t

    source = mk.build(*SOURCE, size=size)
    saved_dir = os.path.join(directory, "saved")
    _, save_s = timed(lambda: dist_checkpointing.save(source.sharded_state_dict(), saved_dir))
    old = source.sharded_state_dict()
    parallel_state.destroy_model_parallel()

    # tenplan live, in memory.
    moved = _garbled(mk.build(*TARGET, size=size))
    report, live_s = timed(lambda: tenplan.megatron.reshard(old, moved.sharded_state_dict()))
    mine = {k: v.clone() for k, v in moved.state_dict().items() if isinstance(v, torch.Tensor)}
    del moved, old, source
    parallel_state.destroy_model_parallel()

    # Megatron's load of the original (its own load-time reshard).
    loaded = _garbled(mk.build(*TARGET, size=size))
    _, load_s = timed(lambda: loaded.load_state_dict(dist_checkpointing.load(loaded.sharded_state_dict(), saved_dir)))
    theirs = {k: v for k, v in loaded.state_dict().items() if isinstance(v, torch.Tensor)}
    parallel_state.destroy_model_parallel()

    # tenplan checkpoint -> checkpoint, then Megatron's load of it.
    resharded_dir = os.path.join(directory, "resharded")
    cli = {}

    done_marker = os.path.join(directory, "resharded.done")

    def run_cli():
        if rank == 0:
            t = time.perf_counter()
            r = subprocess.run(
                [tenplan_bin, "reshard", "--src", saved_dir, "--to", f"tp={TARGET[0]},pp={TARGET[1]},dp=2", "--out", resharded_dir, "--json"],
                capture_output=True,
                text=True,
            )
            cli["seconds"] = time.perf_counter() - t
            cli["report"] = json.loads(r.stdout) if r.returncode == 0 else r.stderr
            open(done_marker, "w").close()
        else:
            # Sleep rather than spin in a gloo barrier: the tool gets the cores.
            while not os.path.exists(done_marker):
                time.sleep(0.02)

    _, cli_s = timed(run_cli)
    again = _garbled(mk.build(*TARGET, size=size))
    _, load2_s = timed(lambda: again.load_state_dict(dist_checkpointing.load(again.sharded_state_dict(), resharded_dir)))
    via_cli = {k: v for k, v in again.state_dict().items() if isinstance(v, torch.Tensor)}
    parallel_state.destroy_model_parallel()

    result = {
        "rank": rank,
        "live_identical": all(torch.equal(mine[k], v) for k, v in theirs.items()),
        "checkpoint_identical": all(torch.equal(via_cli[k], v) for k, v in theirs.items()),
        "state_bytes": sum(v.numel() * v.element_size() for v in theirs.values()),
        "seconds": {
            "megatron_save": save_s,
            "megatron_load": load_s,
            "tenplan_live": live_s,
            "tenplan_reshard_cli": cli_s,
            "megatron_load_of_tenplans": load2_s,
        },
        "live_breakdown": report["seconds"],
        "plan": {k: report.get(k) for k in ("makespan_s", "lower_bound_s", "planner")},
        "cli": cli,
    }
    torch.save(result, f"{out}.{rank}")
    torch.distributed.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tenplan", help="the tenplan binary (release)")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=2816)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ap.add_argument("--json")
    a = ap.parse_args()
    size = {"vocab": a.vocab, "hidden": a.hidden, "heads": a.heads, "groups": a.groups, "ffn": a.ffn, "layers": a.layers}
    work = tempfile.mkdtemp(prefix="tenplan-megatron-bench-", dir=a.dir)
    try:
        out = os.path.join(work, "result")
        os.makedirs(os.path.join(work, "saved"))
        mp.start_processes(
            worker, args=(WORLD, mk.free_port(), size, work, a.tenplan, out), nprocs=WORLD, start_method="spawn"
        )
        ranks = [torch.load(f"{out}.{r}", weights_only=False) for r in range(WORLD)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # The slowest rank's time is the job's.
    worst = {k: max(r["seconds"][k] for r in ranks) for k in ranks[0]["seconds"]}
    s = worst
    megatron = s["megatron_save"] + s["megatron_load"]
    via_cli = s["tenplan_reshard_cli"] + s["megatron_load_of_tenplans"]
    breakdown = {k: max(r["live_breakdown"][k] for r in ranks) for k in ranks[0]["live_breakdown"]}
    ok = all(r["live_identical"] and r["checkpoint_identical"] for r in ranks)
    # A target rank holds one of the two stages whole.
    total = sum(r["state_bytes"] for r in ranks if r["rank"] in (0, WORLD - 1))
    print(
        f"Megatron-Core GPTModel, {total / 4e6:.0f}M parameters fp32 ({total / 1e9:.2f} GB; {size}), "
        f"tp=2,pp=2 -> tp=1,pp=2,dp=2 on {WORLD} gloo processes (CPU), checkpoints in {a.dir}"
    )
    print("| path | seconds | vs Megatron save + load |")
    print("|---|---|---|")
    print(f"| Megatron: dist_checkpointing.save + load | {megatron:.3f} (save {s['megatron_save']:.3f}, load {s['megatron_load']:.3f}) | 1.00 |")
    print(
        f"| tenplan live (tenplan.megatron.reshard) | {s['tenplan_live']:.3f} (describe {breakdown['describe']:.3f}, "
        f"plan {breakdown['plan']:.3f}, bind {breakdown['prepare']:.3f}, execute {breakdown['execute']:.3f}) | "
        f"{megatron / s['tenplan_live']:.2f}x faster |"
    )
    print(
        f"| tenplan reshard of the saved checkpoint + Megatron load of it | {via_cli:.3f} (reshard {s['tenplan_reshard_cli']:.3f}, "
        f"load {s['megatron_load_of_tenplans']:.3f}) | against Megatron's resharding load alone ({s['megatron_load']:.3f}): "
        f"{via_cli / s['megatron_load']:.2f}x |"
    )
    print(f"results identical to Megatron's load: {'yes' if ok else 'NO'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__},
                    "size": size,
                    "state_bytes": total,
                    "seconds": worst,
                    "live_breakdown": breakdown,
                    "identical": ok,
                    "ranks": ranks,
                },
                f,
                indent=1,
                default=str,
            )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
