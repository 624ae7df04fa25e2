"""``ro.Executor``: actors started once serve many runs, each its own lineage run."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import ray

import rayorch as ro
from rayorch.inspect.audit import audit_run
from rayorch.store.registry import open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Tag:
    """Loads a 'model' once per actor; tags each record with its process id."""

    loads = 0

    def __init__(self) -> None:
        Tag.loads += 1
        self.loaded_in = os.getpid()

    def __call__(self, xs: list[int]) -> list[list[Any]]:
        return [[(x, self.loaded_in)] * (x % 3 + 1) for x in xs]


class Double:
    def __call__(self, items: list[Any]) -> list[Any]:
        return [(x * 2, pid, os.getpid()) for x, pid in items]


class Fan(ro.Pipeline):
    def __init__(self) -> None:
        super().__init__()
        self.tag = ro.RayModule(Tag, num_cpus=0.25)
        self.double = ro.RayModule(Double, num_cpus=0.25, replicas=2, batch_size=4)

    def forward(self, xs: Any) -> Any:
        return ro.F.reduce(self.double(ro.F.expand(self.tag(xs))))


def test_warm_executor_starts_no_actor_for_its_second_run(ray_local: None,
                                                           redis_url: str) -> None:
    with ro.Executor(Fan(), store=redis_url) as executor:
        first = executor.run([1, 2, 3, 4], quiet=True)
        started = executor.actors_started
        second = executor.run([5, 6, 7], quiet=True)
        assert executor.actors_started == started  # no actor started for the second run
        assert first.run_id != second.run_id
    expect = {x: [x * 2] * (x % 3 + 1) for x in range(1, 8)}
    for handle, xs in ((first, [1, 2, 3, 4]), (second, [5, 6, 7])):
        assert [[v for v, _, _ in doc] for doc in handle.outputs] == [expect[x] for x in xs]
    pids = lambda h, i: {p for doc in h.outputs for p in (doc[0][i],)}  # noqa: E731
    assert pids(first, 1) == pids(second, 1)  # the same 'model' process served both runs
    assert pids(second, 2) <= pids(first, 2) | pids(second, 2)
    store = open_store(redis_url)
    try:  # each run is a lineage run of its own that audits clean
        for handle in (first, second):
            report = audit_run(store, handle.run_id)
            assert report.ok, report.violations
    finally:
        store.close()


def test_a_closed_executor_refuses_runs_and_an_open_run_blocks_the_next(
        ray_local: None) -> None:
    executor = ro.Executor(Fan())
    handle = executor.iterate([1, 2], quiet=True)
    next(handle)
    with pytest.raises(ro.RayorchError, match="still open"):
        executor.iterate([3], quiet=True)
    handle.close()
    assert executor.run([3], quiet=True).collect()[0][0][0] == 6  # warm pools still work
    executor.close()
    with pytest.raises(ro.RayorchError, match="closed"):
        executor.run([1], quiet=True)
