"""The live path takes a real state dict: `get_state_dict(model, optim)` of
an FSDP2 job as it comes (nested dicts, `param_groups`, 0-d `step`
tensors), moved in memory into a job on another mesh of the same process
group, against DCP's save + load of the same state (gloo, 4 processes)."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tenplan  # noqa: E402
from _dist import run  # noqa: E402

WORLD = 4


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(cfg)


def _job(mesh_shape, names):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    m = _model()
    for layer in m.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m, torch.optim.AdamW(m.parameters(), lr=1e-2)


def _step(m, optim, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (2, 8), generator=g)
    loss = m(input_ids=ids, labels=ids).loss
    loss.backward()
    optim.step()
    optim.zero_grad()
    return loss.detach()


def _trained_source(directory):
    """The source job: FSDP2 over 4 ranks, trained two steps; its
    `get_state_dict` as it comes, also saved with DCP into `directory`."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    src, src_optim = _job((4,), ("dp_shard",))
    for s in range(2):
        _step(src, src_optim, s)
    msd, osd = get_state_dict(src, src_optim)
    state = {"model": msd, "optim": osd}
    dcp.save(state, checkpoint_id=directory)
    dist.barrier()
    return state


def _live(rank, world, directory):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from tenplan.torch import reshard

    state = _trained_source(directory)
    results = []
    for how in ["tenplan", "dcp", "fresh"]:
        # The target job: HSDP on a 2x2 mesh of the same ranks.
        dst, dst_optim = _job((2, 2), ("dp_replicate", "dp_shard"))
        m2, o2 = get_state_dict(dst, dst_optim)
        target = {"model": m2, "optim": o2}
        if how == "tenplan":
            moved = reshard(state, out=target)
        elif how == "dcp":
            dcp.load(target, checkpoint_id=directory)
            moved = target
        if how != "fresh":
            set_state_dict(dst, dst_optim, model_state_dict=moved["model"], optim_state_dict=moved["optim"])
        losses = [float(_step(dst, dst_optim, 10 + s)) for s in range(3)]
        results.append(losses)
    # Bit-identical to DCP's own path; a job that did not receive the state
    # (the same initial weights, no steps taken) trains otherwise.
    assert results[0] == results[1], results
    assert results[2] != results[0], results
    return results[0]


def test_an_fsdp2_state_dict_moves_live_to_an_hsdp_mesh_as_dcp_would(tmp_path):
    out = run(_live, WORLD, str(tmp_path / "ckpt"), join_s=300, timeout_s=120)
    assert all(status == "ok" for status, _ in out), out
    losses = {tuple(v) for _, v in out}
    assert len(losses) == 1


def _mismatch(rank, world):
    from tenplan.torch import layout_from_state_dict, reshard

    sd = {"model": {"w": torch.ones(8, 4), "b": torch.ones(4)}, "optim": {"lr": 0.1, "step": torch.tensor(3.0)}}
    target = layout_from_state_dict({"model.w": torch.ones(8, 4), "model.c": torch.ones(4), "optim.step": torch.ones(1)})
    try:
        reshard(sd, target)
    except tenplan.TenplanError as e:
        return str(e)
    return "no error"


def test_a_target_without_a_tensor_of_the_state_is_named_on_every_rank():
    out = run(_mismatch, WORLD)
    messages = {v for _, v in out}
    assert len(messages) == 1, out
    (m,) = messages
    assert "tensor `model.b` is in the source only" in m, m


def _uneven_values(rank, world):
    from tenplan.torch import layout_from_state_dict, reshard

    sd = {"w": torch.ones(4), "lr": 0.1 * (1 + (rank == 2))}
    try:
        reshard(sd, layout_from_state_dict({"w": torch.ones(4)}))
    except tenplan.TenplanError as e:
        return str(e)
    return "no error"


def test_values_that_are_not_tensors_must_agree_across_ranks():
    out = run(_uneven_values, WORLD)
    for _, m in out:
        assert "entry `lr` differs between ranks 0 and 2" in m, m


def _undescribable(rank, world):
    from tenplan.torch import layout_from_state_dict, reshard

    sd = {"w": torch.ones(4), "mask": torch.ones(4, dtype=torch.bool if rank == 1 else torch.uint8)}
    try:
        reshard(sd, layout_from_state_dict({"w": torch.ones(4), "mask": torch.ones(4, dtype=torch.uint8)}))
    except tenplan.TenplanError as e:
        return str(e)
    return "no error"


def test_a_rank_that_cannot_describe_its_state_fails_every_rank_at_once():
    # Before, the other ranks waited on the gather until the group's timeout.
    out = run(_undescribable, WORLD, timeout_s=30, join_s=25)
    assert all(status == "ok" for status, _ in out), out
    for _, m in out:
        assert "rank 1: tensor `mask`: dtype torch.bool is not supported by tenplan" in m, m


