"""Run a function on a process group of N local processes (gloo, or NCCL
with one GPU per rank)."""

import datetime
import multiprocessing as mp
import os
import socket
import traceback


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank, world, port, args, queue, timeout_s, backend):
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s)
        )
        out = fn(rank, world, *args)
        queue.put((rank, "ok", out))
    except BaseException as e:  # reported to the test, which decides
        queue.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def run(fn, world, *args, timeout_s=60, join_s=120, backend="gloo"):
    """Results by rank: ("ok", value) or ("error", message); a rank that
    exits without reporting gives ("died", None)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, args, queue, timeout_s, backend)) for r in range(world)]
    for p in procs:
        p.start()
    import queue as q
    import time

    results = {}
    end = time.time() + join_s
    while len(results) < world and time.time() < end:
        try:
            rank, status, value = queue.get(timeout=0.5)
            results[rank] = (status, value)
        except q.Empty:
            if all(not p.is_alive() for p in procs):
                break
    while True:
        try:
            rank, status, value = queue.get(timeout=0.5)
            results[rank] = (status, value)
        except q.Empty:
            break
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    return [results.get(r, ("died", None)) for r in range(world)]
