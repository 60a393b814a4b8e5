"""tenplan: plans and performs the movement of a deep-learning job's state
when its parallel configuration or its GPUs change.

The calls are the Rust library's (PyO3); ``tenplan.torch`` adds layouts of
live PyTorch state and the torch.distributed executor.

>>> import tenplan
>>> m = tenplan.Model("gpt-tiny")
>>> problem = tenplan.Problem(m.layout("tp=2,dp=2"), m.layout("tp=4"), tenplan.Cluster("1x4"))
>>> plan = tenplan.plan(problem, "lp")
>>> tenplan.verify(plan).startswith("verified")
True
"""

from ._tenplan import (
    CheckpointError,
    Cluster,
    DatasetState,
    InfeasibleError,
    Layout,
    LayoutError,
    Model,
    Plan,
    PlanRejected,
    Problem,
    SolverError,
    TenplanError,
    check,
    diff,
    cost,
    default_cluster,
    evaluate,
    export,
    import_hf,
    lower_bound,
    plan,
    planners,
    program,
    reshard,
    simulate,
    switch_schedule,
    sync,
    verify,
)

__all__ = [
    "CheckpointError",
    "Cluster",
    "DatasetState",
    "InfeasibleError",
    "Layout",
    "LayoutError",
    "Model",
    "Plan",
    "PlanRejected",
    "Problem",
    "SolverError",
    "TenplanError",
    "check",
    "diff",
    "cost",
    "default_cluster",
    "evaluate",
    "export",
    "import_hf",
    "lower_bound",
    "plan",
    "planners",
    "program",
    "reshard",
    "simulate",
    "switch_schedule",
    "sync",
    "verify",
]
