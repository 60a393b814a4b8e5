"""Live resharding of a Megatron-Core job's state.

A Megatron-Core model's ``sharded_state_dict()`` already says, for every
tensor a rank holds, its global name, global shape and offset
(``ShardedTensor``: layers stacked on a leading axis, SwiGLU's ``[W; V]``
as two boxes per rank through a ``ShardedTensorFactory``). Every rank
describes its boxes, the descriptions are gathered into a
:class:`tenplan.Layout`, and :func:`reshard` moves the state of the old
configuration into the tensors of the new one in memory, with an optimal,
verified plan and the torch.distributed executor (:mod:`tenplan.torch`):
what Megatron's ``dist_checkpointing.save`` + ``load`` does through
storage, and what DynaTrain does with a fixed first-replica source.

Usage, on every rank of the job's process group::

    old = model.sharded_state_dict()           # under the old configuration
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(...)  # the new configuration
    new_model = build_model()
    report = tenplan.megatron.reshard(old, new_model.sharded_state_dict())
    # new_model now holds the state; report has the plan's time and bound.

A job with Megatron's distributed optimizer moves its optimizer state the
same way, in the ``fully_reshardable`` form Megatron-LM checkpoints it
(each parameter's main copy and moments in the parameter's shape);
:func:`load` returns the new job's state dict as ``dist_checkpointing.load``
would from a checkpoint of the old one::

    old = {"model": msd, "optimizer": optim.sharded_state_dict(msd, metadata=FULLY_RESHARDABLE)}
    ...                                          # the new configuration's job
    new = {"model": new_msd, "optimizer": new_optim.sharded_state_dict(
        new_msd, is_loading=True, metadata=FULLY_RESHARDABLE)}
    state, report = tenplan.megatron.load(old, new)
    new_model.load_state_dict(state["model"])
    new_optim.load_state_dict(state["optimizer"])

(``FULLY_RESHARDABLE = {"distrib_optim_sharding_type": "fully_reshardable"}``.)

Faster, with nothing gathered: give the two jobs' optimizers and the
optimizer's data-parallel shards move as they lie, straight into the new
job's optimizer (its ``param_groups`` and step loaded from the old job's
rank 0 first)::

    report = tenplan.megatron.reshard(
        model.sharded_state_dict(), new_model.sharded_state_dict(), optimizers=(optim, new_optim))

Nothing is left behind: a ``ShardedTensor`` of the source that the target
lacks (or the reverse, or another shape or element type) is refused naming
it, on every rank. ``ShardedObject`` entries (``_extra_state``) are not
moved: those that hold nothing (Megatron's own layers keep ``None``) are
fine; one that holds something (Transformer Engine's FP8 metadata) is
refused by name. Distributed-optimizer state given as flattened ranges
(``flattened_range``) is refused too.
"""

from __future__ import annotations

import datetime
import io
import math
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import Layout, _tenplan
from .torch import _collective, _dtype_name, _gathered, prepare


def _leaves(tree, out: list) -> list:
    """The leaves of a nested dict / list / tuple, in order."""
    if isinstance(tree, Mapping):
        for v in tree.values():
            _leaves(v, out)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            _leaves(v, out)
    else:
        out.append(tree)
    return out


