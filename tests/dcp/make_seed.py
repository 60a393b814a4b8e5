"""Write the tiny DCP checkpoint committed as fuzz/seeds/dcp (the fuzzer's
seed, and a fixture real torch wrote for tests without Python):
torch.distributed.checkpoint.save on 2 gloo processes of a DTensor `w`
(5 x 4 bf16, Shard(0): uneven rows), a replicated `b` (3 f32) and an
integer `step`.

    python tests/dcp/make_seed.py OUT
"""
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def run(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    w = torch.arange(20, dtype=torch.float32).reshape(5, 4).to(torch.bfloat16)
    b = torch.tensor([0.5, -1.0, 2.0])
    state = {"w": distribute_tensor(w, mesh, [Shard(0)]), "b": distribute_tensor(b, mesh, [Replicate()]),
             "step": 3}
    dcp.save(state, checkpoint_id=out)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(port, sys.argv[1]), nprocs=2, join=True)
