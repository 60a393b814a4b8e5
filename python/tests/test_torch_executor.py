"""The torch.distributed executor on gloo: 4 processes on loopback perform
verified plans on real torch tensors, byte for byte."""

import datetime
import os

import pytest

torch = pytest.importorskip("torch")

import tenplan  # noqa: E402
from _dist import run  # noqa: E402

WORLD = 4


def global_tensors(layout, seed):
    g = torch.Generator().manual_seed(seed)
    from tenplan.torch import DTYPES

    return {
        t["name"]: torch.randn(t["shape"], generator=g, dtype=torch.float64).to(DTYPES[t["dtype"]])
        for t in layout.tensors()
    }


def materialize(layout, device, globals_):
    """The buffers a device holds in a layout, filled from the global tensors."""
    from tenplan.torch import DTYPES

    shard = layout.shard(device)
    names = [t["name"] for t in layout.tensors()]
    out = {}
    for b in shard["buffers"] if shard else []:
        buf = torch.zeros(b["len"], dtype=DTYPES[b["dtype"]])
        for p in b["pieces"]:
            part = globals_[names[p["tensor"]]][tuple(slice(lo, hi) for lo, hi in p["box"])]
            buf[p["offset"] : p["offset"] + part.numel()] = part.reshape(-1)
        out[b["name"]] = buf
    return out


def _alone_from(min_bytes):
    """Messages of at least ``min_bytes`` travel alone (0: every one that
    saves a copy; None: the default, which these tiny tensors never reach)."""
    import tenplan.torch

    tenplan.torch._ALONE_MIN_BYTES = min_bytes


def _model_reshard(rank, world, model, src, dst, cluster, planner, alone=None):
    from tenplan.torch import execute

    _alone_from(alone)

    m = tenplan.Model(model)
    problem = tenplan.Problem(m.layout(src), m.layout(dst), tenplan.Cluster(cluster))
    plan = tenplan.plan(problem, planner)
    g = global_tensors(problem.source, 7)
    got = execute(plan, materialize(problem.source, rank, g))
    want = materialize(problem.target, rank, g)
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k].reshape(-1), want[k]), k
    has_fanout = any(c.get("fanout") for c in plan.copies())
    has_relay = any(c.get("via") for c in plan.copies())
    steps = tenplan.program(plan, rank, alone)["steps"]
    alone_transfers = sum(t["alone"] for s in steps for t in s["sends"] + s["recvs"])
    return {"copies": len(plan), "fanout": has_fanout, "relay": has_relay, "alone": alone_transfers}


def ok(results):
    assert all(s == "ok" for s, _ in results), results
    return [v for _, v in results]


@pytest.mark.parametrize("planner", ["lp", "tenplex", "hotspa"])
def test_training_state_changes_parallelism(planner):
    # tp=2,dp=2 -> tp=1,dp=4 of the whole training state (bf16 weights,
    # fp32 master weights and Adam moments).
    ok(run(_model_reshard, WORLD, "gpt-tiny", "tp=2,dp=2", "dp=4", "1x4", planner))


def test_zero1_flat_buffers_to_tensor_parallel():
    ok(run(_model_reshard, WORLD, "llama-tiny", "tp=2,dp=2,zero=1", "tp=4", "1x4", "lp"))


@pytest.mark.parametrize("alone", [None, 0])
def test_multicast_across_nodes(alone):
    # Weights on node 0 wanted whole by both devices of node 1: lp sends
    # each box across the network once and forwards it on the node.
    out = ok(run(_model_reshard, WORLD, "gpt-tiny", "tp=2,devices=0-1", "dp=2,devices=2-3", "2x2", "lp", alone))
    assert out[0]["fanout"], "the plan multicasts"
    assert bool(any(o["alone"] for o in out)) == (alone == 0), out


