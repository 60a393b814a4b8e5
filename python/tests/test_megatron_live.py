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


def _move(rank, world, directory, target, source_config=(2, 2, 1), size="dense"):
    import tenplan.megatron
    from megatron.core import dist_checkpointing, parallel_state

    mk = _harness()
    tp, pp, ep = (*target, 1)[:3]
    size = mk.SIZES[size]
    source = mk.build(*source_config[:2], size, source_config[2])
    # Megatron's own path: save under the old configuration...
    t0 = time.perf_counter()
    dist_checkpointing.save(mk.model_sharded_state(source, size), directory)
    saved = time.perf_counter() - t0
    old = mk.model_sharded_state(source, size)
    parallel_state.destroy_model_parallel()
    # ... and tenplan's: straight into the new configuration's model.
    moved = _garbled(mk.build(tp, pp, size, ep))
    t0 = time.perf_counter()
    report = tenplan.megatron.reshard(old, mk.model_sharded_state(moved, size))
    ours = time.perf_counter() - t0
    parallel_state.destroy_model_parallel()
    loaded = _garbled(mk.build(tp, pp, size, ep))
    t0 = time.perf_counter()
    loaded.load_state_dict(dist_checkpointing.load(mk.model_sharded_state(loaded, size), directory))
    load = time.perf_counter() - t0
    a, b = moved.state_dict(), loaded.state_dict()
    differ = sorted(k for k, v in b.items() if isinstance(v, torch.Tensor) and not torch.equal(a[k], v))
    result = {
        "tensors": report["tensors"],
        "differ": differ,
        "lower_bound_s": report.get("lower_bound_s"),
        "seconds": {"tenplan": ours, "save": saved, "load": load},
    }
    if (tp, pp, ep) == (1, 1, 1):
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


def test_live_reshard_of_a_moe_whose_layers_differ_equals_megatrons(tmp_path):
    """A Qwen3-MoE-shaped model, layer 0 dense and layer 1 four experts
    (its block saved layer by layer), from pp=2,ep=2 to tp=2,ep=2 and to
    one model replica per rank."""
    for target in [(2, 1, 2), (1, 1, 1)]:
        ckpt = tmp_path / f"ckpt-{len(list(tmp_path.iterdir()))}"
        ckpt.mkdir()
        results = run(_move, WORLD, str(ckpt), target, (1, 2, 2), "hetero", timeout_s=120, join_s=300)
        for rank in range(WORLD):
            status, value = results[rank]
            assert status == "ok", value
            assert value["differ"] == [], value
            if "losses" in value:
                ours, megatrons = value["losses"]
                assert ours == megatrons, value
    import tenplan

    checked = tenplan.check(ckpt)
    assert (checked["tp"], checked["pp"], checked["ep"]) == (1, 2, 2), checked


def test_live_reshard_of_a_deepseek_v3_with_its_mtp_module_equals_megatrons(tmp_path):
    """DeepSeek-V3's shape with a multi-token-prediction module
    (`mtp.layers.0` on the last pipeline stage, beside a copy of the
    embedding there), from pp=2 to tp=2: the module and the embedding
    arrive as Megatron's own save + load puts them."""
    (tmp_path / "ckpt").mkdir()
    results = run(_move, WORLD, str(tmp_path / "ckpt"), (2, 1), (1, 2, 1), "mla-mtp", timeout_s=120, join_s=300)
    for rank in range(WORLD):
        status, value = results[rank]
        assert status == "ok", value
        assert value["differ"] == [], value
        # Megatron's tensors of the model, the module's among them.
        assert value["tensors"] > 40, value


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


def _old_job(mk, directory, describe, dtype=torch.float32):
    """The old job: tp=2, dp=2, Megatron's distributed optimizer, two Adam
    steps; saved fully_reshardable into `directory` (Megatron's path).
    Returns its optimizer and `describe(ddp, optim)`, taken while its
    parallel configuration is current."""
    from megatron.core import dist_checkpointing, parallel_state

    mk.cpu_only_optimizer_patches()
    ddp, optim = mk.with_optimizer(mk.build(2, 1, dtype=dtype))
    mk.train_steps(ddp, optim, 0, 2)
    dist_checkpointing.save(mk.job_sharded_state(ddp, optim), directory)
    old = describe(ddp, optim)
    parallel_state.destroy_model_parallel()
    return optim, old


