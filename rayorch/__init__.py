"""rayorch: lineage-aware fan-out/fan-in pipelines on Ray.

>>> import rayorch as ro
>>> from rayorch import F
"""

from rayorch import excepthook as _excepthook
from rayorch.actors.usage import add_tokens
from rayorch.core import functional as F
from rayorch.core.errors import (
    CompileError,
    InvalidTransition,
    KernelError,
    NoProgressError,
    RayorchError,
    StoreError,
    TraceError,
)
from rayorch.core.outcome import (
    ActorFailure,
    FailedResult,
    GroupFailure,
    Item,
    Outcome,
    RecordFailure,
)
from rayorch.core.plan import Plan, Policy
from rayorch.core.program import RayModule, function
from rayorch.core.recovery import RecoveryPolicy
from rayorch.core.tracer import Port
from rayorch.pipeline import Pipeline, run

# Upstream RayOrch's names for the same things (docs/MIGRATING.md).
OutputIssue = FailedResult
ItemOutcome = Outcome
ExecutionError = RayorchError

_excepthook.install()

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``ro.Executor`` and ``ro.RunResult`` (upstream's name of what ``run`` returns),
    imported on first use: they live with the driver, which imports Ray."""
    if name == "Executor":
        from rayorch.driver import Executor

        return Executor
    if name == "RunResult":
        from rayorch.driver import RunHandle

        return RunHandle
    raise AttributeError(f"module 'rayorch' has no attribute {name!r}")


__all__ = [
    "add_tokens",
    "ActorFailure",
    "CompileError",
    "ExecutionError",
    "F",
    "FailedResult",
    "GroupFailure",
    "InvalidTransition",
    "Item",
    "ItemOutcome",
    "KernelError",
    "NoProgressError",
    "Outcome",
    "OutputIssue",
    "Pipeline",
    "Plan",
    "Policy",
    "Port",
    "RayModule",
    "RayorchError",
    "RecordFailure",
    "RecoveryPolicy",
    "RunResult",
    "Executor",
    "StoreError",
    "TraceError",
    "function",
    "run",
]