def _fsdp2_tp_job():
    """FSDP2 over tensor parallelism on a 2x2 mesh: every projection
    column- or row-wise on `tp`, then FSDP2 on `dp_shard` (what each tp rank
    holds is sharded again: DTensor's `_StridedShard`)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    m = _model()
    plan = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }
    for layer in m.model.layers:
        parallelize_module(layer, mesh["tp"], plan)
    for layer in m.model.layers:
        fully_shard(layer, mesh=mesh["dp_shard"])
    fully_shard(m, mesh=mesh["dp_shard"])
    return m, torch.optim.AdamW(m.parameters(), lr=1e-2)


def _to_fsdp2_tp(rank, world, directory):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.tensor import DTensor

    from tenplan.torch import reshard

    state = _trained_source(directory)
    moved = {}
    for how in ["tenplan", "dcp"]:
        dst, dst_optim = _fsdp2_tp_job()
        m2, o2 = get_state_dict(dst, dst_optim)
        target = {"model": m2, "optim": o2}
        if how == "tenplan":
            moved[how] = reshard(state, out=target)
        else:
            dcp.load(target, checkpoint_id=directory)
            moved[how] = target
    # Every local shard equal, bit for bit, to what DCP's load put there.
    flat = {}
    for how, sd in moved.items():
        out = {}

        def walk(prefix, v):
            if isinstance(v, dict):
                for k, x in v.items():
                    walk(f"{prefix}{k}.", x)
            elif isinstance(v, list):
                for i, x in enumerate(v):
                    walk(f"{prefix}{i}.", x)
            else:
                out[prefix[:-1]] = v

        walk("", sd)
        flat[how] = out
    assert flat["tenplan"].keys() == flat["dcp"].keys()
    strided = 0
    for k, a in flat["tenplan"].items():
        b = flat["dcp"][k]
        if isinstance(a, DTensor):
            strided += any(type(p).__name__ == "_StridedShard" for p in a.placements)
            a, b = a.to_local(), b.to_local()
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), k
        else:
            assert a == b, k
    return strided


def test_an_fsdp2_state_dict_moves_live_to_fsdp2_over_tensor_parallelism(tmp_path):
    out = run(_to_fsdp2_tp, WORLD, str(tmp_path / "ckpt"), join_s=300, timeout_s=120)
    assert all(status == "ok" for status, _ in out), out
    # The column-wise weights and their moments are _StridedShard on dp_shard.
    assert all(v > 0 for _, v in out), out


def _sync_across_offloads(rank, world, free_on):
    from tenplan.torch import ExecutionError, layout_from_state_dict, prepare

    # An RL loop's weight sync, prepared once: the trainer is FSDP2 (its
    # parameters themselves as the source), every rank an engine holding
    # the whole weights (plain tensors, the `out` buffers). Between steps
    # the trainer is offloaded to the host and back as verl does
    # (`model.to(...)`), which gives every parameter new memory under the
    # same object; at the last step the engines reallocate their weights.
    m, optim = _job((4,), ("dp_shard",))
    params = dict(m.named_parameters())
    engine = {k: torch.zeros(p.shape) for k, p in params.items()}
    problem = tenplan.Problem(layout_from_state_dict(params), layout_from_state_dict(engine), tenplan.default_cluster(world))
    push = prepare(tenplan.plan(problem, "lp"), params, out=engine)
    for s in range(3):
        if s >= 1:
            m.to(torch.float64)
            m.to(torch.float32)
        _step(m, optim, s)
        if s == 2:
            for t in engine.values():
                t.data = torch.full_like(t, float("nan"))
        got = push()
        for k, p in params.items():
            want = p.full_tensor()
            assert torch.equal(engine[k], want), (s, k)
            assert got[k].data_ptr() == engine[k].data_ptr(), "written into the engine's current memory"
    rebinds = push.rebinds
    # FSDP's way of freeing a parameter: its storage resized to nothing.
    # The call refuses it on every rank before anything is written.
    name = sorted(params)[1]
    if rank == free_on:
        params[name]._local_tensor.untyped_storage().resize_(0)
    kept = {k: t.clone() for k, t in engine.items()}
    try:
        push()
    except ExecutionError as e:
        assert all(torch.equal(engine[k], kept[k]) for k in engine), "nothing written"
        return rebinds, str(e)
    return rebinds, "no error"


def test_a_prepared_sync_follows_tensors_whose_memory_moved_and_refuses_freed_ones():
    out = run(_sync_across_offloads, WORLD, 2, join_s=300, timeout_s=120)
    assert all(status == "ok" for status, _ in out), out
    for _, (rebinds, error) in out:
        # Bound again after each of the two offloads (the engines' new
        # buffers at the second).
        assert rebinds == 2, rebinds
        assert error.startswith("rank 2: tensor `") and "its memory was freed" in error, error
