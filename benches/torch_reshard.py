"""tenplan's torch.distributed executor on 4 gloo processes against the
physical floor of its transport and against PyTorch's own path, measured
in the same run (median of --reps), the results compared element for
element.

Three cases (--case):
- ``placements``: a DTensor state dict of GPT-3 350M's weights in fp32
  (1.42 GB, the shapes of tenplan's catalog model), Shard(0) on a 1-D mesh
  of 4 -> Shard(1) (1-D tensors stay Shard(0)); beside it, DCP's save +
  load through /dev/shm into the new placement.
- ``sync``: an RL weight sync, the rl suite's smallest row scaled to fit
  here: a trainer of tp=2 (ranks 0-1, Megatron's layout) to two inference
  engines of tp=1 (ranks 2 and 3), bf16 weights of GPT-3 350M.
- ``partial``: gradients before their reduction, GPT-3 350M bf16 as
  DTensors with ``Partial()`` on a 1-D mesh of 4 (every rank holds an
  addend of every tensor) -> Shard(0), the reduce-scatter FSDP2 makes;
  beside it, DTensor's own ``redistribute`` of each tensor, FSDP2's own
  path (every gradient's chunks copied into one flat buffer, one
  ``reduce_scatter_tensor``) and that collective alone, timed after the
  floors (their buffers and these do not fit this machine's memory
  together).

tenplan's time is a prepared plan's call (bound once, as a training or RL
loop that reshards again and again does); planning, binding and a one-call
``execute`` are reported beside it. The floors move exactly the bytes that
cross processes in the plan, with nothing else to do: gloo's
``all_to_all_single`` with the plan's bytes per pair, and a ring of plain
send/recv in which each rank receives as many bytes as in the plan (one
peer at a time, gloo's fastest pattern here); and the all_to_all after a
contiguous copy of as many bytes as tenplan copies within each rank (the
rearrangement any executor does beside the transfers). Beside tenplan's
call, the same plan with every copy torch's own ``copy_`` (what the
executor did before its CPU copies were compiled). Floors and tenplan's
calls are timed in turn, so that all see the same machine, and each is
compared with a floor by the median of the repetitions' ratios (each
repetition times both back to back). Where a prepared
call's time goes (packing, posting sends and receives, waiting on the
transport, writing, local copies, the final agreement) is reported per
rank.

Run: make bench-torch (or: python benches/torch_reshard.py --case sync --json out.json)
"""

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4


def timed(fn):
    dist.barrier()
    t = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t


def bytes_per_peer(plan, rank):
    """The bytes this rank sends to and receives from each peer in the
    plan: what a floor collective moves."""
    import tenplan

    sends, recvs = [0] * WORLD, [0] * WORLD
    for s in tenplan.program(plan, rank)["steps"]:
        for t in s["sends"]:
            sends[t["peer"]] += t["bytes"]
        for t in s["recvs"]:
            recvs[t["peer"]] += t["bytes"]
    return sends, recvs


