"""Read-only views of a stored run, computed from its facts alone (no user code)."""

from rayorch.inspect.timeline import (
    CallWindow,
    FailoverEvent,
    NoFactsError,
    RetryEvent,
    Throughput,
    Timeline,
    compute_timeline,
    draw_timeline,
    load_timeline,
)

__all__ = [
    "CallWindow",
    "FailoverEvent",
    "NoFactsError",
    "RetryEvent",
    "Throughput",
    "Timeline",
    "compute_timeline",
    "draw_timeline",
    "load_timeline",
]
