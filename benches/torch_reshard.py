"""A DTensor state dict resharded between two placements on 4 gloo processes:
tenplan's torch.distributed executor against PyTorch DCP's save + load
through /dev/shm, measured in the same run (median of --reps), the results
compared element for element.

The state is GPT-3 350M's weights in fp32 (1.42 GB, the shapes of tenplan's
catalog model), Shard(0) on a 1-D mesh of 4 -> Shard(1) (1-D tensors stay
Shard(0)). tenplan's time is the executor's (the plan is made once and
reused, as a training loop does); the first call's planning time is
reported beside it. Beside both: the bytes each rank must receive over gloo
at the loopback's own speed (a plain send/recv ring of the same bytes), the
physical floor of any reshard over this transport.

Run: make bench-torch (or: python benches/torch_reshard.py --json out.json)
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4


def shapes(model):
    import tenplan

    layout = tenplan.Model(model).layout("tp=1", state="weights:f32")
    return {t["name"]: t["shape"] for t in layout.tensors()}


def timed(fn, reps):
    out = []
    for _ in range(reps):
        dist.barrier()
        t = time.perf_counter()
        fn()
        dist.barrier()
        out.append(time.perf_counter() - t)
    return out


def worker(rank, port, model, reps, shm, queue, profile=False, no_dcp=False):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=600))
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    import tenplan
    from tenplan.torch import describe, execute, layout_from_descriptions

    mesh = init_device_mesh("cpu", (WORLD,))
    full = shapes(model)
    src_pl = {n: [Shard(0)] for n in full}
    dst_pl = {n: [Shard(1)] if len(s) > 1 else [Shard(0)] for n, s in full.items()}
    g = torch.Generator().manual_seed(rank)
    src = {}
    for n, s in full.items():
        local, _ = compute_local_shape_and_global_offset(s, mesh, src_pl[n])
        src[n] = DTensor.from_local(torch.randn(local, generator=g), mesh, src_pl[n], run_check=False, shape=torch.Size(s), stride=torch.empty(s, device="meta").stride())

    def target_descriptions():
        out = []
        for r in range(WORLD):
            d = []
            for n, s in full.items():
                # The box rank r holds under the target placement (torch.chunk rules).
                dim = dst_pl[n][0].dim
                chunk = -(-s[dim] // WORLD)
                lo = min(r * chunk, s[dim])
                hi = min(lo + chunk, s[dim])
                box = [(0, x) for x in s]
                box[dim] = (lo, hi)
                d.append({"name": n, "dtype": "f32", "shape": list(s), "box": box})
            out.append(d)
        return out

    # tenplan: describe, gather, plan (once), execute.
    t = time.perf_counter()
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, describe(src))
    source = layout_from_descriptions(gathered)
    target = layout_from_descriptions(target_descriptions())
    plan = tenplan.plan(tenplan.Problem(source, target, tenplan.Cluster(f"1x{WORLD}")), "lp")
    plan_s = time.perf_counter() - t
    result = {}

    def run_tenplan():
        result.update(execute(plan, src))

    tenplan_s = timed(run_tenplan, reps)
    if profile and rank == 0:
        # Where the executor's time goes on one rank (the others run alike).
        import cProfile
        import pstats
        import sys

        prof = cProfile.Profile()
        dist.barrier()
        prof.runcall(run_tenplan)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(15)
    elif profile:
        dist.barrier()
        run_tenplan()

    # DCP: save the source state, load it into the target placement.
    dst = {}
    for n, s in full.items():
        local, _ = compute_local_shape_and_global_offset(s, mesh, dst_pl[n])
        dst[n] = DTensor.from_local(torch.empty(local), mesh, dst_pl[n], run_check=False, shape=torch.Size(s), stride=torch.empty(s, device="meta").stride())
    path = os.path.join(shm, "tenplan-bench-dcp")

    def run_dcp():
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        dist.barrier()
        dcp.save(src, checkpoint_id=path)
        dcp.load(dst, checkpoint_id=path)

    if no_dcp:
        dcp_s, same = [float("nan")], True
    else:
        dcp_s = timed(run_dcp, reps)
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        same = all(torch.equal(result[n], dst[n].to_local()) for n in full if dst[n].to_local().numel())

    # The floor: the bytes this rank receives from others in the plan, sent
    # around a ring of plain send/recv (gloo over loopback).
    program = tenplan.program(plan, rank)
    recv = sum(t["bytes"] for s in program["steps"] for t in s["recvs"])
    sizes = [None] * WORLD
    dist.all_gather_object(sizes, recv)
    buf = torch.empty(max(sizes[(rank + 1) % WORLD], 1), dtype=torch.uint8)
    out_buf = torch.empty(max(recv, 1), dtype=torch.uint8)

    def ring():
        ops = [dist.P2POp(dist.isend, buf, (rank + 1) % WORLD), dist.P2POp(dist.irecv, out_buf, (rank - 1) % WORLD)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()

    ring_s = timed(ring, reps)
    queue.put(
        {
            "rank": rank,
            "plan_s": plan_s,
            "tenplan_s": tenplan_s,
            "dcp_s": dcp_s,
            "ring_s": ring_s,
            "recv_bytes": recv,
            "bytes": sum(torch.Size(s).numel() * 4 for s in full.values()),
            "same": same,
        }
    )
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt3-350m")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--shm", default="/dev/shm")
    ap.add_argument("--json")
    ap.add_argument("--profile", action="store_true", help="print rank 0's profile of one executor run")
    ap.add_argument("--no-dcp", action="store_true", help="measure tenplan and the floor only")
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, port, a.model, a.reps, a.shm, queue, a.profile, a.no_dcp)) for r in range(WORLD)]
    for p in procs:
        p.start()
    rows = sorted((queue.get(timeout=3600) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join()
    r0 = rows[0]
    med = {k: statistics.median(r0[k]) for k in ("tenplan_s", "dcp_s", "ring_s")}
    total = r0["bytes"]
    recv = sum(r["recv_bytes"] for r in rows)
    ok = all(r["same"] for r in rows)
    print(f"{a.model} fp32 weights, {total / 1e9:.2f} GB, Shard(0) -> Shard(1) on {WORLD} gloo processes; median of {a.reps}")
    print(f"| path | seconds | GB/s of state | vs tenplan |")
    print(f"|---|---|---|---|")
    print(f"| tenplan torch executor (plan made once: {r0['plan_s']:.2f} s) | {med['tenplan_s']:.3f} | {total / 1e9 / med['tenplan_s']:.2f} | 1.00 |")
    print(f"| DCP save + load through {a.shm} | {med['dcp_s']:.3f} | {total / 1e9 / med['dcp_s']:.2f} | {med['dcp_s'] / med['tenplan_s']:.2f}x slower |")
    print(f"| gloo ring of the bytes received ({recv / 1e9:.2f} GB in all) | {med['ring_s']:.3f} | | floor: tenplan at {med['tenplan_s'] / med['ring_s']:.2f}x |")
    print(f"results identical to DCP's: {'yes' if ok else 'NO'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__},
                    "model": a.model,
                    "bytes": total,
                    "recv_bytes": recv,
                    "reps": a.reps,
                    "median_s": med,
                    "plan_s": r0["plan_s"],
                    "speedup_vs_dcp": med["dcp_s"] / med["tenplan_s"],
                    "identical": ok,
                    "ranks": rows,
                },
                f,
                indent=1,
            )
    if not ok:
        raise SystemExit("tenplan's result differs from DCP's")


if __name__ == "__main__":
    main()
