"""The torch.distributed executor on NCCL: one process per GPU performs
verified plans on CUDA tensors, byte for byte. NCCL refuses two ranks on one
GPU ("Duplicate GPU detected"), so each case runs only where the machine has
a GPU for every rank; on a machine without GPUs every case is skipped."""

import pytest

torch = pytest.importorskip("torch")

import tenplan  # noqa: E402
from _dist import run  # noqa: E402
from test_torch_executor import global_tensors, materialize  # noqa: E402


def gpus():
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() and torch.distributed.is_nccl_available() else 0
    except Exception:
        return 0


def _reshard_on_gpu(rank, world, model, src, dst, cluster, planner):
    from tenplan.torch import execute

    m = tenplan.Model(model)
    problem = tenplan.Problem(m.layout(src), m.layout(dst), tenplan.Cluster(cluster))
    plan = tenplan.plan(problem, planner)
    g = global_tensors(problem.source, 13)
    gpu = torch.device("cuda", rank)
    source = {k: v.to(gpu) for k, v in materialize(problem.source, rank, g).items()}
    got = execute(plan, source)
    want = materialize(problem.target, rank, g)
    assert set(got) == set(want)
    for k in want:
        assert got[k].device == gpu, (k, got[k].device)
        assert torch.equal(got[k].reshape(-1).cpu(), want[k]), k
    sends = sum(len(s["sends"]) for s in tenplan._tenplan.program(plan, rank)["steps"])
    return {"buffers": len(want), "sends": sends}


CASES = [
    # One GPU: ZeRO-1's flat optimizer buffers to per-tensor buffers, all
    # local gathers and writes on the GPU (no peer).
    (1, "llama-tiny", "dp=1,zero=1", "tp=1", "1x1"),
    # Two or more: the plans' sends and receives go through NCCL
    # (batch_isend_irecv), within a node and across two.
    (2, "gpt-tiny", "tp=2", "dp=2", "1x2"),
    (4, "gpt-tiny", "tp=2,dp=2", "dp=4", "1x4"),
    (4, "llama-tiny", "tp=2,dp=2,zero=1", "tp=4", "2x2"),
    (8, "mixtral-tiny", "tp=2,pp=2,dp=2,ep=2,zero=1", "tp=1,pp=2,dp=4,ep=4", "2x4"),
]


@pytest.mark.parametrize("world,model,src,dst,cluster", CASES, ids=[f"{c[0]}gpu-{c[1]}" for c in CASES])
@pytest.mark.parametrize("planner", ["lp", "tenplex"])
def test_nccl_reshard_on_gpus(world, model, src, dst, cluster, planner):
    if gpus() < world:
        pytest.skip(f"needs {world} GPU(s) and NCCL; this machine has {gpus()}")
    results = run(_reshard_on_gpu, world, model, src, dst, cluster, planner, backend="nccl")
    assert all(s == "ok" for s, _ in results), results
    out = [v for _, v in results]
    assert all(o["buffers"] > 0 for o in out), out
    if world > 1:
        assert any(o["sends"] for o in out), "the plan crosses ranks"
