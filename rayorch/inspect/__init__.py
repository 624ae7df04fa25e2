"""Read-only views of a stored run, computed from its facts alone (no user code).

As data, which ``rayorch`` (text) and ``rayorch ui`` (HTML) both render: ``audit`` (the
invariants), ``status`` (counts, leases, drivers), ``show`` (a source's lineage tree),
``live`` (a run view extended as facts arrive; failures by cause, progress over time),
``timeline`` (per-Call windows, throughput), ``pool_log`` (each sizing pool's size over
time and why it changed) and ``barriers`` (what each barrier did).
"""

from rayorch.inspect.pool_log import PoolHistory, pool_history
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
    "PoolHistory",
    "RetryEvent",
    "Throughput",
    "Timeline",
    "compute_timeline",
    "draw_timeline",
    "load_timeline",
    "pool_history",
]
