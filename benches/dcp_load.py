"""PyTorch DCP loading a checkpoint, for `tenplan-bench executor` to compare
its own load with in the same run.

    python benches/dcp_load.py CKPT --scratch DIR --reps 5 --json OUT

CKPT is a tenplan checkpoint (per-rank safetensors files carrying
DCP_SHARDING_INFO). WORLD gloo processes on this machine load it into
DTensors placed Shard(0) on a 1-D mesh (uneven where WORLD does not divide
the rows), in two formats:

- "hf": the tenplan files themselves, through DCP's HuggingFaceStorageReader;
- "distcp": DCP's own format, written once with dcp.save under --scratch
  from the state just loaded, read back with FileSystemReader.

Each load allocates its state dict (as a restarting job does) and is timed
between barriers; "warm" after one untimed load, "cold" with the files
evicted from the page cache (posix_fadvise DONTNEED: they were synced when
written) before each load. Medians go to --json, with torch's version and
the machine.
"""

import argparse
import datetime
import glob
import json
import os
import platform
import shutil
import socket
import statistics
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4


def evict(directory):
    for f in glob.glob(os.path.join(directory, "*")):
        if os.path.isfile(f):
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def worker(rank, port, ckpt, scratch, reps, queue):
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=900))
    try:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemReader, HuggingFaceStorageReader
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        mesh = init_device_mesh("cpu", (WORLD,))
        meta = HuggingFaceStorageReader(ckpt).read_metadata().state_dict_metadata
        specs = {k: (torch.Size(m.size), m.properties.dtype) for k, m in sorted(meta.items())}

        def fresh():
            out = {}
            for k, (shape, dtype) in specs.items():
                local, _ = compute_local_shape_and_global_offset(shape, mesh, [Shard(0)])
                out[k] = DTensor.from_local(
                    torch.empty(local, dtype=dtype), mesh, [Shard(0)], run_check=False,
                    shape=shape, stride=torch.empty(shape, device="meta").stride())
            return out

        def measure(directory, reader):
            def once():
                state = fresh()
                dcp.load(state, storage_reader=reader(directory))
                return state

            once()
            warm, cold = [], []
            for evicted, out in ((False, warm), (True, cold)):
                for _ in range(reps):
                    if evicted and rank == 0:
                        evict(directory)
                    dist.barrier()
                    t = time.perf_counter()
                    state = once()
                    dist.barrier()
                    out.append(time.perf_counter() - t)
                    del state
            return {"warm_s": statistics.median(warm), "cold_s": statistics.median(cold), "warm": warm, "cold": cold}

        result = {"hf": measure(ckpt, HuggingFaceStorageReader)}
        native = os.path.join(scratch, "distcp")
        if rank == 0:
            shutil.rmtree(native, ignore_errors=True)
        dist.barrier()
        state = fresh()
        dcp.load(state, storage_reader=HuggingFaceStorageReader(ckpt))
        dcp.save(state, checkpoint_id=native)
        del state
        result["distcp"] = measure(native, FileSystemReader)
        dist.barrier()
        if rank == 0:
            shutil.rmtree(native, ignore_errors=True)
            result["bytes"] = sum(s.numel() * torch.empty((), dtype=d).element_size() for s, d in specs.values())
            result["tensors"] = len(specs)
            queue.put(result)
    finally:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("--scratch", required=True, help="directory for DCP's own format (same disk as CKPT)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, port, a.ckpt, a.scratch, a.reps, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise SystemExit(f"dcp_load: a rank failed (exit codes {[p.exitcode for p in procs]})")
    result = queue.get(timeout=60)
    result.update(
        ranks=WORLD,
        placement="Shard(0) on a 1-D mesh",
        torch=torch.__version__,
        machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus",
        reps=a.reps,
    )
    tmp = a.json + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, a.json)


if __name__ == "__main__":
    main()
