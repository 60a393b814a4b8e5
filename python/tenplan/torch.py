"""Layouts of live PyTorch state, and the torch.distributed executor.

Every rank of a process group describes the pieces it holds (from a DTensor
state dict, or from explicit boxes), the descriptions are gathered over the
group into one :class:`tenplan.Layout`, a plan is made (on every rank: plans
are deterministic) and :func:`execute` performs it: each rank runs its own
program (``tenplan.program``), local copies as tensor copies and remote ones
with ``torch.distributed`` sends and receives, one packed transfer per peer
and step, relays and multicast forwards included, reduce-copies adding into
the destination. It runs on gloo (CPU tensors) and NCCL (CUDA tensors). On
CPU the copies are compiled once into ``memcpy``s (``_tenplan.HostCopies``)
and every copy that reads the source runs in one pass in the order of the
source's bytes.

A state dict is taken as it comes: nested dicts and lists (what
``torch.distributed.checkpoint.state_dict.get_state_dict`` gives for a model
and its optimizer), flattened to dotted keys as DCP flattens them (so the
tensors' names are a DCP checkpoint's); 0-d tensors (an optimizer's
``step``) as one element each; values that are not tensors (``param_groups``)
checked equal on every rank and carried to the output.

Failures are collective: a rank whose inputs do not match the plan, or
whose peer dies or times out, raises :class:`ExecutionError`, and so does
every other rank (within ``timeout``); no rank returns a partial state.
"""

from __future__ import annotations

import array
import bisect
import contextlib
import datetime
import gc
import hashlib
import math
import pickle
import time
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

import torch
import torch.distributed as dist

from . import Layout, Plan, TenplanError, _tenplan

DTYPES = {
    "f64": torch.float64,
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i64": torch.int64,
    "i32": torch.int32,
    "u8": torch.uint8,
}
NAMES = {v: k for k, v in DTYPES.items()}
# Batched tensor copies (one launch for many pairs on a GPU), where torch has them.
_FOREACH_COPY = hasattr(torch, "_foreach_copy_")

Box = List[Tuple[int, int]]
# Messages at least this large travel alone where that saves a copy (None:
# the library's default, ``ALONE_MIN_BYTES``); tests lower it to exercise
# that path on small tensors. Every rank must use the same value.
_ALONE_MIN_BYTES: Optional[int] = None
# On CPU, copies run as compiled memcpys (see _native); benchmarks turn it
# off to measure torch's own copy_ beside it.
_NATIVE_COPIES = True
# Writes of received bytes into the target stream past the cache from this
# size on (packs, which are sent at once, from the library's 16 MiB).
_TARGET_STREAMING_BYTES = 1 << 20
# Each step's sends and receives as one batch_isend_irecv, as NCCL needs,
# on gloo too (tests run NCCL's path this way on CPUs).
_GROUPED_P2P = False


class ExecutionError(TenplanError):
    """A plan could not be performed across the process group; no rank
    holds a partial result."""


def _dtype_name(dtype: torch.dtype, what: str) -> str:
    try:
        return NAMES[dtype]
    except KeyError:
        raise _tenplan.LayoutError(f"tensor `{what}`: dtype {dtype} is not supported by tenplan") from None


def flatten(state_dict: Mapping) -> Tuple[Dict[str, torch.Tensor], Dict[str, object], Dict[str, tuple]]:
    """A (possibly nested) state dict as DCP flattens it: its tensors and
    its other values by dotted key, and each key's path in the nesting
    (what :func:`unflatten` rebuilds it from)."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    flat, paths = flatten_state_dict(dict(state_dict))
    tensors = {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}
    others = {k: v for k, v in flat.items() if not isinstance(v, torch.Tensor)}
    return tensors, others, paths


def unflatten(flat: Mapping[str, object], paths: Mapping[str, tuple]) -> dict:
    """The nested state dict of dotted keys ``flat`` (see :func:`flatten`)."""
    from torch.distributed.checkpoint._nested_dict import unflatten_state_dict

    return unflatten_state_dict(dict(flat), dict(paths))


def _flat_tensors(state_dict: Mapping) -> Dict[str, torch.Tensor]:
    """The tensors of a state dict, flat or nested, by dotted key."""
    if all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        return dict(state_dict)
    return flatten(state_dict)[0]


def _agree_values(others: Mapping[str, object], group) -> None:
    """Raise on every rank unless every rank holds the same values that are
    not tensors (a job's ranks share their ``param_groups``)."""
    gathered: List[Optional[dict]] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, dict(others), group=group)
    first = gathered[0] or {}
    for rank, other in enumerate(gathered):
        other = other or {}
        for key in sorted(set(first) | set(other)):
            if key not in other or key not in first or not _same_value(first[key], other[key]):
                raise _tenplan.LayoutError(
                    f"entry `{key}` differs between ranks 0 and {rank} "
                    f"({first.get(key, '(missing)')!r} against {other.get(key, '(missing)')!r}): "
                    "a state's entries that are not tensors must be the same on every rank"
                )


