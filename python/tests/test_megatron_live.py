"""A Megatron-Core job's state moved in memory to another parallel
configuration (tenplan.megatron.reshard), against Megatron's own path:
`dist_checkpointing.save` under the old configuration and `load` under the
new one. Real megatron-core on 4 gloo processes, the tiny Llama-shaped
GPTModel of tests/megatron/make_checkpoints.py."""

import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from _dist import run  # noqa: E402

HARNESS = Path(__file__).resolve().parents[2] / "tests" / "megatron"
WORLD = 4


def _harness():
    if str(HARNESS) not in sys.path:
        sys.path.insert(0, str(HARNESS))
    import make_checkpoints as mk

    mk.cpu_only_forward_patches()
    return mk


def _garbled(model):
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    return model


def _losses(mk, model, steps=3):
    """Training steps on fixed batches (SGD), the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for step in range(steps):
        g = torch.Generator().manual_seed(100 + step)
        tokens = torch.randint(0, mk.VOCAB, (2, mk.SEQ), generator=g)
        pos = torch.arange(mk.SEQ).unsqueeze(0).expand_as(tokens)
        mask = torch.ones(1, 1, mk.SEQ, mk.SEQ, dtype=torch.bool).triu(1)
        logits = model(tokens, pos, mask)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, mk.VOCAB).float(), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def _move(rank, world, directory, target):
    import tenplan.megatron
    from megatron.core import dist_checkpointing, parallel_state

    mk = _harness()
    tp, pp = target
    source = mk.build(2, 2)
    # Megatron's own path: save under the old configuration...
    t0 = time.perf_counter()
    dist_checkpointing.save(source.sharded_state_dict(), directory)
    saved = time.perf_counter() - t0
    old = source.sharded_state_dict()
    parallel_state.destroy_model_parallel()
    # ... and tenplan's: straight into the new configuration's model.
    moved = _garbled(mk.build(tp, pp))
    t0 = time.perf_counter()
    report = tenplan.megatron.reshard(old, moved.sharded_state_dict())
    ours = time.perf_counter() - t0
    parallel_state.destroy_model_parallel()
    loaded = _garbled(mk.build(tp, pp))
    t0 = time.perf_counter()
    loaded.load_state_dict(dist_checkpointing.load(loaded.sharded_state_dict(), directory))
    load = time.perf_counter() - t0
    a, b = moved.state_dict(), loaded.state_dict()
    differ = sorted(k for k, v in b.items() if isinstance(v, torch.Tensor) and not torch.equal(a[k], v))
    result = {
        "tensors": report["tensors"],
        "differ": differ,
        "lower_bound_s": report.get("lower_bound_s"),
        "seconds": {"tenplan": ours, "save": saved, "load": load},
    }
    if (tp, pp) == (1, 1):
        result["losses"] = (_losses(mk, moved), _losses(mk, loaded))
    parallel_state.destroy_model_parallel()
    return result


@pytest.mark.parametrize("target", [(1, 1), (2, 1)], ids=["tp1-dp4", "tp2-dp2"])
def test_live_reshard_equals_megatrons_save_and_load(tmp_path, target):
    (tmp_path / "ckpt").mkdir()
    results = run(_move, WORLD, str(tmp_path / "ckpt"), target, timeout_s=120, join_s=300)
    for rank in range(WORLD):
        status, value = results[rank]
        assert status == "ok", value
        assert value["differ"] == [], value
        assert value["tensors"] == 9, value
        if "losses" in value:
            ours, megatrons = value["losses"]
            assert ours == megatrons, value
    # The checkpoint Megatron saved on the way, through the package.
    import tenplan

    checked = tenplan.check(tmp_path / "ckpt")
    assert (checked["format"], checked["tp"], checked["pp"]) == ("Megatron-Core torch_dist", 2, 2), checked
    moved = tenplan.reshard(tmp_path / "ckpt", tmp_path / "moved", f"tp={target[0]},pp=2")
    assert moved["format"] == "Megatron-Core torch_dist" and moved["excluded"] == [], moved
    assert tenplan.diff(tmp_path / "ckpt", tmp_path / "moved")["identical"]


def _mismatch(rank, world):
    import tenplan
    import tenplan.megatron
    from megatron.core import parallel_state

    mk = _harness()
    old = mk.build(2, 2).sharded_state_dict()
    parallel_state.destroy_model_parallel()
    new = mk.build(1, 1).sharded_state_dict()
    # The target lacks the output layer.
    new.pop("output_layer.weight")
    try:
        tenplan.megatron.reshard(old, new)
    except tenplan.TenplanError as e:
        return str(e)
    finally:
        parallel_state.destroy_model_parallel()
    return None


def test_a_target_without_a_tensor_is_refused_on_every_rank():
    results = run(_mismatch, WORLD, timeout_s=60, join_s=200)
    for rank in range(WORLD):
        status, value = results[rank]
        assert status == "ok", value
        assert value is not None and "output_layer.weight" in value and "missing from the target" in value, value


def _state_of(ddp, optim):
    """A job's model weights and every optimizer state tensor, cloned."""
    out = {f"model.{k}": v.clone() for k, v in ddp.module.state_dict().items() if isinstance(v, torch.Tensor)}
    for j, part in enumerate(getattr(optim, "chained_optimizers", [optim])):
        for i, per_param in part.optimizer.state_dict()["state"].items():
            for k, v in per_param.items():
                out[f"optimizer.{j}.{i}.{k}"] = v.clone()
    return out