def test_messages_alone_between_placements():
    # Boxes that lie whole in a source piece are sent without packing, and
    # those that land whole in a target piece are received in place.
    out = ok(run(_model_reshard, WORLD, "gpt-tiny", "tp=2,dp=2", "tp=4", "1x4", "lp", 0))
    assert all(o["alone"] for o in out), out


def _dtensor(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from tenplan.torch import layout_from_state_dict, reshard

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(3)
    full = {"a": torch.randn(10, 6, generator=g), "b": torch.randn(7, generator=g).to(torch.bfloat16)}
    # Uneven Shard(0) (torch.chunk: 3, 3, 3, 1) and a replicated tensor ...
    src = {"a": distribute_tensor(full["a"], mesh, [Shard(0)]), "b": distribute_tensor(full["b"], mesh, [Replicate()])}
    # ... to Shard(1) and Shard(0).
    dst = {"a": distribute_tensor(full["a"], mesh, [Shard(1)]), "b": distribute_tensor(full["b"], mesh, [Shard(0)])}
    target = layout_from_state_dict(dst)
    got = reshard(src, target)
    for k in dst:
        want = dst[k].to_local()
        if want.numel() == 0:
            # torch.chunk leaves the last rank no columns: it holds nothing.
            assert k not in got, k
        else:
            assert torch.equal(got[k], want), k
    return True


def test_dtensor_state_dict_between_placements():
    ok(run(_dtensor, WORLD))


def _dtensor_2d(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from tenplan.torch import layout_from_state_dict, reshard

    # A 2 x 2 mesh (data parallel x tensor parallel), as FSDP2 + TP make.
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    g = torch.Generator().manual_seed(5)
    full = {
        "a": torch.randn(10, 7, generator=g),
        "b": torch.randn(9, generator=g).to(torch.bfloat16),
        "c": torch.randn(11, 4, generator=g),
    }
    src_pl = {
        "a": [Shard(0), Shard(1)],  # both mesh dimensions, uneven on each
        "b": [Replicate(), Shard(0)],
        "c": [Shard(0), Shard(0)],  # one tensor dimension split twice
    }
    dst_pl = {
        "a": [Replicate(), Shard(0)],
        "b": [Shard(0), Replicate()],
        "c": [Shard(1), Shard(0)],
    }
    src = {k: distribute_tensor(v, mesh, src_pl[k]) for k, v in full.items()}
    dst = {k: distribute_tensor(v, mesh, dst_pl[k]) for k, v in full.items()}
    got = reshard(src, layout_from_state_dict(dst))
    for k in dst:
        want = dst[k].to_local()
        if want.numel() == 0:
            assert k not in got, k
        else:
            assert torch.equal(got[k], want), (k, rank)
    return True


def test_dtensor_state_dict_on_a_2d_mesh():
    ok(run(_dtensor_2d, WORLD))


def _random_placements(rank, world, mesh_shape, seed):
    import itertools
    import random

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    from tenplan.torch import layout_from_state_dict, reshard

    mesh = init_device_mesh("cpu", mesh_shape)
    me = mesh.get_coordinate()
    rng = random.Random(seed)  # the same cases on every rank
    g = torch.Generator().manual_seed(seed)
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.uint8]

    def placements(ndim):
        return [Shard(rng.randrange(ndim)) if ndim and rng.random() < 0.7 else Replicate() for _ in mesh_shape]

    def integers(shape, lo, hi, dtype):
        # Small integers: every sum of addends is exact in every dtype.
        return torch.randint(lo, hi, shape, generator=g).to(dtype)

    full, src, src_pl, dst_pl = {}, {}, {}, {}
    for i in range(48):
        # Dimensions of 1 to 9 over meshes of 2 and 4: uneven shards, and
        # ranks that hold nothing of a tensor.
        shape = [rng.randint(1, 9) for _ in range(rng.choice([0, 1, 1, 2, 2, 3]))]
        dtype = rng.choice(dtypes)
        k = f"t{i}"
        full[k] = integers(shape, 0, 20, dtype)
        src_pl[k], dst_pl[k] = placements(len(shape)), placements(len(shape))
        summed = [d for d in range(len(mesh_shape)) if rng.random() < 0.25]
        if not summed:
            src[k] = distribute_tensor(full[k], mesh, src_pl[k])
            continue
        # Partial sums on some mesh dimensions: one addend per coordinate
        # there (the last makes up the rest), copies of it along the others.
        for d in summed:
            src_pl[k][d] = Partial()
        coords = list(itertools.product(*(range(mesh_shape[d]) for d in summed)))
        addends = [integers(shape, -10, 10, dtype) for _ in coords[1:]]
        addends.insert(0, full[k] - sum(addends, torch.zeros_like(full[k])))
        mine = addends[coords.index(tuple(me[d] for d in summed))]
        local_shape, offset = compute_local_shape_and_global_offset(mine.shape, mesh, src_pl[k])
        local = mine[tuple(slice(o, o + n) for o, n in zip(offset, local_shape))].contiguous()
        src[k] = DTensor.from_local(local, mesh, src_pl[k], run_check=False, shape=mine.shape, stride=mine.stride())
    dst = {k: distribute_tensor(v, mesh, dst_pl[k]) for k, v in full.items()}
    # DTensor's own placement of each tensor is the oracle, both ways in:
    # a target layout, and `out` buffers written in place. These hold
    # stale values (a previous step's gradients), which sums must not keep.
    got = reshard(src, layout_from_state_dict(dst))
    out = {k: distribute_tensor(torch.full_like(v, 3), mesh, dst_pl[k]) for k, v in full.items()}
    written = reshard(src, out=out)
    cases = []
    for k in full:
        want = dst[k].to_local()
        what = (k, list(full[k].shape), full[k].dtype, src_pl[k], dst_pl[k], rank)
        assert torch.equal(written[k].to_local(), want), what
        if want.dim() == 0:
            assert torch.equal(got[k], want), what
        elif want.numel() == 0:
            assert k not in got, what
        else:
            assert torch.equal(got[k], want), what
        cases.append(str(what[:5]))
    return cases


def _between_disjoint_meshes(rank, world, seed):
    import random

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    from tenplan.torch import layout_from_state_dict, reshard

    # A trainer on ranks 0-1 and an engine on ranks 2-3 of one group, each
    # with DTensors on a mesh of its own: every rank outside a tensor's
    # mesh holds none of it.
    trainer, engine = DeviceMesh("cpu", [0, 1]), DeviceMesh("cpu", [2, 3])
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    full, src, dst_pl = {}, {}, {}
    for i in range(24):
        shape = [rng.randint(1, 9) for _ in range(rng.choice([0, 1, 2, 2, 3]))]
        dtype = rng.choice([torch.float32, torch.bfloat16, torch.int64])
        k = f"t{i}"
        full[k] = torch.randint(0, 20, shape, generator=g).to(dtype)
        pl = [Shard(rng.randrange(len(shape))) if shape and rng.random() < 0.7 else Replicate()]
        dst_pl[k] = [Shard(rng.randrange(len(shape))) if shape and rng.random() < 0.7 else Replicate()]
        if shape and rng.random() < 0.25:
            # Gradients as two addends, one per trainer rank (not 0-d ones:
            # from_local takes an empty global shape for none given).
            other = torch.randint(-10, 10, shape, generator=g).to(dtype)
            mine = [full[k] - other, other][rank] if rank < 2 else torch.zeros(0, dtype=dtype)
            src[k] = DTensor.from_local(mine, trainer, [Partial()], run_check=False, shape=full[k].shape, stride=full[k].stride())
        else:
            src[k] = distribute_tensor(full[k], trainer, pl)
    dst = {k: distribute_tensor(torch.zeros_like(v), engine, dst_pl[k]) for k, v in full.items()}
    got = reshard(src, layout_from_state_dict(dst))
    written = reshard(src, out=dst)
    for k in full:
        want = distribute_tensor(full[k], engine, dst_pl[k]).to_local()
        assert torch.equal(written[k].to_local(), want), (k, rank)
        if rank < 2 or want.numel() == 0:
            assert k not in got, (k, rank)
        else:
            assert torch.equal(got[k].reshape(want.shape), want), (k, rank)
    return sum(isinstance(p, Partial) for v in src.values() for p in v.placements)


def test_dtensors_move_between_disjoint_meshes_of_one_group():
    out = ok(run(_between_disjoint_meshes, WORLD, 5))
    assert all(n >= 3 for n in out), out


@pytest.mark.parametrize("mesh_shape", [(4,), (2, 2)])
def test_random_placements_land_where_dtensor_puts_them(mesh_shape):
    out = ok(run(_random_placements, WORLD, mesh_shape, 7 + len(mesh_shape)))
    # Every rank checked the same cases, and they were not all alike.
    assert len({tuple(o) for o in out}) == 1, out
    assert len(set(out[0])) == len(out[0]), out[0]
    assert sum("Partial" in c for c in out[0]) >= 8, out[0]


def _partial_refusals(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Shard

    from tenplan.torch import layout_from_state_dict, reshard

    mesh = init_device_mesh("cpu", (world,))
    summed = {"g": DTensor.from_local(torch.ones(4), mesh, [Partial()])}
    averaged = {"g": DTensor.from_local(torch.ones(4), mesh, [Partial("avg")])}
    sharded = {"g": DTensor.from_local(torch.ones(1), mesh, [Shard(0)])}
    messages = []
    for source, target in ((averaged, sharded), (sharded, summed)):
        try:
            reshard(source, layout_from_state_dict(target))
            messages.append("no error")
        except tenplan.TenplanError as e:
            messages.append(str(e))
    return messages


def test_partial_sums_other_than_sums_and_partial_targets_are_refused():
    for averaged, into_partial in ok(run(_partial_refusals, WORLD)):
        assert "tensor `g`: Partial('avg') placements are not supported, only sums" in averaged, averaged
        assert "partial sums" in into_partial and "`g`" in into_partial, into_partial


def _tied_sums(rank, world, tied):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor

    from tenplan.torch import reshard

    # One gradient under two names (tied weights), as partial sums: into
    # one `out` buffer, each name's sum would be added into it.
    mesh = init_device_mesh("cpu", (world,))
    addend = torch.arange(8.0) + rank
    src = {n: DTensor.from_local(addend.clone(), mesh, [Partial()], run_check=False, shape=(8,), stride=(1,)) for n in ("head", "embed")}
    out = {n: distribute_tensor(torch.full((8,), 5.0), mesh, [Shard(0)]) for n in ("head", "embed")}
    if tied:
        out["head"] = out["embed"]
    got = reshard(src, out=out)
    want = src["head"].redistribute(mesh, [Shard(0)]).to_local()
    return all(torch.equal(got[n].to_local(), want) for n in src)


def test_tied_out_buffers_of_partial_sums_are_refused():
    for s, v in run(_tied_sums, WORLD, True):
        assert s == "error" and "tensors `embed` and `head`: their `out` buffers share memory and both are a sum" in v, v
    assert all(ok(run(_tied_sums, WORLD, False)))


def _dp4_problem():
    """gpt-tiny from tp=2,dp=2 to dp=4 on one node, and its plan."""
    m = tenplan.Model("gpt-tiny")
    problem = tenplan.Problem(m.layout("tp=2,dp=2"), m.layout("dp=4"), tenplan.Cluster("1x4"))
    return problem, tenplan.plan(problem, "lp")


def _dp4_plan_and_source(rank):
    """The dp=4 plan (:func:`_dp4_problem`) and this rank's source buffers."""
    problem, plan = _dp4_problem()
    return plan, materialize(problem.source, rank, global_tensors(problem.source, 1))


def _mismatch(rank, world):
    from tenplan.torch import execute

    plan, source = _dp4_plan_and_source(rank)
    if rank == 2:
        name = sorted(source)[0]
        source[name] = source[name].to(torch.float16 if source[name].dtype != torch.float16 else torch.float32)
    execute(plan, source)


def test_a_mismatched_tensor_fails_every_rank_with_one_message():
    results = run(_mismatch, WORLD)
    assert all(s == "error" for s, _ in results), results
    first = [v.splitlines()[0] for _, v in results]
    assert len(set(first)) == 1 and "ExecutionError: rank 2: tensor `" in first[0], first


def _dead_peer(rank, world):
    from tenplan.torch import execute

    plan, source = _dp4_plan_and_source(rank)
    if rank == 3:
        os._exit(1)  # dies before taking part
    execute(plan, source, timeout=datetime.timedelta(seconds=10))


def test_a_dead_peer_is_an_error_on_every_other_rank_within_the_timeout():
    import time

    start = time.time()
    results = run(_dead_peer, WORLD, timeout_s=20)
    took = time.time() - start
    assert results[3][0] == "died"
    for s, v in results[:3]:
        assert s == "error" and "ExecutionError" in v and "peer died or timed out" in v, v
    assert took < 60, took


def _weight_sync(rank, world, planner, alone=None):
    from tenplan.torch import execute

    _alone_from(alone)

    # A tiny MoE trainer (tp=2, dp=2) on node 0 to two tp=2 engines on
    # node 1, planned through tenplan.sync as an RL loop would each step.
    # Broadcast trees and chains: the engines on nodes of their own (2 and
    # 3), so that weights pass from one to the other across the network.
    cluster = tenplan.Cluster("4x2" if planner in ("trees", "broadcast") else "2x4")
    s = tenplan.sync(tenplan.Model("mixtral-tiny"), "tp=2,dp=2", "tp=2,dp=2,devices=4-7", cluster, planner=planner)
    plan = s["plan"]
    problem = plan.problem
    if planner == "trees":
        across = [c for c in plan.copies() if any(f["dst"] // 2 != c["dst"] // 2 for f in c.get("fanout", []))]
        assert across, "no tree spans two nodes"
    if planner == "broadcast":
        kept = [c for c in plan.copies() if any(f.get("in_passing") for f in c.get("fanout", []))]
        assert kept, "no engine keeps a box as it relays it"
    g = global_tensors(problem.source, 11)
    got = execute(plan, materialize(problem.source, rank, g))
    want = materialize(problem.target, rank, g)
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k].reshape(-1), want[k]), k
    return sorted(want)


@pytest.mark.parametrize("planner,alone", [("lp", None), ("static-p2p", None), ("trees", None), ("broadcast", None), ("broadcast", 0)])
def test_weight_sync_from_trainer_to_engines(planner, alone):
    out = ok(run(_weight_sync, 8, planner, alone))
    assert not any(out[:4]), "the trainer's devices receive nothing"
    # Each engine rank gets its fused [q; k; v] and its experts.
    assert all(any("linear_qkv" in n for n in names) for names in out[4:]), out[4:]
    assert all(any("experts" in n for n in names) for names in out[4:]), out[4:]


def _prepared_every_step(rank, world):
    from tenplan.torch import prepare

    # Plan and check once, then sync at every "step" into the engine's own
    # buffers, as an RL loop does; the trainer updates its weights in place.
    s = tenplan.sync(tenplan.Model("mixtral-tiny"), "tp=2,dp=2", "tp=2,dp=2,devices=4-7", tenplan.Cluster("2x4"))
    problem = s["plan"].problem
    g = global_tensors(problem.source, 17)
    source = materialize(problem.source, rank, g)
    # Zeros where the layout has padding (bytes no piece covers, which the
    # plan leaves as they are); every covered byte changes at each step.
    out = {k: torch.zeros_like(v) for k, v in materialize(problem.target, rank, g).items()}
    run_sync = prepare(s["plan"], source, out=out)
    for step in range(3):
        got = run_sync()
        want = materialize(problem.target, rank, g)
        assert set(got) == set(want)
        for k in want:
            assert got[k].data_ptr() == out[k].data_ptr(), "written into the given buffers"
            assert torch.equal(got[k].reshape(-1), want[k]), (step, k)
        # The optimizer step: every weight changes in place.
        for k in g:
            g[k].mul_(0.5).add_(step + 1)
        for k, v in materialize(problem.source, rank, g).items():
            source[k].copy_(v)
    return len(out)


def test_a_prepared_plan_syncs_every_step_into_given_buffers():
    out = ok(run(_prepared_every_step, 8))
    assert not any(out[:4]) and all(out[4:]), out


def _prepared_wrong_out(rank, world):
    from tenplan.torch import prepare

    problem, plan = _dp4_problem()
    g = global_tensors(problem.source, 3)
    out = materialize(problem.target, rank, g)
    if rank == 2:
        name = next(iter(out))
        out[name] = out[name][:-1]
    prepare(plan, materialize(problem.source, rank, g), out=out)


def _tied_out(rank, world):
    from tenplan.torch import prepare

    # Two tensors of one shape tied (one parameter under two names): equal
    # in the source, one buffer in the target, which is allowed.
    problem, plan = _dp4_problem()
    g = global_tensors(problem.source, 3)
    a, b = "decoder.layers.0.mlp.linear_fc1.weight", "decoder.layers.1.mlp.linear_fc1.weight"
    g[b] = g[a].clone()
    want = materialize(problem.target, rank, g)
    out = {k: torch.zeros_like(v) for k, v in want.items()}
    out[b] = out[a]
    got = prepare(plan, materialize(problem.source, rank, g), out=out)()
    assert got[a].data_ptr() == got[b].data_ptr()
    for k in want:
        assert torch.equal(got[k].reshape(-1), want[k]), k


def _out_inside_the_source(rank, world):
    from tenplan.torch import prepare

    # A reshard "in place": a target buffer given is the source's own
    # memory (inside its largest buffer), which the copies would read
    # after overwriting it.
    problem, plan = _dp4_problem()
    g = global_tensors(problem.source, 3)
    source = materialize(problem.source, rank, g)
    out = {k: torch.zeros_like(v) for k, v in materialize(problem.target, rank, g).items()}
    if rank == 1:
        name = next(iter(out))
        out[name] = max(source.values(), key=lambda t: t.numel())[: out[name].numel()]
    prepare(plan, source, out=out)


def test_tied_weights_may_share_one_out_buffer():
    ok(run(_tied_out, WORLD))


def test_a_prepared_plan_refuses_out_buffers_inside_the_source():
    results = run(_out_inside_the_source, WORLD)
    for s, v in results:
        assert s == "error" and "rank 1" in v and "shares memory with the source buffer of `" in v, v


def test_a_prepared_plan_refuses_a_mismatched_out_buffer_on_every_rank():
    results = run(_prepared_wrong_out, WORLD)
    for s, v in results:
        assert s == "error" and "rank 2" in v and "`out` gives" in v, v


def _fp32_master_to_bf16_engines(rank, world, convert):
    from tenplan.torch import prepare

    # The trainer holds fp32 weights; the engines serve bf16. tenplan.sync
    # plans the bf16 sync and each trainer rank converts before sending.
    s = tenplan.sync(tenplan.Model("mixtral-tiny"), "tp=2,dp=2", "tp=2,dp=2,devices=4-7", tenplan.Cluster("2x4"), dtype="bf16", trainer_dtype="f32")
    assert s["conversion"] == {"from": "f32", "to": "bf16", "lossy": True}
    problem = s["plan"].problem
    g = global_tensors(problem.source, 19)
    fp32 = {k: v.to(torch.float64).add_(1e-3).to(torch.float32) for k, v in g.items()}  # not bf16-exact
    bf16 = {k: v.to(torch.bfloat16) for k, v in fp32.items()}  # torch's own rounding
    source = materialize_f32(problem.source, rank, fp32)
    got = prepare(s["plan"], source, convert=convert)()
    want = materialize(problem.target, rank, bf16)
    for k in want:
        assert torch.equal(got[k].reshape(-1), want[k]), k
    return len(want)


def materialize_f32(layout, device, globals_):
    """The buffers of `layout` (bf16 buffers) filled with fp32 values, as a
    trainer holding fp32 weights in the same layout would."""
    shard = layout.shard(device)
    names = [t["name"] for t in layout.tensors()]
    out = {}
    for b in shard["buffers"] if shard else []:
        buf = torch.zeros(b["len"], dtype=torch.float32)
        for p in b["pieces"]:
            part = globals_[names[p["tensor"]]][tuple(slice(lo, hi) for lo, hi in p["box"])]
            buf[p["offset"] : p["offset"] + part.numel()] = part.reshape(-1)
        out[b["name"]] = buf
    return out


def test_fp32_master_weights_reach_bf16_engines_as_torch_rounds_them():
    out = ok(run(_fp32_master_to_bf16_engines, 8, True))
    assert not any(out[:4]) and all(out[4:]), out


def test_an_unasked_narrowing_is_refused_naming_the_tensor():
    results = run(_fp32_master_to_bf16_engines, 8, False)
    for s, v in results:
        assert s == "error" and "given torch.float32, the plan sends bf16 (pass convert=True" in v, v
        assert "tensor `" in v, v


def test_host_copies_move_what_torch_copies_and_stay_inside_their_tensors():
    # The CPU path of every pack, gather and write: views of torch tensors
    # compiled into memcpys, equal to torch's own copy_ of the same views.
    from tenplan import _tenplan

    src = torch.randn(64, 40, 3, generator=torch.Generator().manual_seed(1))
    dst = torch.zeros(64 * 40 * 3)
    memory = [(t, t.data_ptr(), t.numel() * t.element_size()) for t in (src, dst)]
    views = [(dst[:1200].view(20, 20, 3), src[10:30, 5:25]), (dst[1200:1264].view(64), src[:, 39, 1])]

    def spec(d, s):
        size = d.element_size()
        return (d.data_ptr(), s.data_ptr(), list(d.shape), [x * size for x in d.stride()], [x * size for x in s.stride()], size)

    for threads, streaming in ((1, None), (2, None), (1, 0)):
        dst.zero_()
        copies = _tenplan.HostCopies(memory, [spec(d, s) for d, s in views], threads, streaming)
        copies.run()
        assert len(copies) == 2 and copies.bytes == (1200 + 64) * 4
        for d, s in views:
            assert torch.equal(d, s)
        assert not dst[1264:].any()
    # A view of a tensor it was not given, or one that runs past its end.
    other = torch.zeros(10)
    with pytest.raises(tenplan.LayoutError, match="copy 0 of a strided set: its destination reaches outside"):
        _tenplan.HostCopies(memory, [spec(other, src[0, :10, 0])])
    with pytest.raises(tenplan.LayoutError, match="its source reaches outside"):
        _tenplan.HostCopies(memory, [(dst.data_ptr(), src.data_ptr(), [2, 4], [16, 4], [src.numel() * 4, 4], 4)])


def test_the_source_lookup_finds_addresses_inside_overlapping_views():
    # Which copies read the source (and join the one pass over it) is
    # asked by address; views of one storage overlap, and an address past
    # the end of a view that starts later must still count as the source.
    from tenplan.torch import _address_lookup

    flat = torch.zeros(100)
    base, size = flat.data_ptr(), flat.element_size()
    views = [flat, flat[10:20], flat[90:], flat[:0]]
    inside = _address_lookup([(v, v.data_ptr(), v.numel() * size) for v in views])
    assert inside(base) and inside(base + 50 * size) and inside(base + 99 * size)
    assert not inside(base - 1) and not inside(base + 100 * size)


def _stage_descriptions(rank, world, odd=None):
    """Two pipeline stages of two ranks each: stage s holds layer s's
    weight split by rows over its ranks; every rank holds the bias whole
    (``odd`` gives rank 3 another shape of it)."""
    stage, part = divmod(rank, 2)
    w = {"name": f"layer{stage}.w", "dtype": "f32", "shape": [6, 3], "box": [(3 * part, 3 * part + 3), (0, 3)]}
    b = {"name": "bias", "dtype": "f32", "shape": [odd if odd and rank == 3 else 3], "box": [(0, 3)]}
    return [w, b]


def _gathered_layouts(rank, world, odd, broadcasts):
    import tenplan.torch
    from tenplan.torch import _gathered

    tenplan.torch._HEADER_BROADCASTS = broadcasts

    everyone = [_stage_descriptions(r, world, odd) for r in range(world)]
    # Stages hold other tensors (headers gathered), and every rank the
    # same ones (none gathered); the second list is an empty target on
    # half of the ranks.
    lists = [_stage_descriptions(rank, world, odd), [everyone[0][1]] if rank < 2 else []]
    try:
        gathered = _gathered(lists, None)
        layouts = [tenplan.Layout.from_gathered(h, r) for h, r in gathered]
    except tenplan.LayoutError as e:
        return f"LayoutError: {e}"
    want = [tenplan.Layout.from_descriptions(everyone), tenplan.Layout.from_descriptions([[everyone[0][1]]] * 2 + [[]] * 2)]
    return [len(h) for h, _ in gathered] if layouts == want else "differs"


@pytest.mark.parametrize("broadcasts", [16, 0], ids=["broadcast", "gathered"])
def test_a_group_gathers_each_distinct_header_once(broadcasts):
    # Boxes travel as integers, names and shapes once per distinct header
    # (broadcast one by one, or gathered where there are many); the
    # layouts are those of every rank's dicts.
    assert ok(run(_gathered_layouts, WORLD, None, broadcasts)) == [[2, 2]] * WORLD
    # A rank that disagrees on a tensor's shape is named on every rank.
    for value in ok(run(_gathered_layouts, WORLD, 4, broadcasts)):
        assert value == "LayoutError: tensor `bias`: rank 3 has shape [4] f32, another rank [3] f32", value


def _in_a_subgroup(rank, world, grouped):
    import torch.distributed as dist

    import tenplan.torch
    from tenplan.torch import execute, prepare

    tenplan.torch._GROUPED_P2P = grouped

    # Two jobs side by side in one world: ranks {0, 2} and {1, 3}, each a
    # group of its own whose ranks are not the world's; a plan's devices
    # are the group's ranks, and its sends must reach them.
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    group = groups[rank % 2]
    me = dist.get_rank(group)
    m = tenplan.Model("gpt-tiny")
    problem = tenplan.Problem(m.layout("tp=2"), m.layout("dp=2"), tenplan.Cluster("1x2"))
    plan = tenplan.plan(problem, "lp")
    g = global_tensors(problem.source, 5 + rank % 2)
    want = materialize(problem.target, me, g)
    timeout = datetime.timedelta(seconds=20)
    got = execute(plan, materialize(problem.source, me, g), group=group, timeout=timeout)
    again = prepare(plan, materialize(problem.source, me, g), group=group, timeout=timeout)()
    for k in want:
        assert torch.equal(got[k].reshape(-1), want[k]), k
        assert torch.equal(again[k].reshape(-1), want[k]), k
    return me


@pytest.mark.parametrize("grouped", [False, True], ids=["gloo", "batched-as-nccl"])
def test_a_plan_runs_in_a_group_whose_ranks_are_not_the_worlds(grouped):
    assert ok(run(_in_a_subgroup, WORLD, grouped)) == [0, 0, 1, 1]
