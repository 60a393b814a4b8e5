"""Type stubs of the compiled module (PyO3)."""

from os import PathLike
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union, final

from typing_extensions import Self

_Path = Union[str, PathLike]

__all__ = [
    "Model",
    "Layout",
    "Cluster",
    "Problem",
    "Plan",
    "DatasetState",
    "HostCopies",
    "plan",
    "verify",
    "lower_bound",
    "simulate",
    "evaluate",
    "cost",
    "switch_schedule",
    "reshard",
    "import_hf",
    "check",
    "export",
    "diff",
    "sync",
    "program",
    "planners",
    "default_cluster",
    "TenplanError",
    "LayoutError",
    "InfeasibleError",
    "PlanRejected",
    "SolverError",
    "CheckpointError",
]


class TenplanError(Exception):
    """Base class of every error tenplan raises."""

class LayoutError(TenplanError):
    """A model, layout, cluster or problem that is invalid or does not fit."""

class InfeasibleError(TenplanError):
    """No plan exists: some target state has no live source."""
    missing: List[Dict[str, Any]]
    """Each missing box: {"tensor": str, "box": [[lo, hi], ...], "dead_holders": [int, ...]}."""

class PlanRejected(TenplanError):
    """The independent checker rejected a plan; nothing was performed."""
    verdict: str

class SolverError(TenplanError):
    """The LP solver failed, or the problem is too large for this machine's memory."""

class CheckpointError(TenplanError):
    """A checkpoint that cannot be read, written or checked."""

@final
class Model:
    """A model: by catalog name, or from a Hugging Face config.json (file or directory)."""
    def __new__(cls, model: str) -> Self: ...
    @property
    def name(self) -> str: ...
    def parameters(self) -> int: ...
    def layout(self, config: str, state: str = "training") -> Layout:
        """The layout of the model's state under a parallel configuration
        ("tp=4,pp=2,dp=2,zero=1"; keys tp, pp, dp, ep, zero, devices=A-B,
        split=A:B:..). state: training, weights, weights:DTYPE, weights+grads."""
    def serving_layout(self, config: str, state: str = "weights") -> Layout:
        """The weights as inference engines serve them ("tp=4,dp=2,devices=8-15":
        tp ranks per engine, dp replicas; per-rank [q; k; v], kv heads
        replicated when tp exceeds them): the target of a weight sync."""
    def hf_config(self) -> Dict[str, Any]: ...

@final
class Layout:
    """Tensors, and shards of buffers holding pieces of them, on devices. Valid by construction."""
    @staticmethod
    def from_json(text: str) -> Layout: ...
    @staticmethod
    def from_descriptions(
        descriptions: Sequence[Sequence[Mapping[str, Any]]],
        devices: Optional[Sequence[int]] = None,
        order: Optional[Sequence[str]] = None,
    ) -> Layout:
        """The layout of a group whose rank r holds descriptions[r] (dicts of name, dtype, shape, box, buffer, partial) on devices[r]."""
    @staticmethod
    def from_gathered(
        headers: Sequence[Sequence[Tuple[str, str, Sequence[int], Optional[str], bool]]],
        ranks: Sequence[Tuple[int, bytes]],
        devices: Optional[Sequence[int]] = None,
        order: Optional[Sequence[str]] = None,
    ) -> Layout:
        """The same from distinct headers (name, dtype, shape, buffer, partial) and each rank's (header, native u64 box bounds)."""
    def to_json(self) -> str: ...
    def devices(self) -> List[int]: ...
    def tensors(self) -> List[Dict[str, Any]]: ...
    def shard(self, device: int) -> Optional[Dict[str, Any]]: ...
    def device_bytes(self, device: int) -> int: ...

@final
class Cluster:
    """NODESxGPUS, a preset (dgx-h100:N, dgx-h100-rail:N, dgx-h100-rail-2to1:N, gb200-nvl72:N, ...) or a topology file."""
    def __new__(cls, spec: str) -> Self: ...
    @property
    def name(self) -> str: ...
    @property
    def nodes(self) -> int: ...
    @property
    def gpus_per_node(self) -> int: ...
    @property
    def num_devices(self) -> int: ...
    def with_dead(self, dead: List[int]) -> Cluster: ...
    def summary(self) -> str: ...

@final
class Problem:
    """A source layout, a target layout, a cluster; where multicasts may forward."""
    def __new__(cls, source: Layout, target: Layout, cluster: Cluster, forwarding: str = "node") -> Self: ...
    @property
    def forwarding(self) -> str: ...
    @staticmethod
    def from_json(text: str) -> Problem: ...
    def to_json(self) -> str: ...
    @property
    def source(self) -> Layout: ...
    @property
    def target(self) -> Layout: ...
    @property
    def cluster(self) -> Cluster: ...

@final
class Plan:
    """Copies and zero-fills with their problem; proves nothing until verify accepts it."""
    @staticmethod
    def from_json(text: str) -> Plan: ...
    def to_json(self) -> str: ...
    @property
    def planner(self) -> str: ...
    @property
    def problem(self) -> Problem: ...
    def copies(self) -> List[Dict[str, Any]]: ...
    def __len__(self) -> int: ...

