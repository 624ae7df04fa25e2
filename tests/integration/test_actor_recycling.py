"""Actors that recycle themselves, on real Ray actors: a UDF that leaks native-sized memory
runs to the end under its module's ``max_rss``; an actor past its limit finishes its batch,
is replaced, and no output is lost or delivered twice. ``max_batches`` recycles by count.
The recyclings are recorded with why, for ``status``, the timeline and the web view."""

from __future__ import annotations

import itertools
import os
import sys
import time
from typing import Any

import pytest

import rayorch as ro
from rayorch.core.compile_errors import ModuleDefinitionError
from rayorch.core.facts import GrainRetried
from rayorch.inspect.audit import audit_run
from rayorch.inspect.pool_log import pool_history
from rayorch.store.registry import open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ray = pytest.importorskip("ray")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

LEAK = 40 << 20  # bytes each batch keeps for good


class Leaky:
    """Squares its inputs and keeps 40 MB per batch, touched so it is resident; says which
    process ran each record."""

    def __init__(self) -> None:
        self.hoard: list[bytes] = []

    def __call__(self, xs: list[int]) -> list[tuple[int, int]]:
        self.hoard.append(b"\x01" * LEAK)
        return [(x * x, os.getpid()) for x in xs]


class Leaks(ro.Pipeline):
    def __init__(self, **limits: Any) -> None:
        self.leak = ro.RayModule(Leaky, batch_size=1, num_cpus=0.25, **limits)

    def forward(self, xs: Any) -> Any:
        return self.leak(xs)


def run(limits: dict[str, Any], n: int) -> tuple[list[Any], Any, list[Any]]:
    url = f"memory://recycle-{os.getpid()}-{time.monotonic_ns()}"
    store = open_store(url)  # held open: the facts and the pool log outlive the run
    handle = Leaks(**limits).run(list(range(n)), store=url, quiet=True)
    outputs = handle.outputs
    history = pool_history(store.pool_sizes(handle.run_id))
    assert audit_run(store, handle.run_id).ok
    return outputs, history, [handle, store]


def test_a_leaking_udf_runs_to_the_end_under_max_rss(ray_local: None) -> None:
    n = 24
    outputs, history, (handle, store) = run({"max_rss": "400MB"}, n)
    assert [square for square, _ in outputs] == [x * x for x in range(n)]  # each once, in order
    pids = [pid for _, pid in outputs]
    # 40 MB a batch over an actor's ~100-200 MB at rest: a few batches per actor
    assert len(set(pids)) >= 3, pids
    recycled = [e.change for e in history.entries if e.change.recycle]
    assert len(recycled) >= len(set(pids)) - 1
    assert all("over max_rss 400.0 MB" in c.reason for c in recycled), recycled[0].reason
    assert handle.actors_replaced == 0  # a recycling is not a failure
    assert handle.actors_recycled == len(recycled)
    retried = [s.fact for s in store.iter_facts(handle.run_id, 0)
               if isinstance(s.fact, GrainRetried)]
    assert retried == []  # the batch queued behind the last one ran: none was lost
    lines = history.lines()
    assert any(f"{len(recycled)} actors recycled; last: recycled actor 0: RSS" in line
               for line in lines), lines
    store.close()


def test_max_batches_recycles_by_count(ray_local: None) -> None:
    outputs, history, (_, store) = run({"max_batches": 3}, 9)
    assert [square for square, _ in outputs] == [x * x for x in range(9)]
    pids = [pid for _, pid in outputs]
    runs = [len(list(g)) for _, g in itertools.groupby(pids)]
    assert runs == [3, 3, 3], pids  # one actor, three incarnations of three batches each
    reasons = [e.change.reason for e in history.entries if e.change.recycle]
    assert reasons[:2] == ["recycled actor 0: max_batches=3 reached"] * 2
    store.close()


def test_bad_limits_are_refused_at_their_line() -> None:
    with pytest.raises(ModuleDefinitionError, match="max_rss='lots'"):
        ro.RayModule(Leaky, max_rss="lots")
    with pytest.raises(ModuleDefinitionError, match="max_batches"):
        ro.RayModule(Leaky, max_batches=0)