def _same_value(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return repr(a) == repr(b)


def describe(state_dict: Mapping) -> List[dict]:
    """What this rank holds: for each tensor, its global shape, dtype and the
    box of it this rank's local tensor is. DTensors give their shard
    (Shard(d) on any mesh dimension, uneven ``torch.chunk``-style shards as
    FSDP2 makes them, FSDP2 over tensor parallelism's ``_StridedShard``,
    Replicate, and ``Partial("sum")``: the rank holds an addend of its box,
    ``"partial": True``, and a resharded tensor arrives summed; a rank
    outside the DTensor's mesh holds none of it); plain
    tensors are whole (replicated). A nested state dict is flattened to
    DCP's dotted keys; a 0-d tensor is described as one element."""
    out = []
    for name, t in _flat_tensors(state_dict).items():
        partial = outside = False
        shape = [int(n) for n in t.shape]
        box = [(0, n) for n in shape]
        if hasattr(t, "device_mesh") and hasattr(t, "placements"):
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

            partial = any(p.is_partial() for p in t.placements)
            # A rank outside the tensor's mesh holds none of it (an
            # engine's weights on a mesh of their own, seen from a
            # trainer's rank of the same group).
            outside = t.device_mesh.get_coordinate() is None
            if not outside:
                local_shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
                box = [(int(o), int(o) + int(n)) for o, n in zip(offset, local_shape)]
        if not shape:
            # A 0-d tensor (an optimizer's step, a loss): one element.
            shape, box = [1], [(0, 1)]
        if outside or (partial and not _holds_addend(name, t)):
            box = [(lo, lo) for lo, _ in box]
        d = {"name": name, "dtype": _dtype_name(t.dtype, name), "shape": shape, "box": box}
        if partial:
            d["partial"] = True
        out.append(d)
    return out


def _holds_addend(name: str, t) -> bool:
    """Whether this rank describes its addend of a DTensor with ``Partial``
    placements. tenplan sums every holder's addend, while DTensor's ranks
    along a ``Replicate`` mesh dimension hold copies of one addend: only
    the first of them (coordinate 0 there) describes it, the others hold
    nothing of the tensor. Only sums have that meaning (``Partial("avg")``
    and the like are refused)."""
    for p in t.placements:
        if p.is_partial() and getattr(p, "reduce_op", "sum") != "sum":
            raise _tenplan.LayoutError(f"tensor `{name}`: Partial({p.reduce_op!r}) placements are not supported, only sums; reduce first")
    coordinate = t.device_mesh.get_coordinate() or []
    return not any(p.is_replicate() and c != 0 for p, c in zip(t.placements, coordinate))


def layout_from_descriptions(
    descriptions: Sequence[List[dict]],
    devices: Optional[Sequence[int]] = None,
    order: Optional[Sequence[str]] = None,
) -> Layout:
    """The layout of a group whose rank ``r`` holds ``descriptions[r]`` (what
    :func:`describe` gives, or dicts ``{"name", "dtype", "shape", "box"}``
    written by hand) on device ``devices[r]`` (default ``r``). Each rank's
    tensors are buffers named after the tensors, or ``"buffer"`` where a
    description gives one (a rank holding two boxes of one tensor). Ranks must agree on every
    tensor's shape and dtype; together they must cover every tensor. The
    tensors are numbered in ``order`` (every name described, once) when
    given, else as they first appear: two layouts of one problem must
    number them alike."""
    return Layout.from_descriptions(descriptions, devices, order)


def layout_from_state_dict(
    state_dict: Mapping[str, torch.Tensor],
    group: Optional[dist.ProcessGroup] = None,
    devices: Optional[Sequence[int]] = None,
) -> Layout:
    """The layout of a state dict held across a process group: every rank
    describes its pieces (:func:`describe`), the descriptions are gathered,
    and every rank gets the same layout. A rank that cannot describe its
    state (a tensor of a type tenplan does not move) fails every rank with
    its message, instead of leaving them waiting on the gather."""
    ((headers, ranks),) = _gathered([_collective(lambda: describe(state_dict), group)], group)
    return Layout.from_gathered(headers, ranks, devices)


_Gathered = Tuple[List[tuple], List[Tuple[int, bytes]]]
# Up to this many distinct headers are broadcast one by one; more (ranks
# that each name their buffers apart) are gathered in one collective.
_HEADER_BROADCASTS = 16


def _gathered(descriptions: Sequence[List[dict]], group) -> List[_Gathered]:
    """Every rank's ``descriptions`` (one or more lists of what it holds:
    of a source state and of a target, say), the same on every rank, as
    :meth:`tenplan.Layout.from_gathered` takes them: the distinct headers
    (names, types and shapes) and each rank's header and boxes.

    The boxes travel as integers and each header once: ranks of one mesh
    describe the same tensors, so a group of thousands gathers a few
    headers, not a dict per rank and tensor (which took longer to unpickle
    than to plan)."""
    headers, keys, bounds = _compact(descriptions)
    world, me = dist.get_world_size(group), dist.get_rank(group)
    gathered: List[Tuple[List[bytes], List[bytes]]] = [([], [])] * world
    dist.all_gather_object(gathered, (keys, bounds), group=group)
    # Where ranks differ (pipeline stages, ranks holding other tensors),
    # the first rank to hold each header gives it; where they all hold the
    # same, each has them already.
    known = dict(zip(keys, headers))
    if any(g[0] != gathered[0][0] for g in gathered):
        first: Dict[bytes, Tuple[int, int]] = {}
        for rank, g in enumerate(gathered):
            for i, k in enumerate(g[0]):
                first.setdefault(k, (rank, i))
        if len(first) <= _HEADER_BROADCASTS:
            # One broadcast each: all_gather_object would pad every rank's
            # object to a whole header.
            for k, (r, i) in first.items():
                holder = [headers[i] if r == me else None]
                dist.broadcast_object_list(holder, group=group, group_src=r)
                known[k] = holder[0]
        else:
            given: List[List[Optional[tuple]]] = [[]] * world
            dist.all_gather_object(given, [h if first[k] == (me, i) else None for i, (k, h) in enumerate(zip(keys, headers))], group=group)
            known = {k: given[r][i] for k, (r, i) in first.items()}
    out = []
    for i in range(len(descriptions)):
        distinct: Dict[bytes, int] = {}
        ranks = [(distinct.setdefault(g[0][i], len(distinct)), g[1][i]) for g in gathered]
        out.append(([known[k] for k in distinct], ranks))
    return out


def _compact(descriptions: Sequence[List[dict]]) -> Tuple[List[tuple], List[bytes], List[bytes]]:
    """What this rank gives :func:`_gathered` of each description: its
    header (names, types, shapes, buffers, addends or not), the header's digest, and its
    boxes as native-endian u64 ``lo, hi`` pairs."""
    headers = [
        tuple((d["name"], d["dtype"], tuple(int(n) for n in d["shape"]), d.get("buffer"), bool(d.get("partial", False))) for d in desc)
        for desc in descriptions
    ]
    keys = [hashlib.sha256(pickle.dumps(h)).digest() for h in headers]
    bounds = [array.array("Q", [int(x) for d in desc for lo_hi in d["box"] for x in lo_hi]).tobytes() for desc in descriptions]
    return headers, keys, bounds


def _local(t: torch.Tensor) -> torch.Tensor:
    t = t.to_local() if hasattr(t, "to_local") else t
    # A 0-d tensor is one element of the layout.
    return t.reshape(1) if t.dim() == 0 else t


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic collector paused while a plan is bound: binding
    makes views, dicts and lists by the hundred thousand, none of them
    garbage, and the collector walked them again and again (half of
    `prepare` for 16,000 tensors on 4 ranks: 20.7 s, 11.5 s paused)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _memory_of(tensors: List[torch.Tensor]) -> List[Tuple[int, int]]:
    """Where each tensor's values lie now: the address of its first
    element, and its element count. A change says its memory moved
    (``p.data = ...``, an offload and reload), was freed (a storage resized
    to nothing has no address) or was cut otherwise; the new binding then
    checks that it is in memory (:func:`_in_memory`). A third of a
    microsecond a tensor: every call asks, for every tensor."""
    out = []
    for t in tensors:
        # A DTensor's shard without to_local()'s cost (ten times this).
        local = getattr(t, "_local_tensor", None)
        if local is None:
            local = t.to_local() if hasattr(t, "to_local") else t
        out.append((local.data_ptr(), local.numel()))
    return out


def _in_memory(name: str, t: torch.Tensor) -> torch.Tensor:
    """``t``, once it is known that its storage holds every element it
    views: FSDP frees an unsharded parameter by resizing its storage to
    nothing, and the copies must not read or write freed memory."""
    if t.numel():
        need = (t.storage_offset() + 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()
        have = t.untyped_storage().nbytes()
        if have < need:
            raise _tenplan.LayoutError(
                f"tensor `{name}`: its memory was freed ({have} bytes of storage for the {need} it views); the source "
                "is read and `out` written where they are when the plan runs, so both must be in memory then"
            )
    return t


def _view(buffers: List[torch.Tensor], box: dict) -> torch.Tensor:
    """The sub-box ``[lo, hi)`` of a piece of a flat buffer, as a view."""
    shape = box["shape"]
    start = box["offset"]
    piece = buffers[box["buffer"]][start : start + math.prod(shape)].view(shape)
    return piece[tuple(slice(lo, hi) for lo, hi in zip(box["lo"], box["hi"]))]


def _zeroed(specs: List[Tuple[int, torch.dtype]], device) -> List[torch.Tensor]:
    """Zeroed buffers (targets, receive buffers). On CPU they share one
    anonymous mapping that asks the kernel for huge pages: hundreds of
    tensors allocated one by one fault their memory in 4 KiB at a time,
    which cost this executor as much as its copies."""
    if device.type != "cpu" or not specs:
        return [torch.zeros(n, dtype=d, device=device) for n, d in specs]
    import mmap

    align = 64
    starts, end = [], 0
    for n, d in specs:
        end = -(-end // align) * align
        starts.append(end)
        end += n * d.itemsize
    # Private: a shared anonymous mapping is shmem, which takes no huge
    # pages here and faults more slowly.
    region = mmap.mmap(-1, max(end, 1), flags=mmap.MAP_PRIVATE)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    flat = torch.frombuffer(region, dtype=torch.uint8)
    return [flat[a : a + n * d.itemsize].view(d) for a, (n, d) in zip(starts, specs)]


def _agree(error: Optional[str], group) -> None:
    """Raise on every rank if any rank reports an error (with the first
    rank's message), or if a peer cannot be reached. One integer is
    reduced first and the messages are gathered only when some rank has
    one: pickling objects across the group costs a prepared call ten to
    twenty milliseconds on gloo, a reduction of one integer well under
    one."""
    errors: List[Optional[str]] = [None] * dist.get_world_size(group)
    try:
        nccl = dist.get_backend(group) == "nccl"
        failed = torch.tensor([int(error is not None)], dtype=torch.int32, device=torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu")
        dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=group)
        if failed.item():
            dist.all_gather_object(errors, error, group=group)
    except Exception as e:
        raise ExecutionError(
            f"rank {dist.get_rank(group)}: a peer died or timed out ({type(e).__name__}: {e})"
            + (f"; this rank: {error}" if error else "")
        ) from e
    bad = [(r, e) for r, e in enumerate(errors) if e]
    if bad:
        r, e = bad[0]
        raise ExecutionError(f"rank {r}: {e}")


def _collective(fn, group):
    """``fn()`` on every rank of ``group``; a ``TenplanError`` on any rank
    raises on all (see :func:`_agree`). Returns this rank's value."""
    error, value = None, None
    try:
        value = fn()
    except TenplanError as e:
        error = str(e)
    _agree(error, group)
    return value


class PreparedPlan:
    """A plan bound to this rank's source tensors and target buffers, with
    its check, its program and the views of every piece it touches made
    once (:func:`prepare`). Each call performs the plan again on the source
    tensors' current values and returns the same target tensors: what an RL
    loop needs to sync weights from trainer to engines after every step.

    Each call reads the source tensors and writes the ``out`` tensors where
    their memory is at that call: a tensor given whose memory moved since
    (``p.data = ...``, an offload to the host and back, an engine that
    reallocated its weights) is bound again on its rank, at the cost of a
    ``prepare`` without the check (``rebinds`` counts them), and one whose
    memory was freed (FSDP's ``storage.resize_(0)``) is refused, naming it,
    on every rank before any byte moves. Give the tensors themselves
    (parameters, DTensors), not views taken once: a view keeps the memory
    it was taken of. A non-contiguous source is copied into a contiguous
    buffer at each call, and so is one of another floating-point type than
    the plan sends when ``convert`` was asked for (the trainer's fp32 master
    weights sent as bf16, rounded to nearest even; see ``tenplan.sync``'s
    ``trainer_dtype``). Target buffers that receive reduce-copies are zeroed
    at each call, before the copies add into them, unless the first copy
    into one is this rank's own addend over all of it (then copied).

    ``copied_bytes`` is what one call copies within this rank (packing,
    gathering, local and unpacking copies: the rearrangement beside what
    the transport moves); ``timings`` says where the last call's time
    went."""

    def __init__(self, plan, source, *, group, devices, out, timeout, convert=False):
        self.group, self.timeout, self._convert = group, timeout, convert
        rank = dist.get_rank(group)
        world = dist.get_world_size(group)
        devices = list(devices) if devices is not None else list(range(world))
        # Peers are ranks of ``group`` (not of the world, in a subgroup).
        rank_of = {d: r for r, d in enumerate(devices)}
        me = devices[rank]
        self._ranks = (rank, world, rank_of)
        compute = next((t.device for t in source.values()), torch.device("cpu"))
        if dist.get_backend(group) == "nccl" and compute.type != "cuda":
            compute = torch.device("cuda", torch.cuda.current_device())
        self.compute = compute
        # Times this rank bound the plan to its tensors again because one
        # had moved (see __call__).
        self.rebinds = 0

        error = None
        prog = None
        try:
            prog = _tenplan.program(plan, me, _ALONE_MIN_BYTES)
            self._prog = prog
            self._messages = {int(k): v for k, v in prog["messages"].items()}
            # The tensors as given (a DTensor, a parameter): their memory is
            # looked up again at each call, so that a tensor whose memory
            # moved since (``p.data = ...``, an offload and reload) is
            # followed rather than read or written where it was.
            self._given_source = []
            for spec in prog["source"]:
                t = source.get(spec["name"])
                if t is None:
                    raise _tenplan.LayoutError(f"tensor `{spec['name']}`: the plan's source layout has it on device {me}, the given state does not")
                self._given_source.append(t)
            peers = {t["peer"] for s in prog["steps"] for t in s["sends"] + s["recvs"]}
            missing = sorted(p for p in peers if p not in rank_of)
            if missing:
                raise _tenplan.LayoutError(f"the plan sends to or from devices {missing}, which no rank of the group is")
            specs = [(s["len"], DTYPES[s["dtype"]]) for s in prog["target"]]
            self._given_target: Optional[List[torch.Tensor]] = None
            if out is None:
                self.target = _zeroed(specs, compute)
            else:
                self._given_target = []
                for spec in prog["target"]:
                    t = out.get(spec["name"])
                    if t is None:
                        raise _tenplan.LayoutError(f"tensor `{spec['name']}`: the plan's target layout has it on device {me}, `out` does not")
                    self._given_target.append(t)
            # The tensors whose memory each call looks up.
            self._watched = self._given_source + (self._given_target or [])
            # Every staging tensor (receive buffers, packed payloads, gathered
            # messages) is a view of one arena made here, so that the calls
            # touch memory that is already there: fresh buffers at each call
            # cost more in page faults than their copies. A round's tensors
            # live until the round ends (the program releases them by then) and
            # the next round reuses the space, so the arena is the largest
            # round's staging, as the plan's memory budget has it.
            self._arena = _zeroed([(_staging_bound(prog, self._messages), torch.uint8)], compute)[0]
            self._bind()
        except TenplanError as e:
            error, prog = str(e), None
        _agree(error, group)
        # Seconds spent in each part of the last call, on this rank.
        self.timings: Dict[str, float] = {}

    @_collector_paused()
    def _bind(self) -> None:
        """Bind the program to the given tensors' memory as it is now: the
        source buffers (made contiguous or converted at each call where
        needed), the target buffers, and every step's copies between views
        of them and of the arena (on CPU, compiled). Raises LayoutError
        for a tensor that does not fit the plan or whose memory was freed."""
        prog, messages, compute = self._prog, self._messages, self.compute
        rank, world, rank_of = self._ranks
        buffers: List[torch.Tensor] = []
        refresh: List[Tuple[torch.Tensor, torch.Tensor]] = []
        for spec, given in zip(prog["source"], self._given_source):
            t = _in_memory(spec["name"], _local(given))
            want = DTYPES.get(spec["dtype"])
            if t.numel() != spec["len"]:
                raise _tenplan.LayoutError(
                    f"tensor `{spec['name']}`: given {t.dtype} with {t.numel()} elements, the plan's source layout says "
                    f"{spec['dtype']} with {spec['len']} (a plan for another layout?)"
                )
            if t.dtype != want:
                if not (self._convert and t.dtype.is_floating_point and want.is_floating_point):
                    lossy = t.dtype.itemsize > want.itemsize or {t.dtype, want} == {torch.float16, torch.bfloat16}
                    raise _tenplan.LayoutError(
                        f"tensor `{spec['name']}`: given {t.dtype}, the plan sends {spec['dtype']}"
                        + (
                            f" (pass convert=True to convert it at each call{', which rounds' if lossy else ''})"
                            if t.dtype.is_floating_point and want.is_floating_point
                            else " (floating-point types convert, this does not)"
                        )
                    )
                # Converted at each call, before anything is sent.
                flat = torch.empty(t.numel(), dtype=want, device=t.device)
                refresh.append((flat, t))
            else:
                flat = t.contiguous().view(-1)
                if not t.is_contiguous():
                    refresh.append((flat, t))
            buffers.append(flat)
        if self._given_target is not None:
            target = []
            for spec, given in zip(prog["target"], self._given_target):
                n, dtype = spec["len"], DTYPES[spec["dtype"]]
                t = _in_memory(spec["name"], _local(given))
                if t.dtype != dtype or t.numel() != n or not t.is_contiguous() or t.device != compute:
                    raise _tenplan.LayoutError(
                        f"tensor `{spec['name']}`: `out` gives {t.dtype} with {t.numel()} elements on {t.device}"
                        f"{'' if t.is_contiguous() else ', not contiguous'}; the plan's target layout needs a contiguous "
                        f"{spec['dtype']} with {n} on {compute}"
                    )
                target.append(t.view(-1))
            _refuse_aliases([s["name"] for s in prog["source"]], buffers, [s["name"] for s in prog["target"]], target)
        else:
            target = self.target

        # Buffers that reduce-copies add into (most start from zero at
        # each call: _zeroed_each_call).
        writes = [w for s in prog["steps"] for w in s["writes"] + [w for l in s["local"] for w in l["writes"]]]
        reduced = sorted({w["target"]["buffer"] for w in writes if w["reduce"]})
        overwritten = {w["target"]["buffer"] for w in writes if not w["reduce"]}
        # Tied buffers both written with plain copies carry the same
        # values; sums would be added into their memory once per name.
        summed = set(reduced)
        tied = _sharing_memory(target) if self._given_target is not None and summed else []
        for i, j in (p for p in tied if summed.intersection(p)):
            a, b = sorted((prog["target"][i]["name"], prog["target"][j]["name"]))
            raise _tenplan.LayoutError(
                f"tensors `{a}` and `{b}`: their `out` buffers share memory and {'both are' if i in summed and j in summed else 'one is'} "
                "a sum of partial addends, which would be added into that memory once per name; give each its own buffer"
            )
        steps = _bind_steps(prog, messages, buffers, target, self._arena, rank, world, rank_of)
        zero = [target[b] for b in _zeroed_each_call(steps, reduced, overwritten, target)]
        memory = buffers + target + [self._arena]
        if _NATIVE_COPIES and all(t.device.type == "cpu" for t in memory):
            spans = [(t, t.data_ptr(), t.numel() * t.element_size()) for t in memory]
            in_source = _address_lookup(spans[: len(buffers)])
            threads = torch.get_num_threads()
            for b in steps:
                # Every copy of the step that reads the source (its
                # local copies', packs' and gathers') as one set, in
                # the order of the source's bytes; what reads staged
                # bytes runs after it, in its order.
                fused: List[Tuple[torch.Tensor, torch.Tensor]] = []
                b.local = _native(_take_from_source(b.local, in_source, fused), spans, threads)
                b.sends = [(peer, payload, _native(_take_from_source(pack, in_source, fused), spans, threads)) for peer, payload, pack in b.sends]
                b.gathers = _native(_take_from_source(b.gathers, in_source, fused), spans, threads)
                b.first = _native([([d for d, _ in fused], [s for _, s in fused], False)], spans, threads) if fused else []
                b.writes = _native(b.writes, spans, threads, _TARGET_STREAMING_BYTES)
                b.recvs = [(peer, buf, _native(unpack, spans, threads, _TARGET_STREAMING_BYTES)) for peer, buf, unpack in b.recvs]
        # Bound in full: only now replace what the calls use.
        self.buffers, self._refresh, self.target = buffers, refresh, target
        self._steps, self._zero = steps, zero
        self._bound_to = _memory_of(self._watched)
        # What a call returns: each target buffer shaped like its tensor's
        # box where it is one piece (a view each, made once: 16,000 of them
        # took 0.15 s, half a call of small tensors).
        self._result = {s["name"]: (t.view(s["shape"]) if s["shape"] is not None else t) for s, t in zip(prog["target"], target)}
        self.copied_bytes = sum(
            _copies_bytes(c)
            for b in steps
            for c in [b.first, b.local, b.gathers, b.writes, *(p for _, _, p in b.sends), *(u for _, _, u in b.recvs)]
        )

    def __call__(self) -> Dict[str, torch.Tensor]:
        group, timeout = self.group, self.timeout
        clock = time.perf_counter
        spent = dict.fromkeys(("bind", "refresh", "local", "pack", "post", "transport", "write", "agree"), 0.0)
        start = last = clock()

        def lap(part: str) -> None:
            nonlocal last
            now = clock()
            spent[part] += now - last
            last = now

        # A tensor whose memory moved since the plan was bound is bound
        # again here; one freed is refused. Every rank agrees before any
        # byte moves, so that no rank reads freed memory, waits on a rank
        # that gave up, or leaves `out` half written.
        error = None
        if _memory_of(self._watched) != self._bound_to:
            try:
                self._bind()
                self.rebinds += 1
            except TenplanError as e:
                error = str(e)
        _agree(error, group)
        lap("bind")
        for flat, t in self._refresh:
            flat.view(t.shape).copy_(t)
        for t in self._zero:
            t.zero_()
        lap("refresh")
        # gloo serves each send and receive on its own: this rank posts its
        # receives, packs (on CPU, one pass over the source), sends each
        # payload as soon as it is packed, and writes each transfer as it
        # arrives; NCCL gets each step's operations as one group
        # (batch_isend_irecv), which it needs to match them.
        pipelined = dist.get_backend(group) != "nccl" and not _GROUPED_P2P
        error = None
        try:
            for step in self._steps:
                if pipelined:
                    pending = [dist.irecv(buf, group=group, group_src=peer) for peer, buf, _ in step.recvs]
                    lap("post")
                    _run(step.first)
                    lap("pack")
                    _run(step.local)
                    lap("local")
                    sent = []
                    for peer, payload, pack in step.sends:
                        _run(pack)
                        lap("pack")
                        sent.append(dist.isend(payload, group=group, group_dst=peer))
                        lap("post")
                    _run(step.gathers)
                    lap("pack")
                    for req, (_, _, unpack) in zip(pending, step.recvs):
                        req.wait(timeout)
                        lap("transport")
                        _run(unpack)
                        lap("write")
                    for req in sent:
                        req.wait(timeout)
                    lap("transport")
                else:
                    _run(step.first)
                    _run(step.local)
                    lap("local")
                    for _, _, pack in step.sends:
                        _run(pack)
                    _run(step.gathers)
                    lap("pack")
                    ops = [dist.P2POp(dist.irecv, buf, group=group, group_peer=peer) for peer, buf, _ in step.recvs]
                    ops += [dist.P2POp(dist.isend, payload, group=group, group_peer=peer) for peer, payload, _ in step.sends]
                    reqs = dist.batch_isend_irecv(ops) if ops else []
                    lap("post")
                    for req in reqs:
                        req.wait(timeout)
                    lap("transport")
                    for _, _, unpack in step.recvs:
                        _run(unpack)
                    lap("write")
                _run(step.writes)
                lap("write")
        except Exception as e:  # a dead peer, a timeout, a transport error
            error = f"{type(e).__name__}: {e}"
        _agree(error, group)
        if self.compute.type == "cuda":
            torch.cuda.synchronize(self.compute)
        lap("agree")
        spent["total"] = last - start
        self.timings = spent
        # A dict of its own for each call; the views are made once a binding.
        return dict(self._result)


# Copies run as groups, in order: (destinations, sources, reduce), or on
# CPU one compiled set of plain copies (see _native).
Copies = List[Union[Tuple[List[torch.Tensor], List[torch.Tensor], bool], _tenplan.HostCopies]]


def _batched(copies: List[Tuple[torch.Tensor, torch.Tensor, bool]]) -> Copies:
    """Copies that do not depend on one another as few calls: plain copies
    grouped by dtype, one ``torch._foreach_copy_`` each (on a GPU, a few
    launches instead of one per piece; the checker proved that no two
    copies write the same byte); with a reduce-copy among them, each copy
    on its own, in order."""
    if any(r for _, _, r in copies) or not _FOREACH_COPY:
        return [([d], [s], r) for d, s, r in copies]
    by_dtype: Dict[torch.dtype, Tuple[List[torch.Tensor], List[torch.Tensor], bool]] = {}
    for dst, src, _ in copies:
        d, s, _ = by_dtype.setdefault(dst.dtype, ([], [], False))
        d.append(dst)
        s.append(src)
    return list(by_dtype.values())


def _native(copies: Copies, memory: List[Tuple[torch.Tensor, int, int]], threads: int, streaming_min_bytes: Optional[int] = None) -> Copies:
    """On CPU, each group of plain copies as one ``_tenplan.HostCopies``:
    compiled once into ``memcpy``s of their contiguous runs, run with the
    GIL released. A box of a row-major piece is rows of a few hundred
    bytes to a few KiB, which torch's strided ``copy_`` moves at about half
    a contiguous copy's rate; ``memory`` is every tensor the views lie in
    (checked there). Reduce-copies stay torch's ``add_``. Sets of at least
    ``streaming_min_bytes`` write past the cache (None: the library's
    16 MiB; packs are sent at once and read faster from the cache, while
    a target's bytes are read by the job only later)."""
    out: Copies = []
    for dsts, srcs, reduce in copies:
        if reduce or not all(_plain(d, s) for d, s in zip(dsts, srcs)):
            out.append((dsts, srcs, reduce))
            continue
        specs = [
            (
                d.data_ptr(),
                s.data_ptr(),
                list(d.shape),
                [x * d.element_size() for x in d.stride()],
                [x * s.element_size() for x in s.stride()],
                d.element_size(),
            )
            for d, s in zip(dsts, srcs)
        ]
        out.append(_tenplan.HostCopies(memory, specs, threads, streaming_min_bytes))
    return out


def _refuse_aliases(source_names, sources, target_names, targets) -> None:
    """Refuse ``out`` buffers that share memory with a source buffer: the
    copies read the source while they write the target, in an order of
    their own, so the source would be read after it was overwritten and
    the result silently wrong. Targets may share memory with one another
    (tied weights; Megatron's fp32 optimizer state, a view of its
    parameter) as their sources do: both writes carry the same values."""
    spans = sorted(
        (*_span(t), is_target, name)
        for is_target, names, tensors in ((False, source_names, sources), (True, target_names, targets))
        for name, t in zip(names, tensors)
        if t.numel()
    )
    # Sweep by start, keeping the furthest-reaching source and target seen:
    # a span that starts before the other kind's ends overlaps it.
    reach: List[Optional[tuple]] = [None, None]
    for span in spans:
        start, end, is_target, _ = span
        other = reach[not is_target]
        if other is not None and start < other[1]:
            source, target = (other, span) if is_target else (span, other)
            raise _tenplan.LayoutError(
                f"tensor `{target[3]}`: its `out` buffer shares memory with the source buffer of `{source[3]}`; "
                "a reshard cannot write into the memory it reads"
            )
        if reach[is_target] is None or end > reach[is_target][1]:
            reach[is_target] = span


def _address_lookup(spans: List[Tuple[torch.Tensor, int, int]]):
    """Whether an address lies in one of ``spans`` (tensor, address,
    bytes): a bisection over their starts, made once per prepared plan.
    Overlapping spans (views of one storage) are merged first, so an
    address inside a view that starts below another's end is found."""
    ranges: List[List[int]] = []
    for a, end in sorted((a, a + n) for _, a, n in spans if n > 0):
        if ranges and a <= ranges[-1][1]:
            ranges[-1][1] = max(ranges[-1][1], end)
        else:
            ranges.append([a, end])
    starts = [a for a, _ in ranges]

    def inside(at: int) -> bool:
        i = bisect.bisect_right(starts, at) - 1
        return i >= 0 and at < ranges[i][1]

    return inside


def _plain(d: torch.Tensor, s: torch.Tensor) -> bool:
    """A copy ``HostCopies`` can make: same element type and shape."""
    return d.dtype == s.dtype and d.shape == s.shape


def _take_from_source(copies: Copies, in_source, into: List[Tuple[torch.Tensor, torch.Tensor]]) -> Copies:
    """Move the plain copies that read a source buffer (``in_source``: of
    an address, see :func:`_address_lookup`) from ``copies`` to ``into``;
    what is left, in order. Nothing writes the source during a call, so
    these copies depend on no other and may run first."""
    rest: Copies = []
    for c in copies:
        if isinstance(c, _tenplan.HostCopies) or c[2]:
            rest.append(c)
            continue
        dsts, srcs = [], []
        for d, s in zip(c[0], c[1]):
            if _plain(d, s) and in_source(s.data_ptr()):
                into.append((d, s))
            else:
                dsts.append(d)
                srcs.append(s)
        if dsts:
            rest.append((dsts, srcs, False))
    return rest


def _copies_bytes(copies: Copies) -> int:
    return sum(c.bytes if isinstance(c, _tenplan.HostCopies) else sum(d.numel() * d.element_size() for d in c[0]) for c in copies)


def _run(copies: Copies) -> None:
    for c in copies:
        if isinstance(c, _tenplan.HostCopies):
            c.run()
            continue
        dsts, srcs, reduce = c
        if reduce:
            dsts[0].add_(srcs[0])
        elif len(dsts) == 1:
            dsts[0].copy_(srcs[0])
        else:
            torch._foreach_copy_(dsts, srcs)


def _zeroed_each_call(steps: List["_Step"], reduced: List[int], overwritten: Set[int], target: List[torch.Tensor]) -> List[int]:
    """Which of the target buffers that reduce-copies add into (``reduced``)
    start from zero at each call. Where the call's first copy into one adds
    this rank's own addend over the whole buffer (a reduce-scatter's local
    share), that copy (in ``steps``' first step, changed here) becomes a
    plain one and the buffer is not zeroed: one pass over it fewer, and the
    sum is the addends' own (0 + -0.0 would be +0.0). Only the first
    step's local copies run before anything arrives. A buffer that some
    copy also overwrites (``overwritten``: such a copy may run earlier,
    fused over the source, or be received straight into it) stays zeroed.
    No other target buffer shares memory with these (refused before)."""
    if not steps or not reduced:
        return reduced
    candidates = sorted((*_span(target[b]), b) for b in reduced if target[b].numel() and b not in overwritten)
    starts = [c[0] for c in candidates]
    first: Dict[int, Optional[int]] = {}  # buffer -> the copy that may become plain (None: stays zeroed)
    local = steps[0].local
    for k, (dsts, _, reduce) in enumerate(local):
        for dst in dsts:
            j = bisect.bisect_right(starts, dst.data_ptr()) - 1
            if j < 0 or dst.data_ptr() >= candidates[j][1]:
                continue
            buf = candidates[j][2]
            whole = reduce and len(dsts) == 1 and dst.data_ptr() == starts[j] and dst.numel() == target[buf].numel() and dst.is_contiguous()
            if buf not in first:
                first[buf] = k if whole else None
    for k in first.values():
        if k is not None:
            dsts, srcs, _ = local[k]
            local[k] = (dsts, srcs, False)
    return [b for b in reduced if first.get(b) is None]


def _span(t: torch.Tensor) -> Tuple[int, int]:
    """The addresses a tensor's elements lie between (start, end)."""
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def _sharing_memory(tensors: List[torch.Tensor]) -> List[Tuple[int, int]]:
    """Pairs of indices of ``tensors`` whose memory overlaps; every tensor
    that shares memory with another is in at least one pair."""
    pairs = []
    last_end, last = -1, -1
    for start, end, i in sorted((*_span(t), i) for i, t in enumerate(tensors) if t.numel()):
        if start < last_end:
            pairs.append((last, i))
        if end > last_end:
            last_end, last = end, i
    return pairs


def _message_bytes(msg: dict) -> int:
    return math.prod(msg["shape"]) * DTYPES[msg["dtype"]].itemsize


_ALIGN = 64


def _staging_bound(prog: dict, messages: Dict[int, dict]) -> int:
    """Bytes of staging the largest round can take (an upper bound: every
    transfer packed, every gathered message staged twice, aligned)."""
    rounds: Dict[int, int] = {}
    for s in prog["steps"]:
        n = sum(t["bytes"] + _ALIGN * (1 + len(t["messages"])) for t in s["recvs"] + s["sends"])
        n += sum(2 * (_message_bytes(messages[g["message"]]) + _ALIGN) for g in s["gathers"])
        n += sum(_message_bytes(messages[m]) + _ALIGN for t in s["recvs"] + s["sends"] for m in t["messages"])
        rounds[s["round"]] = rounds.get(s["round"], 0) + n
    return max(rounds.values(), default=0)


class _Step:
    """One step of a program, bound to tensors: its copies from the
    source gathered into one set (CPU only, see ``PreparedPlan``); its local copies; its
    sends (peer rank, payload, the copies that pack it); its receives
    (peer rank, buffer, the copies that unpack and write it); the gathers
    of messages it writes but does not send; the writes of messages that
    arrived earlier."""

    __slots__ = ("first", "local", "sends", "recvs", "gathers", "writes")

    def __init__(self):
        # On CPU: every copy that reads the source, run before the rest.
        self.first: Copies = []
        self.local: Copies = []
        self.sends: List[Tuple[int, torch.Tensor, Copies]] = []
        self.recvs: List[Tuple[int, torch.Tensor, Copies]] = []
        self.gathers: Copies = []
        self.writes: Copies = []


def _bind_steps(prog, messages, buffers, target, arena, rank, world, rank_of) -> List[_Step]:
    """Every step of a program as copies between views made once: of the
    source and target buffers and of ``arena``, where each round's staging
    tensors are placed one after another."""

    def as_bytes(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(-1).view(torch.uint8)

    bound: List[_Step] = []
    data: Dict[int, torch.Tensor] = {}  # each staged message's tensor in this round
    round_, at = None, 0

    def region(nbytes: int) -> torch.Tensor:
        nonlocal at
        start = -(-at // _ALIGN) * _ALIGN
        at = start + nbytes
        if at > arena.numel():
            raise _tenplan.LayoutError(f"staging exceeds its bound ({at} > {arena.numel()} bytes)")
        return arena[start:at]

    def typed(raw: torch.Tensor, msg: dict) -> torch.Tensor:
        return raw.view(DTYPES[msg["dtype"]]).view(msg["shape"])

    def gather(g: dict, into: Optional[torch.Tensor], copies: list) -> torch.Tensor:
        """The copies that gather a message into ``into`` (a fresh region
        when None; a message one piece holds whole is that piece's view)."""
        msg = messages[g["message"]]
        parts = g["parts"]
        if into is None:
            if len(parts) == 1:
                return _view(buffers, parts[0][0])
            into = typed(region(_message_bytes(msg)), msg)
        for box, at_ in parts:
            src = _view(buffers, box)
            copies.append((into[tuple(slice(a, a + n) for a, n in zip(at_, src.shape))], src, False))
        return into

    for step in prog["steps"]:
        if step["round"] != round_:
            round_, at = step["round"], 0
            data.clear()
        b = _Step()
        local = []
        for lc in step["local"]:
            msg = messages[lc["gather"]["message"]]
            parts = lc["gather"]["parts"]
            gathers: list = []
            if len(parts) == 1:
                src = _view(buffers, parts[0][0])
            else:
                src = gather(lc["gather"], typed(region(_message_bytes(msg)), msg), gathers)
            local.append((gathers, [(dst, src.view(dst.shape), bool(w["reduce"])) for w in lc["writes"] for dst in [_view(target, w["target"])]]))
        # Gathers first, then writes (each phase batched); a step's local
        # copies need no staging beyond the step, but take it from the
        # round's arena like the rest.
        b.local = _batched([c for g, _ in local for c in g]) + _batched([c for _, w in local for c in w])
        originated = {g["message"]: g for g in step["gathers"]}
        # gloo: an all-to-all in rounds; this rank sends to rank + 1, + 2,
        # ... and waits on rank - 1, - 2, ..., so at any moment each rank is
        # mostly fed by one peer rather than all at once.
        for t in sorted(step["sends"], key=lambda t: (rank_of[t["peer"]] - rank) % world):
            ms = t["messages"]
            typed_copies: list = []
            byte_copies: list = []
            if len(ms) == 1 and (ms[0] in data or ms[0] in originated):
                m = ms[0]
                if m not in data:
                    data[m] = gather(originated[m], None, typed_copies)
                src = data[m]
                if src.is_contiguous():
                    payload = as_bytes(src)
                else:
                    payload = region(t["bytes"])
                    typed_copies.append((typed(payload, messages[m]), src, False))
            else:
                payload = region(t["bytes"])
                off = 0
                for m in ms:
                    msg = messages[m]
                    n = _message_bytes(msg)
                    aligned = off % DTYPES[msg["dtype"]].itemsize == 0
                    if aligned:
                        place = typed(payload[off : off + n], msg)
                        if m in data:
                            typed_copies.append((place, data[m], False))
                        else:
                            data[m] = gather(originated[m], place, typed_copies)
                    else:
                        # A misaligned place cannot be viewed as the
                        # message's type: stage it aligned, copy its bytes.
                        if m not in data or not data[m].is_contiguous():
                            into = typed(region(n), msg)
                            if m in data:
                                typed_copies.append((into, data[m], False))
                            else:
                                gather(originated[m], into, typed_copies)
                            data[m] = into
                        byte_copies.append((payload[off : off + n], as_bytes(data[m]), False))
                    off += n
            b.sends.append((rank_of[t["peer"]], payload, _batched(typed_copies) + _batched(byte_copies)))
        gathers = []
        for m, g in originated.items():
            if m not in data:  # gathered for a local write only
                data[m] = gather(g, None, gathers)
        b.gathers = _batched(gathers)
        writes: Dict[int, List[dict]] = {}
        for w in step["writes"]:
            writes.setdefault(w["message"], []).append(w)

        def write_copies(m: int) -> list:
            out = []
            for w in writes.pop(m, ()):
                dst = _view(target, w["target"])
                out.append((dst, data[m].view(dst.shape), bool(w["reduce"])))
            return out

        for t in sorted(step["recvs"], key=lambda t: (rank - rank_of[t["peer"]]) % world):
            ms = t["messages"]
            if len(ms) == 1 and len(writes.get(ms[0], ())) == 1 and not writes[ms[0]][0]["reduce"]:
                # Straight into the one place it overwrites, when that is
                # one contiguous range (what the program sends alone for).
                dst = _view(target, writes[ms[0]][0]["target"])
                if dst.is_contiguous():
                    del writes[ms[0]]
                    data[ms[0]] = dst
                    b.recvs.append((rank_of[t["peer"]], as_bytes(dst), []))
                    continue
            buf = region(t["bytes"])
            fixups, copies = [], []
            off = 0
            for m in t["messages"]:
                msg = messages[m]
                n = _message_bytes(msg)
                if off % DTYPES[msg["dtype"]].itemsize == 0:
                    data[m] = typed(buf[off : off + n], msg)
                else:
                    data[m] = typed(region(n), msg)
                    fixups.append((as_bytes(data[m]), buf[off : off + n], False))
                copies += write_copies(m)
                off += n
            b.recvs.append((rank_of[t["peer"]], buf, _batched(fixups) + _batched(copies)))
        late = []
        for m in list(writes):
            if m not in data:
                raise _tenplan.LayoutError(f"message {m} is written before this device receives or gathers it")
            late += write_copies(m)
        b.writes = _batched(late)
        bound.append(b)
    return bound


def prepare(
    plan: Plan,
    source: Mapping[str, torch.Tensor],
    *,
    group: Optional[dist.ProcessGroup] = None,
    devices: Optional[Sequence[int]] = None,
    out: Optional[Mapping[str, torch.Tensor]] = None,
    timeout: datetime.timedelta = datetime.timedelta(seconds=60),
    convert: bool = False,
) -> PreparedPlan:
    """Check a plan and bind it to this rank's tensors once, for calls that
    perform it again and again (:class:`PreparedPlan`). Every rank of
    ``group`` calls it with the same plan. ``source`` is as for
    :func:`execute`; ``out`` maps the names of this rank's target buffers to
    contiguous tensors to write into (an inference engine's own weights,
    say; bytes no piece covers, such as padding, are left as they are; none
    may share memory with the source), else fresh zeroed ones are
    allocated. ``convert=True`` accepts source tensors
    of another floating-point type than the plan's and converts them at each
    call (a narrowing, such as fp32 to bf16, only when asked like this). A
    rejected plan raises
    ``PlanRejected``, a mismatched tensor ``LayoutError``, on every rank."""
    return PreparedPlan(
        plan,
        _flat_tensors(source),
        group=group,
        devices=devices,
        out=None if out is None else _flat_tensors(out),
        timeout=timeout,
        convert=convert,
    )


def execute(
    plan: Plan,
    source: Mapping[str, torch.Tensor],
    *,
    group: Optional[dist.ProcessGroup] = None,
    devices: Optional[Sequence[int]] = None,
    timeout: datetime.timedelta = datetime.timedelta(seconds=60),
) -> Dict[str, torch.Tensor]:
    """Perform a plan on this rank's tensors; every rank of ``group`` calls
    it with the same plan. ``source`` maps the names of this rank's source
    buffers (for layouts from :func:`layout_from_state_dict`, the tensor
    names) to its tensors (DTensors give their local shard); ``devices[r]``
    is the plan's device of the group's rank ``r`` (default ``r``; in a
    subgroup, its own ranks, not the world's). Returns this rank's
    target buffers by name, shaped like their tensor's box where a buffer is
    one piece, else flat. The plan is checked by the independent checker
    first: a rejected plan raises ``PlanRejected`` on every rank. To perform
    one plan many times, :func:`prepare` it once."""
    return prepare(plan, source, group=group, devices=devices, timeout=timeout)()


def reshard(
    state_dict: Mapping,
    target: Optional[Layout] = None,
    *,
    out: Optional[Mapping] = None,
    planner: str = "lp",
    cluster: Optional[_tenplan.Cluster] = None,
    group: Optional[dist.ProcessGroup] = None,
    devices: Optional[Sequence[int]] = None,
    timeout: datetime.timedelta = datetime.timedelta(seconds=60),
) -> dict:
    """Move a state dict held across a process group to the ``target``
    layout: gather the source layout, plan (the same plan on every rank),
    verify, and :func:`execute`. ``cluster`` defaults to enough DGX-H100
    nodes for the group's devices (:func:`tenplan.default_cluster`).

    The state dict is taken as it comes (see the module's documentation):
    nested, with 0-d tensors and values that are not tensors (checked equal
    on every rank first). With ``out`` (the state dict of the job on the
    new layout, as ``get_state_dict`` gives it: DTensors on its mesh), the
    state is written into ``out``'s tensors in place, ``target`` defaults to
    ``out``'s layout, and ``out`` is returned with the source's values that
    are not tensors, ready for ``set_state_dict(model, optim,
    model_state_dict=r["model"], optim_state_dict=r["optim"])``. Without it,
    the result has the source's nesting, each tensor as the target holds it
    on this rank. A target that lacks a tensor of the state, holds another,
    or gives one another shape or element type is refused naming it, on
    every rank."""
    tensors, others, paths = flatten(state_dict)
    _collective(lambda: _agree_values(others, group), group)
    scalars = {k for k, t in tensors.items() if t.dim() == 0}
    out_tensors = None
    if out is not None:
        out_tensors, _, _ = flatten(out)
        if target is None:
            target = layout_from_state_dict(out_tensors, group, devices)
    if target is None:
        raise _tenplan.LayoutError("reshard needs a target layout, or `out` to take it from")
    source = layout_from_state_dict(tensors, group, devices)
    n = max(max(source.devices()), max(target.devices())) + 1
    cluster = cluster or _tenplan.default_cluster(n)
    p = _tenplan.plan(_tenplan.Problem(source, target, cluster), planner)
    if out_tensors is not None:
        # Straight into the new job's tensors (their local shards).
        local = {k: _local(v) for k, v in out_tensors.items()}
        prepare(p, tensors, group=group, devices=devices, out=local, timeout=timeout)()
        result = dict(out) if not isinstance(out, dict) else out
        flat_out, _, out_paths = flatten(result)
        flat_out.update(others)
        return unflatten(flat_out, {**out_paths, **{k: paths[k] for k in others}})
    moved = execute(p, tensors, group=group, devices=devices, timeout=timeout)
    flat = {k: (v.reshape(()) if k in scalars else v) for k, v in moved.items()}
    flat.update(others)
    return unflatten(flat, {k: v for k, v in paths.items() if k in flat})
