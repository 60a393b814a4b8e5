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

With --optimizer the job trains with Megatron's distributed optimizer
(Adam; one step) under tp=2,dp=2 and moves to tp=1,dp=4 with its optimizer
state, saved and moved in the `fully_reshardable` form: Megatron's path is
`optimizer.sharded_state_dict(...)` (which gathers the state) + save, then
load into the new job's model and optimizer; tenplan live is
`tenplan.megatron.load` from the same gathered state, and (a second live
path) `tenplan.megatron.reshard(..., optimizers=(old, new))`, which moves the
optimizer's data-parallel shards as they lie, nothing gathered; the checkpoint path
is `tenplan reshard` of the saved checkpoint, then Megatron's load of it.
Model weights, main parameters, moments and steps are compared.
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


def _joined(rank, world, port):
    """Join the gloo group; a timer of a step every rank takes together
    (`timed(fn)`: fn's value and the seconds between barriers)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    barrier = torch.distributed.barrier

    def timed(fn):
        barrier()
        t = time.perf_counter()
        value = fn()
        barrier()
        return value, time.perf_counter() - t

    return timed


def _cli_reshard(rank, tenplan_bin, src, to, dst, directory):
    """`tenplan reshard` run by rank 0 while the others wait (sleeping
    rather than spinning in a gloo barrier: the tool gets the cores); rank
    0's seconds and report."""
    done_marker = os.path.join(directory, "resharded.done")
    cli = {}
    if rank == 0:
        t = time.perf_counter()
        r = subprocess.run(
            [tenplan_bin, "reshard", "--src", src, "--to", to, "--out", dst, "--json"], capture_output=True, text=True
        )
        cli["seconds"] = time.perf_counter() - t
        cli["report"] = json.loads(r.stdout) if r.returncode == 0 else r.stderr
        open(done_marker, "w").close()
    else:
        while not os.path.exists(done_marker):
            time.sleep(0.02)
    return cli


def worker(rank, world, port, size, directory, tenplan_bin, out):
    timed = _joined(rank, world, port)
    import tenplan.megatron
    from megatron.core import dist_checkpointing, parallel_state

    mk.cpu_only_save_patches()

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
    to = f"tp={TARGET[0]},pp={TARGET[1]},dp=2"
    cli, cli_s = timed(lambda: _cli_reshard(rank, tenplan_bin, saved_dir, to, resharded_dir, directory))
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


