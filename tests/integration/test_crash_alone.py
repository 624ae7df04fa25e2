"""A record that crashes its actor fails alone, on real Ray actors (core/crash_split.py).

A UDF that kills its process (``os._exit``, a segfault) for one input takes its batch and
every batch queued on that actor down with it. The batch is retried on an actor of its own,
in halves, until the poison record is alone: only that record fails, with Ray's text for
the death, and its batch-mates succeed, whatever the batch size and however often.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections import Counter
from typing import Any

import pytest

import rayorch as ro
from rayorch.core.crash_split import uncharged_budget
from rayorch.core.facts import GrainFailed, GrainRetried
from rayorch.inspect.audit import audit_run
from rayorch.store.registry import open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ray = pytest.importorskip("ray")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class DiesOn:
    """Multiplies by 10; kills its own process on a poison input (``exit`` or ``segfault``)."""

    def __init__(self, poison: tuple[int, ...], how: str) -> None:
        self.poison, self.how = set(poison), how

    def __call__(self, xs: list[int]) -> list[int]:
        if self.poison & set(xs):
            if self.how == "segfault":
                ctypes.string_at(0)  # reads address 0: SIGSEGV in native code
            os._exit(1)
        return [10 * x for x in xs]


class DiesOnAsync(DiesOn):
    """:class:`DiesOn` as coroutines: ``max_inflight`` batches on one event loop."""

    async def __call__(self, xs: list[int]) -> list[int]:  # type: ignore[override]
        return DiesOn.__call__(self, xs)


class Bad(ro.Pipeline):
    def __init__(self, poison: tuple[int, ...], how: str = "exit", *, batch_size: int,
                 max_attempts: int = 1, max_inflight: int = 1, udf: type = DiesOn) -> None:
        self.bad = ro.RayModule(udf, poison, how, batch_size=batch_size, num_cpus=0.25,
                                max_attempts=max_attempts, max_inflight=max_inflight)

    def forward(self, xs: Any) -> Any:
        return self.bad(xs)


def run_and_check(pipeline: Bad, sources: list[int], poison: tuple[int, ...], *,
                  batch_size: int, max_attempts: int) -> None:
    """Only the poison sources fail, each with its actor's death; the others are 10 x;
    crash retries stay within the bound; the run audits OK."""
    url = f"memory://crash-alone-{os.getpid()}-{time.monotonic_ns()}"
    store = open_store(url)  # held open: the run's facts outlive the run, for the audit
    handle = pipeline.run(sources, store=url, quiet=True)
    outputs = handle.outputs
    failed = {i: o for i, o in enumerate(outputs) if isinstance(o, ro.OutputIssue)}
    assert set(failed) == {sources.index(p) for p in poison}, failed
    for issue in failed.values():
        assert issue.outcome is ro.ItemOutcome.FAILED
        assert issue.cause.startswith("actor of 'bad' died: ") and "Error" in issue.cause
    assert [o for i, o in enumerate(outputs) if i not in failed] == [
        10 * x for x in sources if x not in poison]
    assert handle.actors_replaced >= 1
    try:
        facts = [s.fact for s in store.iter_facts(handle.run_id, 0)]
        retried = Counter(f.path[0] for f in facts if isinstance(f, GrainRetried))
        stats = handle.stats.calls["bad"]
        assert stats.retried == sum(retried.values()) + len(poison)  # attempts lost
        charged = Counter(f.path[0] for f in facts if isinstance(f, GrainRetried) and f.charged)
        assert stats.uncharged == sum(retried.values()) - sum(charged.values()) > 0
        assert set(charged) <= {sources.index(p) for p in poison}  # no neighbour is charged
        ended = {f.path[0]: f.generation for f in facts if isinstance(f, GrainFailed)}
        assert set(ended) == set(failed)
        bound = uncharged_budget(batch_size) + max_attempts
        assert all(generation < bound for generation in ended.values()), (ended, bound)
        report = audit_run(store, handle.run_id)
        assert report.ok, [str(v) for v in report.violations]
    finally:
        store.close()


@pytest.mark.parametrize("batch_size", [
    pytest.param(2, marks=pytest.mark.slow),  # the default suite's time: one Ray run here
    6,
])
def test_an_os_exit_fails_only_its_own_record(ray_local: None, batch_size: int) -> None:
    run_and_check(Bad((2,), batch_size=batch_size), list(range(6)), (2,),
                  batch_size=batch_size, max_attempts=1)


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [2, 6])
def test_an_os_exit_fails_only_its_own_record_every_time(ray_local: None,
                                                         batch_size: int) -> None:
    """The measured failure (an innocent batch-mate failed in 4 of 6 runs), repeated."""
    for _ in range(4):
        run_and_check(Bad((2,), batch_size=batch_size, max_attempts=3), list(range(6)), (2,),
                      batch_size=batch_size, max_attempts=3)


@pytest.mark.slow
def test_a_segfault_in_native_code_fails_only_its_own_record(ray_local: None) -> None:
    run_and_check(Bad((3,), "segfault", batch_size=4, max_attempts=2), list(range(8)), (3,),
                  batch_size=4, max_attempts=2)


@pytest.mark.slow
def test_two_poison_records_in_one_batch_fail_alone(ray_local: None) -> None:
    run_and_check(Bad((1, 2), batch_size=4, max_attempts=2), list(range(8)), (1, 2),
                  batch_size=4, max_attempts=2)


@pytest.mark.slow
@pytest.mark.parametrize("udf", [DiesOn, DiesOnAsync])
def test_a_crash_fails_alone_with_several_batches_in_flight(ray_local: None, udf: type) -> None:
    """``max_inflight=2``: two batches run at once on each actor (threads, or coroutines),
    both die with it."""
    run_and_check(Bad((5,), batch_size=2, max_attempts=2, max_inflight=2, udf=udf),
                  list(range(10)), (5,), batch_size=2, max_attempts=2)