def _new_job(mk):
    """The new configuration's job (tp=1 over the 4 ranks: dp=4), its
    optimizer state made (torch's AdamW keeps none before a step, which
    Megatron's load needs), and what it loads into."""
    ddp, optim = mk.with_optimizer(mk.build(1, 1))
    for part in getattr(optim, "chained_optimizers", [optim]):
        part._init_optimizer_states_with_dummy_values()
    msd = ddp.module.sharded_state_dict()
    target = {"model": msd, "optimizer": optim.sharded_state_dict(msd, is_loading=True, metadata=mk.FULLY_RESHARDABLE)}
    return ddp, optim, target


def _move_with_optimizer(rank, world, directory):
    import tenplan.megatron
    from megatron.core import dist_checkpointing, parallel_state

    mk = _harness()
    mk.cpu_only_optimizer_patches()
    # The old job: tp=2, dp=2, Megatron's distributed optimizer, two steps.
    ddp, optim = mk.with_optimizer(mk.build(2, 1))
    mk.train_steps(ddp, optim, 0, 2)

    def state():
        msd = ddp.module.sharded_state_dict()
        return {"model": msd, "optimizer": optim.sharded_state_dict(msd, metadata=mk.FULLY_RESHARDABLE)}

    dist_checkpointing.save(state(), directory)
    old = state()
    parallel_state.destroy_model_parallel()
    results = {}
    for how in ["tenplan", "megatron"]:
        new_ddp, new_optim, target = _new_job(mk)
        if how == "tenplan":
            loaded, report = tenplan.megatron.load(old, target)
        else:
            loaded = dist_checkpointing.load(target, directory)
        new_ddp.module.load_state_dict(loaded["model"])
        new_optim.load_state_dict(loaded["optimizer"])
        before = _state_of(new_ddp, new_optim)
        losses = mk.train_steps(new_ddp, new_optim, 2, 2)
        results[how] = (before, losses, _state_of(new_ddp, new_optim))
        parallel_state.destroy_model_parallel()
    (a, losses_a, after_a), (b, losses_b, after_b) = results["tenplan"], results["megatron"]
    differ = sorted(k for k in b if k not in a or not torch.equal(a[k], b[k]))
    differ += sorted(f"after: {k}" for k in after_b if not torch.equal(after_a[k], after_b[k]))
    moments = sum(v.abs().sum().item() for k, v in a.items() if k.endswith(".exp_avg"))
    return {"differ": differ, "tensors": len(b), "moments": moments, "losses": (losses_a, losses_b), "moved": report["tensors"]}