def _built(sharded_state_dict) -> list:
    """The leaves of a sharded state dict, its factories built (SwiGLU's
    factory gives two ShardedTensors whose data are views of the one
    parameter, so writes into them reach the model)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensorFactory

    out = []
    for leaf in _leaves(sharded_state_dict, []):
        if isinstance(leaf, ShardedTensorFactory):
            out.extend(_leaves(leaf.build(), []))
        else:
            out.append(leaf)
    return out


def _empty(data) -> bool:
    """Whether a ShardedObject's data holds nothing (None, an empty
    container, or a buffer that torch.load reads as one)."""
    if data is None:
        return True
    if isinstance(data, (list, tuple)):
        return all(_empty(x) for x in data)
    if isinstance(data, io.BytesIO):
        value = data.getvalue()
        if not value:
            return True
        try:
            return _empty(torch.load(io.BytesIO(value), weights_only=False))
        except Exception:
            return False
    if isinstance(data, torch.Tensor):
        return data.numel() == 0
    return False


def shards(sharded_state_dict) -> Tuple[Dict[str, torch.Tensor], List[dict]]:
    """This rank's boxes of a Megatron-Core sharded state dict: each
    buffer's local tensor by buffer name, and the descriptions
    (:func:`tenplan.torch.layout_from_descriptions`) naming each
    ShardedTensor by its checkpoint key. A key held twice on this rank
    (SwiGLU's halves) gives buffers ``key@offsets``."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor

    tensors: Dict[str, torch.Tensor] = {}
    descriptions: List[dict] = []
    held: List[Tuple[ShardedTensor, List[Tuple[int, int]]]] = []
    for leaf in _built(sharded_state_dict):
        if isinstance(leaf, ShardedObject):
            if not _empty(leaf.data):
                raise _tenplan.LayoutError(
                    f"`{leaf.key}` is a ShardedObject that holds state ({type(leaf.data).__name__}), "
                    "which the live path does not move; save and load it with dist_checkpointing"
                )
            continue
        if not isinstance(leaf, ShardedTensor):
            continue
        if getattr(leaf, "flattened_range", None) is not None:
            raise _tenplan.LayoutError(
                f"`{leaf.key}` is a flattened range (the distributed optimizer's dp_reshardable state), "
                "which the live path does not move yet; give the model's and fully_reshardable optimizer state"
            )
        local = tuple(leaf.data.shape)
        if len(local) != len(leaf.global_shape):
            # The stacked axes (a layer's index) are not the data's own.
            local = (1,) * leaf.prepend_axis_num + local
        box = [(int(o), int(o) + int(n)) for o, n in zip(leaf.global_offset, local)]
        if len(box) != len(leaf.global_shape) or len(leaf.global_offset) != len(box):
            raise _tenplan.LayoutError(
                f"`{leaf.key}`: a local tensor of shape {tuple(leaf.data.shape)} at offsets {leaf.global_offset} "
                f"does not fit its shape {leaf.global_shape}"
            )
        held.append((leaf, box))
    counts: Dict[str, int] = {}
    for leaf, _ in held:
        counts[leaf.key] = counts.get(leaf.key, 0) + 1
    for leaf, box in held:
        buffer = leaf.key if counts[leaf.key] == 1 else f"{leaf.key}@{[lo for lo, _ in box]}"
        # Detached: the same storage (writes reach the model's parameters)
        # outside autograd.
        tensors[buffer] = leaf.data.detach()
        descriptions.append(
            {
                "name": leaf.key,
                "buffer": buffer,
                "dtype": _dtype_name(leaf.data.dtype, leaf.key),
                "shape": [int(n) for n in leaf.global_shape],
                "box": box,
            }
        )
    return tensors, descriptions


def flat_boxes(shape: Sequence[int], start: int, stop: int) -> List[Tuple[List[Tuple[int, int]], int]]:
    """The flat range [start, stop) of a row-major tensor of ``shape`` as
    boxes, each contiguous in memory, in order: (box, its first element's
    flat index). At most 2·ndim−1 of them."""
    if start >= stop:
        return []
    if len(shape) <= 1:
        return [([(start, stop)], start)]
    inner = math.prod(int(n) for n in shape[1:])

    def on_row(row, lo, hi):
        # Elements lo..hi of one row: boxes of the rest, on that row.
        return [([(row, row + 1)] + box, row * inner + at) for box, at in flat_boxes(shape[1:], lo, hi)]

    first, last = start // inner, (stop - 1) // inner
    if first == last:
        return on_row(first, start - first * inner, stop - first * inner)
    whole_from, whole_to = -(-start // inner), stop // inner
    out = on_row(first, start % inner, inner) if start % inner else []
    if whole_to > whole_from:
        out.append(([(whole_from, whole_to)] + [(0, int(n)) for n in shape[1:]], whole_from * inner))
    return out + (on_row(whole_to, 0, stop % inner) if stop % inner else [])


def _owned_ranges(optimizer):
    """(DistributedOptimizer, model parameter, the range of its flattening
    this data-parallel rank owns) for every parameter this rank's optimizer
    shard touches."""
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        for per_dtype in part.gbuf_ranges:
            for per_bucket in per_dtype.values():
                for bucket in per_bucket:
                    for model_param, ranges in bucket["param_map"].items():
                        yield part, model_param, ranges["param"]


def optimizer_shards(model_sharded_state_dict, optimizer) -> Tuple[Dict[str, torch.Tensor], List[dict]]:
    """This rank's share of Megatron's distributed optimizer state as it
    lies, without gathering it: for each parameter, the flat range of it
    this data-parallel rank owns (its main copy and Adam's moments) as
    boxes of the tensors a ``fully_reshardable`` checkpoint names
    (``optimizer.state.{param,exp_avg,exp_avg_sq}.<key>``, the parameter's
    key, shape and tensor-parallel offset, taken from the model's sharded
    state dict). Returns buffers (views into the optimizer's state) and
    their descriptions, as :func:`shards`. Reads megatron-core's
    ``DistributedOptimizer`` internals (``gbuf_ranges``), as 0.16 has them."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    # Each parameter's ShardedTensors (SwiGLU's two halves: views of it)
    # and where each starts in the parameter's flattening.
    views: Dict[int, List[Tuple[ShardedTensor, int]]] = {}
    for leaf in _leaves(model_sharded_state_dict, []):
        if isinstance(leaf, ShardedTensorFactory):
            param, parts = leaf.data, _leaves(leaf.build(), [])
        elif isinstance(leaf, ShardedTensor):
            param, parts = leaf.data, [leaf]
        else:
            continue
        for part in parts:
            at = part.data.storage_offset() - param.storage_offset()
            if not part.data.is_contiguous() or part.data.untyped_storage().data_ptr() != param.untyped_storage().data_ptr():
                raise _tenplan.LayoutError(f"`{part.key}` is not a contiguous block of its parameter")
            views.setdefault(param.data_ptr(), []).append((part, at))
    tensors: Dict[str, torch.Tensor] = {}
    descriptions: List[dict] = []
    for part, model_param, owned in _owned_ranges(optimizer):
        states = part._get_main_param_and_optimizer_states(model_param)
        held = views.get(model_param.data_ptr())
        if not held:
            raise _tenplan.LayoutError("a parameter of the optimizer is not in the model's sharded state dict")
        for st, at in held:
            lo, hi = max(owned.start, at), min(owned.end, at + st.data.numel())
            lead = [(int(o), int(o) + 1) for o in st.global_offset[: st.prepend_axis_num]]
            offsets = st.global_offset[st.prepend_axis_num :]
            for box, first in flat_boxes(tuple(st.data.shape), lo - at, hi - at):
                shape = [b - a for a, b in box]
                size = math.prod(shape)
                glob = lead + [(int(o) + a, int(o) + b) for o, (a, b) in zip(offsets, box)]
                begin = at + first - owned.start
                for kind, state in states.items():
                    if kind == "step":
                        continue
                    name = f"optimizer.state.{kind}.{st.key}"
                    buffer = f"{name}@{[a for a, _ in glob]}"
                    tensors[buffer] = state.detach()[begin : begin + size].view((1,) * len(lead) + tuple(shape))
                    descriptions.append(
                        {
                            "name": name,
                            "buffer": buffer,
                            "dtype": _dtype_name(state.dtype, name),
                            "shape": [int(n) for n in st.global_shape],
                            "box": glob,
                        }
                    )
    return tensors, descriptions


def layout_from_sharded_state_dict(
    sharded_state_dict,
    group: Optional[dist.ProcessGroup] = None,
    devices: Optional[Sequence[int]] = None,
) -> Layout:
    """The layout of a Megatron-Core job's sharded state dict across its
    process group: every rank describes its boxes (:func:`shards`), the
    descriptions are gathered, every rank gets the same layout."""
    _, descriptions = _collective(lambda: shards(sharded_state_dict), group)
    ((headers, ranks),) = _gathered([descriptions], group)
    return Layout.from_gathered(headers, ranks, devices)


def reshard(
    source,
    target,
    *,
    optimizers: Optional[Tuple[object, object]] = None,
    planner: str = "lp",
    cluster: Optional[_tenplan.Cluster] = None,
    group: Optional[dist.ProcessGroup] = None,
    devices: Optional[Sequence[int]] = None,
    timeout: datetime.timedelta = datetime.timedelta(seconds=60),
) -> dict:
    """Move a Megatron-Core job's state between parallel configurations in
    memory: ``source`` is this rank's ``sharded_state_dict()`` under the
    old configuration, ``target`` the new model's; every ShardedTensor of
    the target is written in place (the new model's parameters) with the
    source's values. Every rank of ``group`` calls it. Plans with
    ``planner`` on ``cluster`` (default: enough DGX-H100 nodes for the
    group), verifies the plan, and performs it (:mod:`tenplan.torch`).
    Returns the plan's report (``tenplan.evaluate``: makespan, certified
    lower bound, bytes) with the tensors moved and where this rank's time
    went (``seconds``: describe and gather the layouts, plan, bind, execute).

    ``optimizers=(old, new)``, the two jobs' Megatron distributed
    optimizers, moves the optimizer state along, as it lies: each
    data-parallel rank's flat shard of every parameter's main copy and
    moments (:func:`optimizer_shards`) straight into the new job's, nothing
    gathered; the state that is not sharded (``param_groups``, the step) is
    rank 0's of the old job, loaded into the new one first."""
    start = time.perf_counter()
    old_optim, new_optim = optimizers or (None, None)
    if new_optim is not None:
        # Rank 0's, as a checkpoint keeps it.
        first = dist.get_rank(group) == 0
        holder = [_collective(lambda: old_optim.state_dict() if first else None, group)]
        dist.broadcast_object_list(holder, src=dist.get_global_rank(group, 0) if group else 0, group=group)
        # Before describing the new job's state: loading makes its tensors.
        _collective(lambda: new_optim.load_state_dict(holder[0]), group)

    def describe(state, optim):
        tensors, descriptions = shards(state)
        if optim is not None:
            more, described = optimizer_shards(state, optim)
            tensors.update(more)
            descriptions += described
        return tensors, descriptions

    src_tensors, src_desc = _collective(lambda: describe(source, old_optim), group)
    dst_tensors, dst_desc = _collective(lambda: describe(target, new_optim), group)
    (src_headers, src_ranks), (dst_headers, dst_ranks) = _gathered([src_desc, dst_desc], group)

    def check() -> Tuple[Layout, Layout]:
        def tensors_of(headers):
            out = {}
            for header in headers:
                for name, dtype, shape, *_ in header:
                    out[name] = (list(shape), dtype)
            return out

        a, b = tensors_of(src_headers), tensors_of(dst_headers)
        for name in sorted(set(a) | set(b)):
            if name not in b:
                raise _tenplan.LayoutError(f"tensor `{name}` of the source state is missing from the target")
            if name not in a:
                raise _tenplan.LayoutError(f"tensor `{name}` of the target is missing from the source state")
            if a[name] != b[name]:
                raise _tenplan.LayoutError(
                    f"tensor `{name}`: the source holds shape {a[name][0]} {a[name][1]}, the target {b[name][0]} {b[name][1]}"
                )
        # One numbering for both: the jobs' optimizers may list their
        # parameters in other orders (a bf16 model's buckets).
        order = sorted(a)
        return Layout.from_gathered(src_headers, src_ranks, devices, order), Layout.from_gathered(dst_headers, dst_ranks, devices, order)

    src_layout, dst_layout = _collective(check, group)
    described = time.perf_counter()
    n = max(max(src_layout.devices()), max(dst_layout.devices())) + 1
    cluster = cluster or _tenplan.default_cluster(n)
    p = _tenplan.plan(_tenplan.Problem(src_layout, dst_layout, cluster), planner)
    planned = time.perf_counter()
    prepared = prepare(p, src_tensors, group=group, devices=devices, out=dst_tensors, timeout=timeout)
    bound = time.perf_counter()
    prepared()
    done = time.perf_counter()
    report = _tenplan.evaluate(p)
    report["tensors"] = len(dst_layout.tensors())
    report["seconds"] = {
        "describe": described - start,
        "plan": planned - described,
        "prepare": bound - planned,
        "execute": done - bound,
    }
    return report


def load(
    source,
    target,
    *,
    planner: str = "lp",
    cluster: Optional[_tenplan.Cluster] = None,
    group: Optional[dist.ProcessGroup] = None,
    devices: Optional[Sequence[int]] = None,
    timeout: datetime.timedelta = datetime.timedelta(seconds=60),
) -> Tuple[dict, dict]:
    """What ``dist_checkpointing.load(target, dir)`` returns after
    ``dist_checkpointing.save(source, dir)`` under the old configuration,
    without the storage: every ShardedTensor of ``target`` filled in place
    by :func:`reshard` and given as its tensor (factories merged, as
    Megatron's loader merges them), and the entries that are not sharded
    (an optimizer's ``param_groups`` and step, ``param_state_sharding_type``)
    taken from ``source`` as rank 0 of ``group`` holds them, as a checkpoint
    keeps rank 0's. Returns that state dict and the plan's report. Every
    rank of ``group`` calls it."""
    from megatron.core.dist_checkpointing.dict_utils import dict_list_map_inplace, extract_matching_values, merge
    from megatron.core.dist_checkpointing.mapping import (
        ShardedObject,
        ShardedTensor,
        ShardedTensorFactory,
        apply_factories,
        apply_factory_merges,
    )
    from megatron.core.dist_checkpointing.utils import extract_nonpersistent, extract_sharded_base

    def common_of(state):
        # What a checkpoint's common.pt would hold: neither sharded nor
        # left out of checkpoints.
        _, persistent = extract_nonpersistent(state)
        _, common = extract_sharded_base(persistent)
        return common

    holder = [common_of(source)]
    dist.broadcast_object_list(holder, src=dist.get_global_rank(group, 0) if group else 0, group=group)
    result = holder[0]
    # The target as Megatron's loader prepares it (a copy of its structure,
    # the tensors themselves shared): factories built, nonpersistent
    # entries unwrapped.
    prepared, _ = extract_matching_values(target, lambda x: True)
    factories, _ = extract_matching_values(
        prepared, lambda x: isinstance(x, ShardedTensorFactory), return_lists_as_dicts=True
    )
    apply_factories(prepared)
    nonpersistent, prepared = extract_nonpersistent(prepared)
    dict_list_map_inplace(lambda o: o.unwrap(), nonpersistent)
    merge(result, nonpersistent)
    sharded, _ = extract_sharded_base(prepared)
    report = reshard(
        source, sharded, planner=planner, cluster=cluster, group=group, devices=devices, timeout=timeout
    )
    # ShardedObjects that reach here hold nothing on the source side
    # (shards() refuses the others): the target's own value stands.
    loaded = dict_list_map_inplace(
        lambda x: x.data if isinstance(x, (ShardedTensor, ShardedObject)) else x, sharded
    )
    merge(result, loaded)
    return apply_factory_merges(result, factories), report