def optimizer_worker(rank, world, port, size, directory, tenplan_bin, out):
    """Model and distributed-optimizer state, tp=2,dp=2 -> tp=1,dp=4."""
    timed = _joined(rank, world, port)
    import tenplan.megatron
    from megatron.core import dist_checkpointing, parallel_state

    mk.cpu_only_optimizer_patches()

    ddp, optim = mk.with_optimizer(mk.build(2, 1, size=size))
    mk.train_steps(ddp, optim, 0, 1)

    def gathered():
        return mk.job_sharded_state(ddp, optim)

    saved_dir = os.path.join(directory, "saved")
    _, save_s = timed(lambda: dist_checkpointing.save(gathered(), saved_dir))

    def new_job():
        new_ddp, new_optim = mk.with_optimizer(mk.build(1, 1, size=size))
        mk.make_optimizer_state(new_optim)
        return new_ddp, new_optim

    def into(new_ddp, new_optim, fill, stages):
        """Fill the new job through `fill` (its target state dict to the
        loaded one), each stage timed into `stages`."""
        t = time.perf_counter()
        target = mk.job_sharded_state(new_ddp, new_optim, is_loading=True)
        stages["target_state_dict"] = time.perf_counter() - t
        t = time.perf_counter()
        state, report = fill(target)
        stages["fill"] = time.perf_counter() - t
        t = time.perf_counter()
        new_ddp.module.load_state_dict(state["model"])
        new_optim.load_state_dict(state["optimizer"])
        stages["load_state_dict"] = time.perf_counter() - t
        return report

    parallel_state.destroy_model_parallel()
    # tenplan live: the old job's gathered state straight into the new job.
    new_ddp, new_optim = new_job()
    stages = {"live": {}, "megatron_load": {}, "megatron_load_of_tenplans": {}, "megatron_load_again": {}}

    def live(target):
        t = time.perf_counter()
        old = gathered()
        stages["live"]["gather_source"] = time.perf_counter() - t
        return tenplan.megatron.load(old, target)

    report, live_s = timed(lambda: into(new_ddp, new_optim, live, stages["live"]))
    # The move alone: the old job's gather is a stage of its own.
    stages["live"]["fill"] -= stages["live"]["gather_source"]
    mine = mk.job_state(new_ddp, new_optim)
    del new_ddp, new_optim
    parallel_state.destroy_model_parallel()
    # tenplan live, the optimizer's data-parallel shards as they lie:
    # nothing gathered, written in place into the new job's optimizer.
    new_ddp, new_optim = mk.with_optimizer(mk.build(1, 1, size=size))
    lying, lying_s = timed(
        lambda: tenplan.megatron.reshard(
            ddp.module.sharded_state_dict(), new_ddp.module.sharded_state_dict(), optimizers=(optim, new_optim)
        )
    )
    mine_lying = mk.job_state(new_ddp, new_optim)
    del new_ddp, new_optim, ddp, optim
    parallel_state.destroy_model_parallel()

    def megatron_load(directory, stage):
        job = new_job()
        _, seconds = timed(lambda: into(*job, lambda t: (dist_checkpointing.load(t, directory), None), stages[stage]))
        state = mk.job_state(*job)
        parallel_state.destroy_model_parallel()
        return state, seconds

    theirs, load_s = megatron_load(saved_dir, "megatron_load")
    resharded_dir = os.path.join(directory, "resharded")
    cli, cli_s = timed(lambda: _cli_reshard(rank, tenplan_bin, saved_dir, "tp=1,dp=4", resharded_dir, directory))
    via_cli, load2_s = megatron_load(resharded_dir, "megatron_load_of_tenplans")
    # The original once more, after tenplan's: how much of a difference
    # between the two loads is the order (and the shared machine).
    again, load3_s = megatron_load(saved_dir, "megatron_load_again")
    same = lambda a: a.keys() == theirs.keys() and all(torch.equal(a[k], v) for k, v in theirs.items())  # noqa: E731
    result = {
        "rank": rank,
        "live_identical": same(mine) and same(mine_lying),
        "checkpoint_identical": same(via_cli) and same(again),
        "state_bytes": sum(v.numel() * v.element_size() for k, v in theirs.items() if k.startswith("model.")),
        "seconds": {
            "megatron_save": save_s,
            "megatron_load": load_s,
            "tenplan_live": live_s,
            "tenplan_live_shards": lying_s,
            "tenplan_reshard_cli": cli_s,
            "megatron_load_of_tenplans": load2_s,
            "megatron_load_again": load3_s,
        },
        "live_breakdown": report["seconds"],
        "live_shards_breakdown": lying["seconds"],
        "stages": stages,
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
    ap.add_argument("--optimizer", action="store_true", help="with Megatron's distributed optimizer: tp=2,dp=2 -> tp=1,dp=4")
    ap.add_argument("--json")
    a = ap.parse_args()
    size = {"vocab": a.vocab, "hidden": a.hidden, "heads": a.heads, "groups": a.groups, "ffn": a.ffn, "layers": a.layers}
    work = tempfile.mkdtemp(prefix="tenplan-megatron-bench-", dir=a.dir)
    try:
        out = os.path.join(work, "result")
        os.makedirs(os.path.join(work, "saved"))
        mp.start_processes(
            optimizer_worker if a.optimizer else worker,
            args=(WORLD, mk.free_port(), size, work, a.tenplan, out),
            nprocs=WORLD,
            start_method="spawn",
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
    if a.optimizer:
        # A target rank (tp=1) holds the whole model; the moved state is its
        # weights and Adam's two moments (the main copy of an fp32 weight
        # is the weight).
        total = ranks[0]["state_bytes"]
        what = (
            f"{total / 1e9:.2f} GB of weights, {3 * total / 1e9:.2f} GB with the distributed optimizer's "
            f"moments), tp=2,dp=2 -> tp=1,dp=4"
        )
    else:
        # A target rank holds one of the two stages whole.
        total = sum(r["state_bytes"] for r in ranks if r["rank"] in (0, WORLD - 1))
        what = f"{total / 1e9:.2f} GB), tp=2,pp=2 -> tp=1,pp=2,dp=2"
    print(
        f"Megatron-Core GPTModel, {total / 4e6:.0f}M parameters fp32 ({what} on {WORLD} gloo processes (CPU), "
        f"checkpoints in {a.dir}; {size}"
    )
    print("| path | seconds | vs Megatron save + load |")
    print("|---|---|---|")
    print(f"| Megatron: dist_checkpointing.save + load | {megatron:.3f} (save {s['megatron_save']:.3f}, load {s['megatron_load']:.3f}) | 1.00 |")
    print(
        f"| tenplan live (tenplan.megatron.{'load' if a.optimizer else 'reshard'}) | {s['tenplan_live']:.3f} (describe {breakdown['describe']:.3f}, "
        f"plan {breakdown['plan']:.3f}, bind {breakdown['prepare']:.3f}, execute {breakdown['execute']:.3f}) | "
        f"{megatron / s['tenplan_live']:.2f}x faster |"
    )
    print(
        f"| tenplan reshard of the saved checkpoint + Megatron load of it | {via_cli:.3f} (reshard {s['tenplan_reshard_cli']:.3f}, "
        f"load {s['megatron_load_of_tenplans']:.3f}) | against Megatron's resharding load alone ({s['megatron_load']:.3f}): "
        f"{via_cli / s['megatron_load']:.2f}x |"
    )
    if a.optimizer:
        b = {k: max(r["live_shards_breakdown"][k] for r in ranks) for k in ranks[0]["live_shards_breakdown"]}
        print(
            f"| tenplan live, the optimizer's shards as they lie (tenplan.megatron.reshard(..., optimizers=)) | "
            f"{s['tenplan_live_shards']:.3f} (describe {b['describe']:.3f}, plan {b['plan']:.3f}, bind {b['prepare']:.3f}, "
            f"execute {b['execute']:.3f}) | {megatron / s['tenplan_live_shards']:.2f}x faster |"
        )
    print(f"results identical to Megatron's load: {'yes' if ok else 'NO'}")
    if a.optimizer:
        # Where the time goes, slowest rank per stage: Megatron's own calls
        # on either side of the move (the optimizer's gather of its state,
        # its target state dict, load_state_dict) and the move itself.
        print(
            "\n| stage (slowest rank, s) | tenplan live | Megatron load of its checkpoint | Megatron load of tenplan's "
            "| Megatron load of its checkpoint, again |"
        )
        print("|---|---|---|---|---|")
        names = {
            "gather_source": "old job: optimizer.sharded_state_dict (gathers the state)",
            "target_state_dict": "new job: its sharded state dict (is_loading)",
            "fill": "the move: tenplan.megatron.load / dist_checkpointing.load",
            "load_state_dict": "new job: model and optimizer load_state_dict",
        }
        for n, label in names.items():
            row = [
                max(r["stages"][k].get(n, 0.0) for r in ranks)
                for k in ("live", "megatron_load", "megatron_load_of_tenplans", "megatron_load_again")
            ]
            print(f"| {label} | " + " | ".join(f"{x:.3f}" for x in row) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__},
                    "size": size,
                    "optimizer": a.optimizer,
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