@final
class DatasetState:
    """Seed of the global sample order, samples consumed, global batch: the same global batches whatever dp is."""
    def __new__(cls, dataset_size: int, global_batch: int, *, seed: int = 0, consumed: int = 0) -> Self: ...
    @property
    def consumed(self) -> int: ...
    @property
    def global_batch(self) -> int: ...
    def samples(self, dp: int, rank: int) -> List[int]: ...
    def global_batches(self, steps: int) -> List[List[int]]: ...
    def advance(self, steps: int = 1) -> DatasetState: ...
    def to_json(self) -> str: ...
    @staticmethod
    def from_json(text: str) -> DatasetState: ...

@final
class HostCopies:
    """Independent copies between strided views of CPU tensors, compiled once into memcpys (the torch executor's packs and writes)."""
    def __new__(
        cls,
        memory: List[Tuple[Any, int, int]],
        copies: List[Tuple[int, int, List[int], List[int], List[int], int]],
        threads: int = 1,
        streaming_min_bytes: Optional[int] = None,
    ) -> Self: ...
    def run(self) -> None: ...
    @property
    def bytes(self) -> int: ...
    def __len__(self) -> int: ...

def planners() -> List[str]: ...
def default_cluster(devices: int) -> Cluster: ...
def plan(
    problem: Problem,
    planner: str = "lp",
    *,
    threads: int = 1,
    time_limit: Optional[float] = None,
    placement: str = "fixed",
    multicast: bool = True,
    staging_budget: Optional[int] = None,
) -> Plan: ...
def verify(plan: Plan) -> str: ...
def lower_bound(problem: Problem) -> Tuple[float, str]: ...
def simulate(plan: Plan) -> float: ...
def evaluate(plan: Plan) -> Dict[str, Any]: ...
def cost(
    model: Model,
    source: str,
    target: str,
    cluster: Cluster,
    *,
    state: str = "training",
    planner: str = "lp",
    dead: Optional[List[int]] = None,
    bound_only: bool = False,
) -> Dict[str, Any]:
    """What moving a job costs (makespan_s, lower_bound_s, bytes_cross_node, ...); cached by the question.
    With ``bound_only=True``, the certified lower bound alone (lower_bound_s,
    lower_bound_reason, bytes_to_move), without a plan. Layouts are built once
    per (model, state, configuration) and reused."""
def sync(
    model: Model,
    trainer: str,
    engines: str,
    cluster: Cluster,
    *,
    dtype: str = "bf16",
    trainer_dtype: Optional[str] = None,
    planner: str = "lp",
) -> Dict[str, Any]:
    """Weight sync (RL post-training): the trainer's weights to the engines'
    serving layout, planned, checked and bounded once per question, then
    cached. The report, its broadcast_floor, the conversion the senders make
    (``trainer_dtype`` != ``dtype``; else None) and the plan to perform."""
def switch_schedule(
    model: Model,
    cluster: Cluster,
    strategies: List[str],
    *,
    state: str = "params",
    planner: str = "lp",
    memory_budget: Optional[int] = None,
) -> Dict[str, Any]: ...
def reshard(
    src: _Path,
    out: _Path,
    to: str,
    *,
    planner: str = "lp",
    model: Optional[str] = None,
    cluster: Optional[Cluster] = None,
    format: Optional[str] = None,
    weights_only: bool = False,
    exclude: Optional[List[str]] = None,
    place: Optional[List[str]] = None,
    fsdp_place: Optional[List[str]] = None,
    transformer_impl: Optional[str] = None,
    overwrite: bool = False,
) -> Dict[str, Any]: ...
def import_hf(
    hf: _Path,
    out: _Path,
    layout: str,
    *,
    model: Optional[str] = None,
    dtype: Optional[str] = None,
    cluster: Optional[Cluster] = None,
    exclude: Optional[List[str]] = None,
    overwrite: bool = False,
) -> Dict[str, Any]:
    """A Hugging Face model directory into a new tenplan checkpoint under a
    parallel layout (catalog models under Megatron's names; any other
    transformers family under its files' names, split by its TP plan)."""
def check(dir: _Path) -> Dict[str, Any]: ...
def export(
    ckpt: _Path,
    hf: Optional[_Path] = None,
    *,
    dcp: Optional[_Path] = None,
    to: Optional[str] = None,
    model: Optional[str] = None,
    max_shard_bytes: int = 5_000_000_000,
    weights_only: bool = False,
    exclude: Optional[List[str]] = None,
) -> Dict[str, Any]: ...
def diff(a: _Path, b: _Path, *, model: Optional[str] = None, weights_only: bool = False) -> Dict[str, Any]:
    """Compare two checkpoints or models (tenplan, DCP or Hugging Face) tensor by tensor: identical, different, first_difference, only_a, only_b."""
def program(plan: Plan, device: int, alone_min_bytes: Optional[int] = None) -> Dict[str, Any]:
    """The per-device message-passing program of a verified plan (raises PlanRejected otherwise);
    messages of at least ``alone_min_bytes`` travel alone where that saves a copy."""
