"""What the number of tensors costs the torch.distributed executor, as it
grows: a DTensor state of N tensors (each [64, 256] bf16, 32 KiB; an MoE's
per-expert weights and their optimizer state come in the tens of
thousands) on 4 gloo processes, Shard(0) on a 1-D mesh of 4 -> Shard(1),
for N from 1,000 to 32,000.

Each rank reports, for each N: gathering the group's two layouts
(`layout_from_state_dict`), planning (`lp`), `prepare` (the checker, the
device program, and binding: views, compiled copies) and a prepared call
(median of --reps). Beside the call, in the same run: PyTorch's own path,
DTensor's `redistribute` of every tensor (its result is the oracle,
compared element for element), and the floor, gloo's `all_to_all_single`
of exactly the bytes that cross processes. The per-tensor columns say
whether a step grows linearly (flat) or faster (rising).

Run: make bench-count (or: python benches/tensor_count.py --json out.json)
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
from torch_reshard import WORLD, bytes_per_peer, timed

SHAPE = (64, 256)


def worker(rank, port, counts, reps, queue):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=1800))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    import tenplan
    from tenplan.torch import layout_from_state_dict, prepare

    mesh = init_device_mesh("cpu", (WORLD,))
    rows = []
    for n in counts:
        g = torch.Generator().manual_seed(n * WORLD + rank)
        rows_each = SHAPE[0] // WORLD
        src = {
            f"layers.{i}.experts.weight": DTensor.from_local(
                torch.randn(rows_each, SHAPE[1], generator=g).to(torch.bfloat16), mesh, [Shard(0)], run_check=False
            )
            for i in range(n)
        }
        dst = {k: DTensor.from_local(torch.empty(SHAPE[0], SHAPE[1] // WORLD, dtype=torch.bfloat16), mesh, [Shard(1)], run_check=False) for k in src}
        r = {"tensors": n}
        t = time.perf_counter()
        layouts = (layout_from_state_dict(src), layout_from_state_dict(dst))
        r["layouts_s"] = time.perf_counter() - t
        t = time.perf_counter()
        plan = tenplan.plan(tenplan.Problem(*layouts, tenplan.Cluster(f"1x{WORLD}")), "lp")
        r["plan_s"] = time.perf_counter() - t
        out = {k: v.to_local() for k, v in dst.items()}
        dist.barrier()
        t = time.perf_counter()
        push = prepare(plan, src, out=out)
        r["prepare_s"] = time.perf_counter() - t

        sends, recvs = bytes_per_peer(plan, rank)
        a2a_in = torch.empty(sum(sends), dtype=torch.uint8)
        a2a_out = torch.empty(sum(recvs), dtype=torch.uint8)

        def all_to_all():
            dist.all_to_all_single(a2a_out, a2a_in, output_split_sizes=recvs, input_split_sizes=sends)

        theirs = {}

        def redistribute():
            theirs.update({k: v.redistribute(mesh, [Shard(1)]).to_local() for k, v in src.items()})

        timed(push)  # warm up
        timed(all_to_all)
        calls, floors = [], []
        for _ in range(reps):
            calls.append(timed(push))
            floors.append(timed(all_to_all))
        r["call_s"] = calls
        r["a2a_s"] = floors
        r["redistribute_s"] = [timed(redistribute) for _ in range(max(1, reps // 3))]
        r["same"] = all(torch.equal(out[k], theirs[k]) for k in src)
        r["bytes"] = n * SHAPE[0] * SHAPE[1] * 2
        rows.append(r)
        src = dst = out = push = theirs = layouts = plan = a2a_in = a2a_out = None
    queue.put({"rank": rank, "rows": rows})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="1000,4000,16000,32000", help="tensor counts, comma-separated")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    counts = [int(x) for x in a.counts.split(",")]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, port, counts, a.reps, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    ranks = sorted((queue.get(timeout=7200) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join()
    ok = all(row["same"] for r in ranks for row in r["rows"])
    print(
        f"N DTensors of {list(SHAPE)} bf16, Shard(0) -> Shard(1) on a 1-D mesh of {WORLD} gloo processes; "
        f"per rank, the slowest rank's seconds (a call: median of {a.reps}); µs/tensor in brackets"
    )
    print("| tensors | GB | layouts | plan | prepare | call | DTensor `redistribute` | floor: `all_to_all_single` | call / floor | redistribute / call |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    table = []
    for i, n in enumerate(counts):
        rows = [r["rows"][i] for r in ranks]
        worst = {k: max(row[k] for row in rows) for k in ("layouts_s", "plan_s", "prepare_s")}
        call = statistics.median(rows[0]["call_s"])
        floor = statistics.median(rows[0]["a2a_s"])
        theirs = statistics.median(rows[0]["redistribute_s"])
        ratios = sorted(c / f for c, f in zip(rows[0]["call_s"], rows[0]["a2a_s"]))

        def cell(s):
            return f"{s:.3f} [{s / n * 1e6:.0f}]"

        print(
            f"| {n} | {rows[0]['bytes'] / 1e9:.2f} | {cell(worst['layouts_s'])} | {cell(worst['plan_s'])} | {cell(worst['prepare_s'])} | "
            f"{cell(call)} | {cell(theirs)} | {floor:.3f} | {statistics.median(ratios):.2f}x | {theirs / call:.1f}x |"
        )
        table.append({"tensors": n, "bytes": rows[0]["bytes"], **worst, "call_s": call, "a2a_s": floor, "redistribute_s": theirs, "call_vs_floor_paired": statistics.median(ratios)})
    print(f"results identical to DTensor's redistribute: {'yes' if ok else 'NO'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__},
                    "shape": SHAPE,
                    "reps": a.reps,
                    "rows": table,
                    "identical": ok,
                    "ranks": ranks,
                },
                f,
                indent=1,
            )
    if not ok:
        raise SystemExit("a result differs from DTensor's redistribute")


if __name__ == "__main__":
    main()