def _new_job(mk, fill, dtype=torch.float32):
    """The new configuration's job (tp=1 over the 4 ranks: dp=4) given its
    state by `fill(ddp, optim)`, then two more steps: (its state, the
    losses, its state after them)."""
    from megatron.core import parallel_state

    ddp, optim = mk.with_optimizer(mk.build(1, 1, dtype=dtype))
    fill(ddp, optim)
    state = mk.job_state(ddp, optim)
    losses = mk.train_steps(ddp, optim, 2, 2)
    after = mk.job_state(ddp, optim)
    parallel_state.destroy_model_parallel()
    return state, losses, after


def _loading(mk, load):
    """A `fill` that loads as Megatron-LM does: `load(target)` gives the
    state dict of the job's fully_reshardable target."""

    def fill(ddp, optim):
        mk.make_optimizer_state(optim)
        loaded = load(mk.job_sharded_state(ddp, optim, is_loading=True))
        ddp.module.load_state_dict(loaded["model"])
        optim.load_state_dict(loaded["optimizer"])

    return fill


def _against_megatrons(ours, theirs, moved):
    (a, losses_a, after_a), (b, losses_b, after_b) = ours, theirs
    differ = sorted(k for k in b if k not in a or not torch.equal(a[k], b[k]))
    differ += sorted(f"after: {k}" for k in after_b if not torch.equal(after_a[k], after_b[k]))
    moments = sum(v.abs().sum().item() for k, v in a.items() if k.endswith(".exp_avg"))
    return {"differ": differ, "tensors": len(b), "moments": moments, "losses": (losses_a, losses_b), "moved": moved}


def _assert_like_megatrons_load(results):
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


def _move_with_optimizer(rank, world, directory):
    import tenplan.megatron
    from megatron.core import dist_checkpointing

    mk = _harness()
    _, old = _old_job(mk, directory, mk.job_sharded_state)
    report = {}

    def by_tenplan(target):
        state, report["plan"] = tenplan.megatron.load(old, target)
        return state

    ours = _new_job(mk, _loading(mk, by_tenplan))
    theirs = _new_job(mk, _loading(mk, lambda target: dist_checkpointing.load(target, directory)))
    return _against_megatrons(ours, theirs, report["plan"]["tensors"])


def test_live_reshard_moves_the_distributed_optimizers_state_as_megatrons_load(tmp_path):
    (tmp_path / "ckpt").mkdir()
    _assert_like_megatrons_load(run(_move_with_optimizer, WORLD, str(tmp_path / "ckpt"), timeout_s=120, join_s=400))


def _move_optimizer_as_it_lies(rank, world, directory, dtype_name="float32"):
    import tenplan.megatron
    from megatron.core import dist_checkpointing

    mk = _harness()
    dtype = getattr(torch, dtype_name)
    optim, old = _old_job(mk, directory, lambda ddp, _: ddp.module.sharded_state_dict(), dtype)
    report = {}

    def by_tenplan(new_ddp, new_optim):
        # The old job's data-parallel shards straight into the new job's
        # optimizer, nothing gathered.
        report["plan"] = tenplan.megatron.reshard(
            old, new_ddp.module.sharded_state_dict(), optimizers=(optim, new_optim)
        )

    ours = _new_job(mk, by_tenplan, dtype)
    theirs = _new_job(mk, _loading(mk, lambda target: dist_checkpointing.load(target, directory)), dtype)
    return _against_megatrons(ours, theirs, report["plan"]["tensors"])


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_live_reshard_moves_the_optimizers_shards_as_they_lie(tmp_path, dtype_name):
    """fp32 models, and bf16 ones whose optimizer keeps fp32 main
    parameters (Megatron-LM's --bf16): the main copies move as they lie
    too, each its own tensor beside the bf16 weight."""
    (tmp_path / "ckpt").mkdir()
    _assert_like_megatrons_load(
        run(_move_optimizer_as_it_lies, WORLD, str(tmp_path / "ckpt"), dtype_name, timeout_s=120, join_s=400)
    )


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
