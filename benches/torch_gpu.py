"""tenplan's torch.distributed executor on a GPU (NCCL, one rank per GPU):
a training state's ZeRO-1 flat buffers (bf16 weights, fp32 master weights
and Adam moments in one flat buffer per element type) rewritten as
per-tensor buffers, every gather and write on the GPU. Beside it, in the
same run: one device-to-device copy of the same bytes (torch's
``Tensor.copy_``), the physical floor of moving them once through the GPU's
memory. The executor runs both ways: one-shot (``execute``: check, program
and views at each call) and prepared once (``prepare``, then one call per
step, as an RL weight sync does). The executor's result is compared element for element with the
expected per-tensor buffers.

Needs a CUDA GPU and NCCL; the ranks are one per GPU (NCCL refuses two on
one GPU). Run: python benches/torch_gpu.py --json out.json
"""

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fill(layout, rank, device):
    """This rank's buffers in ``layout``, every element a function of its
    tensor and global index (so any misplaced element shows)."""
    from tenplan.torch import DTYPES

    shard = layout.shard(rank)
    names = [t["name"] for t in layout.tensors()]
    shapes = {t["name"]: t["shape"] for t in layout.tensors()}
    out = {}
    for b in shard["buffers"] if shard else []:
        buf = torch.zeros(b["len"], dtype=DTYPES[b["dtype"]], device=device)
        for p in b["pieces"]:
            name = names[p["tensor"]]
            box = [range(lo, hi) for lo, hi in p["box"]]
            idx = torch.zeros((), dtype=torch.float64, device=device)
            stride = 1
            # Global row-major index of each element of the box, plus the
            # tensor's number, folded into the element type's range.
            for d in reversed(range(len(box))):
                r = torch.arange(box[d].start, box[d].stop, dtype=torch.float64, device=device)
                shape = [1] * len(box)
                shape[d] = len(box[d])
                idx = idx + r.view(shape) * stride
                stride *= shapes[name][d]
            val = torch.remainder(idx * 0.618 + p["tensor"], 251.0) - 125.0
            n = val.numel()
            buf[p["offset"] : p["offset"] + n] = val.reshape(-1).to(buf.dtype)
        out[b["name"]] = buf
    return out


def worker(rank, world, port, model, src, dst, reps, backend, queue):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
    import tenplan
    from tenplan.torch import DTYPES, execute, prepare

    try:
        gpu = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
        m = tenplan.Model(model)
        problem = tenplan.Problem(m.layout(src), m.layout(dst), tenplan.Cluster(f"1x{world}"))
        t = time.perf_counter()
        plan = tenplan.plan(problem, "lp")
        planning = time.perf_counter() - t
        need = sum(b["len"] * torch.tensor([], dtype=DTYPES[b["dtype"]]).element_size() for b in problem.target.shard(rank)["buffers"])
        have = sum(b["len"] * torch.tensor([], dtype=DTYPES[b["dtype"]]).element_size() for b in problem.source.shard(rank)["buffers"])
        if backend == "nccl":
            free = torch.cuda.mem_get_info(gpu)[0]
            # The source, the expected target, and two results at once.
            if have + 3 * need > free:
                raise MemoryError(f"needs {(have + 3 * need) / 1e9:.1f} GB of GPU memory, {free / 1e9:.1f} GB free")
        source = fill(problem.source, rank, gpu)
        want = fill(problem.target, rank, gpu)
        moved = sum(v.numel() * v.element_size() for v in want.values())
        times = []
        for _ in range(reps):
            sync()
            dist.barrier()
            t = time.perf_counter()
            got = execute(plan, source)
            sync()
            times.append(time.perf_counter() - t)
        same = set(got) == set(want) and all(torch.equal(got[k].reshape(-1), want[k]) for k in want)
        del got
        # Prepared once (check, program, views), performed at every step.
        t = time.perf_counter()
        step = prepare(plan, source)
        sync()
        prepare_s = time.perf_counter() - t
        prepared = []
        for _ in range(reps):
            sync()
            dist.barrier()
            t = time.perf_counter()
            got = step()
            sync()
            prepared.append(time.perf_counter() - t)
        same = same and all(torch.equal(got[k].reshape(-1), want[k]) for k in want)
        pieces = sum(len(b["pieces"]) for b in problem.target.shard(rank)["buffers"])
        del got, step, want, source
        # The floor: one copy of as many bytes within this GPU.
        a = torch.empty(moved, dtype=torch.uint8, device=gpu)
        b = torch.empty_like(a)
        floor = []
        for _ in range(reps):
            sync()
            t = time.perf_counter()
            b.copy_(a)
            sync()
            floor.append(time.perf_counter() - t)
        queue.put(
            (
                rank,
                {
                    "same": same,
                    "bytes": moved,
                    "pieces": pieces,
                    "planning_s": planning,
                    "execute_s": statistics.median(times),
                    "prepare_s": prepare_s,
                    "prepared_call_s": statistics.median(prepared),
                    "dtod_s": statistics.median(floor),
                },
            )
        )
    except BaseException as e:
        queue.put((rank, {"error": f"{type(e).__name__}: {e}"}))
    finally:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt3-350m")
    ap.add_argument("--from", dest="src", default="dp=1,zero=1")
    ap.add_argument("--to", dest="dst", default="tp=1")
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--backend", default="nccl", help="nccl (GPUs), or gloo to try the script on CPUs")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.backend == "nccl" and torch.cuda.device_count() < a.world:
        raise SystemExit(f"needs {a.world} GPU(s); this machine has {torch.cuda.device_count()}")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, a.world, port, a.model, a.src, a.dst, a.reps, a.backend, queue)) for r in range(a.world)]
    for p in procs:
        p.start()
    import queue as q

    results = {}
    while len(results) < len(procs):
        try:
            r, x = queue.get(timeout=5)
            results[r] = x
        except q.Empty:
            dead = [(i, p.exitcode) for i, p in enumerate(procs) if not p.is_alive() and i not in results]
            if dead:
                raise SystemExit(f"rank(s) died without a result (exit codes {dead})")
    for p in procs:
        p.join()
    bad = [r for r in results.values() if "error" in r or not r["same"]]
    if bad:
        raise SystemExit(f"failed: {bad}")
    r0 = results[0]
    report = {
        "machine": (torch.cuda.get_device_name(0) if a.backend == "nccl" else "CPU") + f", {platform.machine()}",
        "torch": torch.__version__,
        "backend": a.backend,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if a.backend == "nccl" else None,
        "model": a.model,
        "from": a.src,
        "to": a.dst,
        "world": a.world,
        "reps": a.reps,
        "ranks": [results[r] for r in sorted(results)],
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    print(f"{a.model} training state, {a.src} -> {a.dst} on {a.world} rank(s) ({report['machine']}), {a.backend} {report['nccl'] or ''}, median of {a.reps}")
    print("| rank | bytes | target pieces | execute (one-shot) | prepared call | one dtod copy | dtod / prepared | GB/s (prepared) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in sorted(results):
        x = results[r]
        print(
            f"| {r} | {x['bytes'] / 1e9:.2f} GB | {x['pieces']} | {x['execute_s'] * 1e3:.1f} ms | {x['prepared_call_s'] * 1e3:.1f} ms "
            f"| {x['dtod_s'] * 1e3:.2f} ms | {x['dtod_s'] / x['prepared_call_s']:.2f} | {x['bytes'] / x['prepared_call_s'] / 1e9:.0f} |"
        )
    print(f"planning (lp, rank 0): {r0['planning_s']:.2f} s; prepare (check, program, views): {r0['prepare_s'] * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
