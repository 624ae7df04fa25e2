"""rayorch: lineage-aware fan-out/fan-in pipelines on Ray.

>>> import rayorch as ro
>>> from rayorch import F
"""

from rayorch import excepthook as _excepthook
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
from rayorch.core.outcome import FailedResult, GroupFailure, Item, Outcome, RecordFailure
from rayorch.core.plan import Plan, Policy
from rayorch.core.program import RayModule
from rayorch.core.tracer import Port
from rayorch.pipeline import Pipeline

_excepthook.install()

__version__ = "0.1.0"

__all__ = [
    "CompileError",
    "F",
    "FailedResult",
    "GroupFailure",
    "InvalidTransition",
    "Item",
    "KernelError",
    "NoProgressError",
    "Outcome",
    "Pipeline",
    "Plan",
    "Policy",
    "Port",
    "RayModule",
    "RayorchError",
    "RecordFailure",
    "StoreError",
    "TraceError",
]
