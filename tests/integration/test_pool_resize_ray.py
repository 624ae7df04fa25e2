"""Pools that size themselves on real Ray (docs/topics/POOL-SIZING.md, "Pools that size
themselves").

A stage with ``replicas=(1, 4)`` grows while a burst of children backs it up and shrinks
while it waits on a slow upstream stage, within one run; every output is delivered once,
no batch is lost to a drained actor (no retry), the audit passes and ``rayorch status``
shows the sizes.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import rayorch as ro
from rayorch import F
from rayorch.core.facts import GrainRetried, OutputEmitted
from rayorch.core.pool_sizing import SizingSettings
from rayorch.inspect.audit import audit_run
from rayorch.inspect.status import run_status
from rayorch.store.registry import open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ray_cloudpickle = pytest.importorskip("ray.cloudpickle")
ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])

BURST = 6  # sources 0..5: 12 children each, at once
SLOW = 4  # sources 6..9: one child each, 2.5 s apart (the work stage idles)
FAST = SizingSettings(interval_s=0.25, backlog_s=0.5, idle_limit_s=0.75,
                      model_idle_limit_s=0.75, start_cost_factor=0.0)


def children_done(log_dir: Path) -> int:
    return sum(len(log.read_text().splitlines()) for log in log_dir.glob("work-*.log"))


class Split:
    """The burst's sources at once; each later one 2.5 s, the first of them only once the
    burst's children are done (60 s at most): the work stage then idles, however slow the
    machine."""

    def __init__(self, log_dir: str) -> None:
        self.dir = Path(log_dir)

    def __call__(self, xs: list[int]) -> list[list[tuple[int, int]]]:
        out = []
        for x in xs:
            deadline = time.monotonic() + 60
            while x == BURST and children_done(self.dir) < 12 * BURST:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            if x >= BURST:
                time.sleep(2.5)
            out.append([(x, i) for i in range(12 if x < BURST else 1)])
        return out


class Work:
    """0.1 s a child. The batch holding the burst's third child waits (60 s at most) until a
    second actor is up: once the first batch measured the cost, the burst's backlog stays
    until the pool has grown, however slow the machine (no timing in the outcome)."""

    def __init__(self, log_dir: str) -> None:
        self.dir = Path(log_dir)
        self.log = self.dir / f"work-{os.getpid()}.log"
        (self.dir / f"up-{os.getpid()}").touch()

    def __call__(self, items: list[tuple[int, int]]) -> list[int]:
        deadline = time.monotonic() + 60
        while (0, 2) in items and len(list(self.dir.glob("up-*"))) < 2:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        time.sleep(0.1 * len(items))
        with self.log.open("a") as f:
            f.writelines(f"{x} {i}\n" for x, i in items)
        return [100 * x + i for x, i in items]


def total(values: list[int]) -> int:
    return sum(values)


class Bursty(ro.Pipeline):
    def __init__(self, log_dir: str) -> None:
        super().__init__()
        self.split = ro.RayModule(Split, log_dir=log_dir, num_cpus=0.5)
        self.work = ro.RayModule(Work, log_dir=log_dir, num_cpus=0.5, batch_size=2,
                                 replicas=(1, 4))
        self.join = ro.RayModule(total, batched=False, num_cpus=0.5)

    def forward(self, xs: Any) -> Any:
        return self.join(F.reduce(self.work(F.expand(self.split(xs)))))


@pytest.mark.long
def test_a_pool_grows_and_shrinks_mid_run_and_every_output_arrives_once(
        store_url: str, tmp_path: Path) -> None:
    sources = list(range(BURST + SLOW))
    run = Bursty(str(tmp_path)).run(sources, store=store_url, progress=False, quiet=True,
                                    pool_sizing=FAST)
    expected = [sum(100 * x + i for i in range(12 if x < BURST else 1)) for x in sources]
    assert run.collect() == expected

    changes = [c for c in run.pool_sizer.history if c.module == "work"]
    grew = [c for c in changes if c.after > c.before]
    shrank = [c for c in changes if c.after < c.before]
    assert grew and all(c.reason.startswith(("backlog", "72 waiting", "0 waiting"))
                        or "not measured yet" in c.reason for c in grew), changes
    assert shrank and any(c.at_s > grew[0].at_s for c in shrank), changes
    assert all(1 <= c.after <= 4 for c in changes)
    assert run.pool_sizer.binding() is not None

    lines = [line for log in tmp_path.glob("work-*.log") for line in log.read_text().split("\n")
             if line]
    assert len(list(tmp_path.glob("work-*.log"))) > 1  # more than one actor did the work
    assert sorted(Counter(lines).values()) == [1] * len(lines)  # each child ran once

    store = open_store(store_url)
    try:
        status = "\n".join(run_status(store, run.run_id).lines())
        assert "pool work: 1 -> " in status and "idle" in status  # sizes over time, why
        facts = [s.fact for s in store.iter_facts(run.run_id, 0)]
        emitted = Counter(f.index for f in facts if isinstance(f, OutputEmitted))
        assert emitted == Counter(sources)  # delivered exactly once
        assert not [f for f in facts if isinstance(f, GrainRetried)]  # no drained batch lost
        report = audit_run(store, run.run_id)
        assert report.ok, [str(v) for v in report.violations]
    finally:
        store.close()


class OnlyOnce:
    """Builds once per test: a second instance's constructor fails (a GPU with room for one
    engine, say)."""

    def __init__(self, log_dir: str) -> None:
        marker = Path(log_dir) / "built"
        if marker.exists():
            raise RuntimeError("no room for a second engine")
        marker.touch()

    def __call__(self, xs: list[int]) -> list[int]:
        time.sleep(0.05 * len(xs))
        return [x + 1 for x in xs]


class GrowsIntoAWall(ro.Pipeline):
    def __init__(self, log_dir: str) -> None:
        super().__init__()
        self.step = ro.RayModule(OnlyOnce, log_dir=log_dir, num_cpus=0.5, replicas=(1, 3))

    def forward(self, xs: Any) -> Any:
        return self.step(xs)


@pytest.mark.long
def test_an_added_actor_that_fails_to_build_leaves_the_run_going_at_the_size_it_had(
        ray_local: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The first actors failing to build is the run's error; an added one is not."""
    run = GrowsIntoAWall(str(tmp_path)).run(list(range(200)), progress=False, quiet=True,
                                            pool_sizing=FAST)
    assert run.collect() == [x + 1 for x in range(200)]
    err = capfd.readouterr().err
    assert err.count("failed to build (RuntimeError: no room for a second engine); no more "
                     "are added to it") == 1
    assert any(c.after > c.before for c in run.pool_sizer.history)