def dtensor_case(rank, model, shm, no_dcp):
    """Source tensors, plan, and a check of the result against DCP's."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    import tenplan
    from tenplan.torch import describe, layout_from_descriptions

    mesh = init_device_mesh("cpu", (WORLD,))
    layout = tenplan.Model(model).layout("tp=1", state="weights:f32")
    full = {t["name"]: t["shape"] for t in layout.tensors()}
    src_pl = {n: [Shard(0)] for n in full}
    dst_pl = {n: [Shard(1)] if len(s) > 1 else [Shard(0)] for n, s in full.items()}
    g = torch.Generator().manual_seed(rank)

    def dtensors(placements, fill):
        out = {}
        for n, s in full.items():
            local, _ = compute_local_shape_and_global_offset(s, mesh, placements[n])
            out[n] = DTensor.from_local(fill(local), mesh, placements[n], run_check=False, shape=torch.Size(s), stride=torch.empty(s, device="meta").stride())
        return out

    src = dtensors(src_pl, lambda shape: torch.randn(shape, generator=g))

    def target_descriptions():
        out = []
        for r in range(WORLD):
            d = []
            for n, s in full.items():
                # The box rank r holds under the target placement (torch.chunk rules).
                dim = dst_pl[n][0].dim
                chunk = -(-s[dim] // WORLD)
                lo = min(r * chunk, s[dim])
                box = [(0, x) for x in s]
                box[dim] = (lo, min(lo + chunk, s[dim]))
                d.append({"name": n, "dtype": "f32", "shape": list(s), "box": box})
            out.append(d)
        return out

    t = time.perf_counter()
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, describe(src))
    source = layout_from_descriptions(gathered)
    target = layout_from_descriptions(target_descriptions())
    plan = tenplan.plan(tenplan.Problem(source, target, tenplan.Cluster(f"1x{WORLD}")), "lp")
    plan_s = time.perf_counter() - t

    dst = dtensors(dst_pl, torch.empty)
    path = os.path.join(shm, "tenplan-bench-dcp")

    def run_dcp():
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        dist.barrier()
        dcp.save(src, checkpoint_id=path)
        dcp.load(dst, checkpoint_id=path)

    def check(result):
        if no_dcp:
            return True
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        return all(torch.equal(result[n], dst[n].to_local()) for n in full if dst[n].to_local().numel())

    return src, plan, plan_s, sum(torch.Size(s).numel() * 4 for s in full.values()), (None if no_dcp else run_dcp), check, {}


def sync_case(rank, model):
    """Trainer tp=2 on ranks 0-1 to two tp=1 engines on ranks 2 and 3."""
    import tenplan
    from tenplan.torch import DTYPES

    m = tenplan.Model(model)
    trainer = m.layout("tp=2,devices=0-1", state="weights:bf16")
    engines = m.layout("tp=1,dp=2,devices=2-3", state="weights:bf16")
    t = time.perf_counter()
    plan = tenplan.plan(tenplan.Problem(trainer, engines, tenplan.Cluster(f"1x{WORLD}")), "lp")
    plan_s = time.perf_counter() - t
    names = [t["name"] for t in trainer.tensors()]
    shapes = {t["name"]: t["shape"] for t in trainer.tensors()}

    def value(name):
        # Each tensor's values from its name alone, the same on every rank.
        g = torch.Generator().manual_seed(names.index(name))
        return torch.randn(shapes[name], generator=g).to(torch.bfloat16)

    def buffers(layout):
        shard = layout.shard(rank)
        out = {}
        for b in shard["buffers"] if shard else []:
            buf = torch.zeros(b["len"], dtype=DTYPES[b["dtype"]])
            for p in b["pieces"]:
                part = value(names[p["tensor"]])[tuple(slice(lo, hi) for lo, hi in p["box"])]
                buf[p["offset"] : p["offset"] + part.numel()] = part.reshape(-1)
            out[b["name"]] = buf
        return out

    src = buffers(trainer)
    want = buffers(engines)
    total = sum(torch.Size(s).numel() * 2 for s in shapes.values())

    def check(result):
        return set(result) == set(want) and all(torch.equal(result[k].reshape(-1), want[k]) for k in want)

    return src, plan, plan_s, total, None, check, {}


def partial_case(rank, model, no_peer):
    """Gradients as DTensor holds them before their reduction (Partial() on
    a 1-D mesh of 4: every rank an addend of every tensor) to Shard(0), as
    FSDP2 reduce-scatters them; beside it, DTensor's own redistribute and
    FSDP2's own path. In bf16: four fp32 addends of the model and the
    floors' buffers do not fit this machine's memory."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    import tenplan
    from tenplan.torch import layout_from_state_dict

    mesh = init_device_mesh("cpu", (WORLD,))
    layout = tenplan.Model(model).layout("tp=1", state="weights:f32")
    full = {t["name"]: torch.Size(t["shape"]) for t in layout.tensors()}

    def stride(s):
        return torch.empty(s, device="meta").stride()

    src, dst = {}, {}
    for i, (n, s) in enumerate(full.items()):
        # Small integers: the sums are exact whatever order adds them.
        g = torch.Generator().manual_seed(i * WORLD + rank)
        addend = torch.randint(-8, 8, s, generator=g).to(torch.bfloat16)
        src[n] = DTensor.from_local(addend, mesh, [Partial()], run_check=False, shape=s, stride=stride(s))
        local, _ = compute_local_shape_and_global_offset(s, mesh, [Shard(0)])
        dst[n] = DTensor.from_local(torch.empty(local, dtype=torch.bfloat16), mesh, [Shard(0)], run_check=False, shape=s, stride=stride(s))
    t = time.perf_counter()
    plan = tenplan.plan(tenplan.Problem(layout_from_state_dict(src), layout_from_state_dict(dst), tenplan.Cluster(f"1x{WORLD}")), "lp")
    plan_s = time.perf_counter() - t
    reduced = {}

    def redistribute():
        reduced.update({n: v.redistribute(mesh, [Shard(0)]).to_local() for n, v in src.items()})

    # FSDP2's own path (its foreach_reduce): every gradient's dim-0 chunks,
    # padded to equal rows, laid out rank by rank in one flat buffer
    # (torch._chunk_cat), then one reduce_scatter_tensor: each rank
    # receives its padded chunk of every gradient, summed.
    # Its buffers are made at its first call, after the floors' are freed:
    # this machine's memory holds one set or the other.
    addends = [src[n].to_local() for n in full]
    padded = [-(-s[0] // WORLD) * (s.numel() // s[0]) for s in full.values()]
    flat = {}

    def buffers():
        if not flat:
            flat.update({"in": torch.zeros(WORLD, sum(padded), dtype=torch.bfloat16), "out": torch.empty(sum(padded), dtype=torch.bfloat16)})
        return flat["in"], flat["out"]

    def reduce_scatter():
        flat_in, flat_out = buffers()
        dist.reduce_scatter_tensor(flat_out, flat_in.view(-1))

    def fsdp2():
        torch._chunk_cat(addends, dim=0, num_chunks=WORLD, out=buffers()[0])
        reduce_scatter()

    def check(result):
        # The peers ran last: `reduced` and FSDP2's output are the sums.
        if not reduced:
            redistribute()
        ours = all(torch.equal(result[n], reduced[n]) for n in full if reduced[n].numel())
        theirs = all(torch.equal(seg[: reduced[n].numel()].view(reduced[n].shape), reduced[n]) for n, seg in zip(full, flat["out"].split(padded)))
        for who, same in (("tenplan", ours), ("FSDP2's path", theirs)):
            if not same:
                print(f"rank {rank}: {who}'s result differs from DTensor's redistribute", file=sys.stderr)
        return ours and theirs

    peers = {"redistribute_s": redistribute} if not no_peer else {}
    peers.update({"fsdp2_s": fsdp2, "reduce_scatter_s": reduce_scatter})
    return src, plan, plan_s, sum(s.numel() * 2 for s in full.values()), None, check, peers


def worker(rank, port, case, model, reps, shm, queue, no_dcp):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=600))
    import tenplan
    from tenplan.torch import execute, prepare

    # peers: PyTorch's own paths beside DCP's, timed after the floors.
    if case == "sync":
        src, plan, plan_s, total, run_dcp, check, peers = sync_case(rank, model)
    elif case == "partial":
        src, plan, plan_s, total, run_dcp, check, peers = partial_case(rank, model, no_dcp)
    else:
        src, plan, plan_s, total, run_dcp, check, peers = dtensor_case(rank, model, shm, no_dcp)

    import tenplan.torch

    t = time.perf_counter()
    prepared = prepare(plan, src)
    bind_s = time.perf_counter() - t
    # The same plan with every copy torch's own copy_ (what the executor
    # did before its CPU copies were compiled into memcpys), timed beside it.
    tenplan.torch._NATIVE_COPIES = False
    prepared_torch = prepare(plan, src)
    tenplan.torch._NATIVE_COPIES = True
    result, parts, parts_torch = {}, [], []

    def run_tenplan():
        result.update(prepared())
        parts.append(prepared.timings)

    def run_torch_copies():
        prepared_torch()
        parts_torch.append(prepared_torch.timings)

    # The floors: exactly the bytes this rank sends to and receives from
    # each peer in the plan.
    sends, recvs = bytes_per_peer(plan, rank)
    a2a_in = torch.empty(sum(sends), dtype=torch.uint8)
    a2a_out = torch.empty(sum(recvs), dtype=torch.uint8)

    def all_to_all():
        dist.all_to_all_single(a2a_out, a2a_in, output_split_sizes=recvs, input_split_sizes=sends)

    sizes = [None] * WORLD
    dist.all_gather_object(sizes, sum(recvs))
    # The ring reuses the all_to_all's buffers where they are large enough
    # (the floors run in turn): the partial case fills this machine's memory.
    ring_bytes = max(sizes[(rank + 1) % WORLD], 1)
    ring_in = a2a_in[:ring_bytes] if a2a_in.numel() >= ring_bytes else torch.empty(ring_bytes, dtype=torch.uint8)
    ring_out = a2a_out if a2a_out.numel() else torch.empty(1, dtype=torch.uint8)

    # Any executor also rearranges: it copies the bytes it packs and those
    # that stay on the rank into their places (tenplan's copies on this
    # rank, a contiguous copy of as many bytes here).
    copy_in = torch.ones(max(prepared.copied_bytes, 1), dtype=torch.uint8)
    copy_out = torch.empty_like(copy_in)

    def all_to_all_and_copy():
        copy_out.copy_(copy_in)
        all_to_all()

    def ring():
        ops = [dist.P2POp(dist.isend, ring_in, (rank + 1) % WORLD), dist.P2POp(dist.irecv, ring_out, (rank - 1) % WORLD)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()

    timed_in_turn = {"tenplan_s": run_tenplan, "torch_copies_s": run_torch_copies, "a2a_s": all_to_all, "a2a_copy_s": all_to_all_and_copy, "ring_s": ring}
    times = {k: [] for k in timed_in_turn}
    for fn in timed_in_turn.values():  # warm up
        timed(fn)
    parts.clear()
    parts_torch.clear()
    for _ in range(reps):
        for k, fn in timed_in_turn.items():
            times[k].append(timed(fn))
    # One call that binds, allocates its target and performs the plan.
    # Peak resident memory of this rank (GB) after each phase.
    peak_gb = {"floors": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}
    # The floors' buffers and the copy_ path go before what follows
    # allocates its own.
    a2a_in = a2a_out = ring_in = ring_out = copy_in = copy_out = prepared_torch = None
    times["execute_once_s"] = [timed(lambda: execute(plan, src)) for _ in range(max(1, reps // 3))]
    times["dcp_s"] = [timed(run_dcp) for _ in range(reps)] if run_dcp else [float("nan")]
    for k, fn in peers.items():
        timed(fn)  # warm up
        times[k] = [timed(fn) for _ in range(reps)]
    same = check(result)
    queue.put(
        {
            "rank": rank,
            "plan_s": plan_s,
            "bind_s": bind_s,
            **times,
            "parts": {k: statistics.median(p[k] for p in parts) for k in parts[0]},
            "parts_torch_copies": {k: statistics.median(p[k] for p in parts_torch) for k in parts_torch[0]},
            "recv_bytes": sum(recvs),
            "copied_bytes": prepared.copied_bytes,
            "bytes": total,
            "same": same,
            "peak_gb": {**peak_gb, "end": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6},
        }
    )
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=["placements", "sync", "partial"], default="placements")
    ap.add_argument("--model", default="gpt3-350m")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--shm", default="/dev/shm")
    ap.add_argument("--json")
    ap.add_argument("--no-dcp", action="store_true", help="measure tenplan and the floors only (no DCP, no DTensor redistribute)")
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, port, a.case, a.model, a.reps, a.shm, queue, a.no_dcp)) for r in range(WORLD)]
    for p in procs:
        p.start()
    rows = sorted((queue.get(timeout=3600) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join()
    r0 = rows[0]
    peers = [k for k in ("redistribute_s", "fsdp2_s", "reduce_scatter_s") if k in r0]
    med = {k: statistics.median(r0[k]) for k in ("tenplan_s", "torch_copies_s", "execute_once_s", "dcp_s", "a2a_s", "a2a_copy_s", "ring_s", *peers)}
    total, recv = r0["bytes"], sum(r["recv_bytes"] for r in rows)
    ok = all(r["same"] for r in rows)
    what = {
        "placements": f"{a.model} fp32 weights, {total / 1e9:.2f} GB, Shard(0) -> Shard(1)",
        "sync": f"{a.model} bf16 weights, {total / 1e9:.2f} GB, trainer tp=2 (ranks 0-1) -> two engines of tp=1 (ranks 2, 3)",
        "partial": f"{a.model} bf16 gradients, {total / 1e9:.2f} GB per addend, Partial() (an addend on every rank) -> Shard(0)",
    }[a.case]
    ten = med["tenplan_s"]
    # Each repetition times tenplan and the floors back to back, so the
    # ratio within a repetition sees one state of this shared machine:
    # their median (and spread) is steadier than a ratio of medians.
    paired = {
        floor: sorted(t / f for t, f in zip(r0["tenplan_s"], r0[key]))
        for floor, key in (("all_to_all", "a2a_s"), ("all_to_all_and_copy", "a2a_copy_s"), ("ring", "ring_s"))
    }

    def at(floor: str) -> str:
        ratios = paired[floor]
        return f"tenplan at {statistics.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})"

    print(f"{what} on {WORLD} gloo processes; median of {a.reps} (against a floor: the median of the repetitions' ratios, and their range)")
    print("| path | seconds | GB/s of state | vs tenplan |")
    print("|---|---|---|---|")
    print(f"| tenplan torch executor, prepared once (plan {r0['plan_s']:.2f} s, bind {r0['bind_s']:.2f} s) | {ten:.3f} | {total / 1e9 / ten:.2f} | 1.00 |")
    print(
        f"| the same, every copy torch's `copy_` (before its CPU copies were compiled) | {med['torch_copies_s']:.3f} | {total / 1e9 / med['torch_copies_s']:.2f} | {med['torch_copies_s'] / ten:.2f}x slower |"
    )
    print(f"| tenplan `execute` in one call (binds, allocates the target) | {med['execute_once_s']:.3f} | {total / 1e9 / med['execute_once_s']:.2f} | {med['execute_once_s'] / ten:.2f}x slower |")
    if a.case == "placements" and not a.no_dcp:
        print(f"| DCP save + load through {a.shm} | {med['dcp_s']:.3f} | {total / 1e9 / med['dcp_s']:.2f} | {med['dcp_s'] / ten:.2f}x slower |")
    labels = {
        "redistribute_s": "DTensor's `redistribute` to Shard(0) (a reduce-scatter per tensor)",
        "fsdp2_s": "FSDP2's path: `torch._chunk_cat` of every gradient into one flat buffer, one gloo `reduce_scatter_tensor`",
        "reduce_scatter_s": "that `reduce_scatter_tensor` alone (the gradients already flat)",
    }
    for k in peers:
        print(f"| {labels[k]} | {med[k]:.3f} | {total / 1e9 / med[k]:.2f} | {med[k] / ten:.2f}x slower |")
    print(f"| floor: gloo all_to_all_single of the plan's bytes per pair ({recv / 1e9:.2f} GB in all) | {med['a2a_s']:.3f} | | {at('all_to_all')} |")
    copied = sum(r["copied_bytes"] for r in rows)
    print(
        f"| floor with the rearrangement: the same all_to_all_single after a contiguous copy of the bytes tenplan copies within each rank ({copied / 1e9:.2f} GB in all) | {med['a2a_copy_s']:.3f} | | {at('all_to_all_and_copy')} |"
    )
    print(f"| floor: gloo ring, each rank receiving its bytes from one peer | {med['ring_s']:.3f} | | {at('ring')} |")
    oracle = {"placements": "the source" if a.no_dcp else "DCP", "sync": "the source", "partial": "DTensor"}[a.case]
    print(f"results identical to {oracle}'s: {'yes' if ok else 'NO'}")
    floors_gb, end_gb = (max(r["peak_gb"][phase] for r in rows) for phase in ("floors", "end"))
    print(f"peak resident memory of a rank: {floors_gb:.2f} GB through tenplan's calls and the floors, {end_gb:.2f} GB at the end ({WORLD} ranks on this machine)")
    names = list(r0["parts"])
    print()
    print("where a prepared call's time goes, per rank (median seconds; post + transport = gloo's share), copies compiled / torch's `copy_`:")
    print("| rank | copies | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for r in rows:
        for label, key in (("compiled", "parts"), ("torch", "parts_torch_copies")):
            print(f"| {r['rank']} | {label} | " + " | ".join(f"{r[key][k]:.3f}" for k in names) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__},
                    "case": a.case,
                    "model": a.model,
                    "bytes": total,
                    "recv_bytes": recv,
                    "reps": a.reps,
                    "median_s": med,
                    "plan_s": r0["plan_s"],
                    "copied_bytes": copied,
                    "vs_floor": {"all_to_all": ten / med["a2a_s"], "all_to_all_and_copy": ten / med["a2a_copy_s"], "ring": ten / med["ring_s"]},
                    "vs_floor_paired": {k: {"median": statistics.median(v), "min": v[0], "max": v[-1]} for k, v in paired.items()},
                    "torch_copies_vs_floor": {"all_to_all": med["torch_copies_s"] / med["a2a_s"], "all_to_all_and_copy": med["torch_copies_s"] / med["a2a_copy_s"], "ring": med["torch_copies_s"] / med["ring_s"]},
                    **({} if a.case == "partial" else {"speedup_vs_dcp": med["dcp_s"] / ten}),
                    **{f"speedup_vs_{k.removesuffix('_s')}": med[k] / ten for k in peers},
                    "identical": ok,
                    "ranks": rows,
                },
                f,
                indent=1,
            )
    if not ok:
        raise SystemExit(f"a result differs from {oracle}'s")


if __name__ == "__main__":
    main()
