"""Exceptions vs crashes, and Ray options, on real Ray actors.

A Python exception from a UDF is handled inside the living actor (its recovery policy);
only ``ro.ActorFailure``, a crash or a timeout replaces the actor. ``ray_options`` reach
``ray.remote(...).options`` (here: a ``runtime_env``).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rayorch as ro

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ray = pytest.importorskip("ray")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(params=["memory", "redis"])
def store_url(request: pytest.FixtureRequest, ray_local: None) -> Iterator[str]:
    if request.param == "memory":
        yield f"memory://exc-{os.getpid()}-{time.monotonic_ns()}"
    else:
        yield request.getfixturevalue("redis_url")


class RaisesOnThree:
    """Raises on record 3; answers ``(value, pid, instance)`` for the others."""

    def __init__(self) -> None:
        self.instance = uuid.uuid4().hex

    def __call__(self, xs: list[int]) -> list[Any]:
        if 3 in xs:
            raise ValueError("three is not allowed")
        return [(x * 10, os.getpid(), self.instance) for x in xs]


class OneBadRecord(ro.Pipeline):
    def __init__(self, max_attempts: int) -> None:
        self.work = ro.RayModule(RaisesOnThree, batch_size=3, num_cpus=0.25,
                                 max_attempts=max_attempts)

    def forward(self, xs: Any) -> Any:
        return self.work(xs)


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_an_exception_on_one_record_leaves_the_same_actor_serving_the_rest(
    store_url: str, max_attempts: int
) -> None:
    handle = OneBadRecord(max_attempts).run(list(range(8)), store=store_url, quiet=True)
    outputs = handle.outputs
    bad = outputs[3]
    assert isinstance(bad, ro.OutputIssue) and bad.outcome is ro.ItemOutcome.FAILED
    assert bad.cause == "ValueError: three is not allowed"
    good = [o for i, o in enumerate(outputs) if i != 3]
    assert [v for v, _, _ in good] == [x * 10 for x in range(8) if x != 3]  # batch-mates too
    assert len({pid for _, pid, _ in good}) == 1  # one process ...
    assert len({inst for _, _, inst in good}) == 1  # ... one instance of the UDF
    assert handle.actors_replaced == 0
    assert sum(c.retried for c in handle.stats.calls.values()) == 0  # handled in the actor


class FailsOnceThenWorks:
    """An upstream-style stateful UDF: its first call fails (a warm-up, a flaky link)."""

    def __init__(self):  # type: ignore[no-untyped-def]
        self.calls = 0
        self.instance = uuid.uuid4().hex

    def run(self, values):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("transient: not warmed up yet")
        return [(value, self.instance, self.calls) for value in values]


class TransientPipeline(ro.Pipeline):
    def __init__(self):  # type: ignore[no-untyped-def]
        self.stage = ro.RayModule(FailsOnceThenWorks).ray_options(
            replicas=2, batch_size=4, num_cpus=0.25,
            recovery=ro.RecoveryPolicy.retry_batch(max_retries=1))

    def forward(self, values):  # type: ignore[no-untyped-def]
        return self.stage(values)


def test_a_transient_failure_program_completes_with_retries_on_the_same_instance(
    ray_local: None,
) -> None:
    outputs = TransientPipeline().run(list(range(10)), input_batch_size=5).outputs
    assert [value for value, _, _ in outputs] == list(range(10))
    # each instance's state survived its own failure: its retry saw calls == 2
    first_seen: dict[str, int] = {}
    for _, instance, calls in outputs:
        first_seen[instance] = min(first_seen.get(instance, calls), calls)
    assert set(first_seen.values()) == {2}


class LosesItsGpu:
    """Raises ro.ActorFailure in the first actor only (a marker file says it happened)."""

    def __init__(self, marker: str) -> None:
        self.marker = Path(marker)

    def __call__(self, xs: list[int]) -> list[Any]:
        if not self.marker.exists():
            self.marker.write_text(str(os.getpid()))
            raise ro.ActorFailure("CUDA context lost")
        return [(x, os.getpid()) for x in xs]


class ActorFailurePipeline(ro.Pipeline):
    def __init__(self, marker: str) -> None:
        self.work = ro.RayModule(LosesItsGpu, marker, batch_size=4, num_cpus=0.25)

    def forward(self, xs: Any) -> Any:
        return self.work(xs)


def test_actor_failure_replaces_the_actor_and_retries_the_batch(
    ray_local: None, tmp_path: Path
) -> None:
    marker = tmp_path / "failed-once"
    handle = ActorFailurePipeline(str(marker)).run(list(range(4)), quiet=True)
    outputs = handle.outputs
    assert [x for x, _ in outputs] == [0, 1, 2, 3]
    assert {pid for _, pid in outputs} != {int(marker.read_text())}  # a fresh actor
    assert handle.actors_replaced == 1
    assert sum(c.retried for c in handle.stats.calls.values()) == 4


class ReadsEnv:
    def run(self, xs: list[int]) -> list[str | None]:
        return [os.environ.get("RAYORCH_STAGE_ENV") for _ in xs]


class EnvPipeline(ro.Pipeline):
    def __init__(self) -> None:
        self.builder = ro.RayModule(ReadsEnv).ray_options(
            num_cpus=0.25, runtime_env={"env_vars": {"RAYORCH_STAGE_ENV": "builder"}})
        self.flat = ro.RayModule(ReadsEnv, num_cpus=0.25, ray_options={
            "runtime_env": {"env_vars": {"RAYORCH_STAGE_ENV": "flat"}}})

    def forward(self, xs: Any) -> Any:
        return {"builder": self.builder(xs), "flat": self.flat(xs)}


def test_runtime_env_reaches_the_actor(ray_local: None) -> None:
    assert EnvPipeline().run([1, 2], quiet=True).outputs == {
        "builder": ["builder", "builder"], "flat": ["flat", "flat"]}