def test_live_reshard_moves_the_distributed_optimizers_state_as_megatrons_load(tmp_path):
    (tmp_path / "ckpt").mkdir()
    results = run(_move_with_optimizer, WORLD, str(tmp_path / "ckpt"), timeout_s=120, join_s=400)
    for rank in range(WORLD):
        status, value = results[rank]
        assert status == "ok", value
        # Weights, main parameters, moments and steps bit-identical to
        # Megatron's own load of a checkpoint of the old job; the moments
        # are the old job's (not a fresh optimizer's zeros); training goes
        # on with the same losses.
        assert value["differ"] == [] and value["tensors"] > 9, value
        assert value["moments"] > 0, value
        ours, megatrons = value["losses"]
        assert len(ours) == 2 and ours == megatrons, value
        # The model's 9 stacked tensors and 3 optimizer tensors per parameter.
        assert value["moved"] == 36, value


def _move_optimizer_as_it_lies(rank, world, directory):
    import tenplan.megatron
    from megatron.core import dist_checkpointing, parallel_state

    mk = _harness()
    mk.cpu_only_optimizer_patches()
    ddp, optim = mk.with_optimizer(mk.build(2, 1))
    mk.train_steps(ddp, optim, 0, 2)
    msd = ddp.module.sharded_state_dict()
    dist_checkpointing.save(
        {"model": msd, "optimizer": optim.sharded_state_dict(msd, metadata=mk.FULLY_RESHARDABLE)}, directory
    )
    old = ddp.module.sharded_state_dict()
    parallel_state.destroy_model_parallel()
    # tenplan: the old job's data-parallel shards straight into the new
    # job's optimizer, nothing gathered.
    new_ddp, new_optim = mk.with_optimizer(mk.build(1, 1))
    report = tenplan.megatron.reshard(old, new_ddp.module.sharded_state_dict(), optimizers=(optim, new_optim))
    ours = _state_of(new_ddp, new_optim)
    losses = mk.train_steps(new_ddp, new_optim, 2, 2)
    after = _state_of(new_ddp, new_optim)
    parallel_state.destroy_model_parallel()
    # Megatron: load of the fully_reshardable checkpoint.
    ref_ddp, ref_optim, target = _new_job(mk)
    loaded = dist_checkpointing.load(target, directory)
    ref_ddp.module.load_state_dict(loaded["model"])
    ref_optim.load_state_dict(loaded["optimizer"])
    theirs = _state_of(ref_ddp, ref_optim)
    ref_losses = mk.train_steps(ref_ddp, ref_optim, 2, 2)
    ref_after = _state_of(ref_ddp, ref_optim)
    parallel_state.destroy_model_parallel()
    differ = sorted(k for k in theirs if k not in ours or not torch.equal(ours[k], theirs[k]))
    differ += sorted(f"after: {k}" for k in ref_after if not torch.equal(after[k], ref_after[k]))
    moments = sum(v.abs().sum().item() for k, v in ours.items() if k.endswith(".exp_avg"))
    return {"differ": differ, "tensors": len(theirs), "moments": moments, "losses": (losses, ref_losses), "moved": report["tensors"]}


def test_live_reshard_moves_the_optimizers_shards_as_they_lie(tmp_path):
    (tmp_path / "ckpt").mkdir()
    results = run(_move_optimizer_as_it_lies, WORLD, str(tmp_path / "ckpt"), timeout_s=120, join_s=400)
    for rank in range(WORLD):
        status, value = results[rank]
        assert status == "ok", value
        assert value["differ"] == [] and value["tensors"] > 9 and value["moments"] > 0, value
        ours, megatrons = value["losses"]
        assert len(ours) == 2 and ours == megatrons, value
        assert value["moved"] == 36, value


def test_a_flat_range_is_a_few_contiguous_boxes_covering_it_exactly():
    import random

    from tenplan.megatron import flat_boxes

    rng = random.Random(5)
    for _ in range(300):
        shape = [rng.randint(1, 5) for _ in range(rng.randint(1, 4))]
        n = 1
        for d in shape:
            n *= d
        start = rng.randint(0, n)
        stop = rng.randint(start, n)
        index = torch.arange(n).view(shape)
        covered = []
        boxes = flat_boxes(shape, start, stop)
        assert len(boxes) <= 2 * len(shape) - 1 or start == stop
        for box, first in boxes:
            block = index[tuple(slice(a, b) for a, b in box)].reshape(-1)
            # Contiguous in memory, starting where it says.
            assert block.tolist() == list(range(first, first + block.numel())), (shape, start, stop, box)
            covered += block.tolist()
        assert covered == list(range(start, stop)), (shape, start, stop)
