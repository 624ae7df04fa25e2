"""Pools that size themselves beside other runs and other drivers, on real Ray (the pool
ledger, rayorch/runtime/pool_ledger.py): a run that arrives gets a fair share of a cluster
another run holds (that one gives actors back), and the drivers of one run size their shared
pools once, within one budget, every output delivered once.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import rayorch as ro
from rayorch.core.facts import OutputEmitted
from rayorch.core.pool_sizing import SizingSettings
from rayorch.inspect.audit import audit_run
from rayorch.replicas import create_run, join_run
from rayorch.store.registry import open_store

pytestmark = [pytest.mark.integration, pytest.mark.long, pytest.mark.timeout(240)]

ray_cloudpickle = pytest.importorskip("ray.cloudpickle")
ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])

FAST = SizingSettings(interval_s=0.25, backlog_s=0.5, idle_limit_s=30.0)


class Slow:
    def __call__(self, xs: list[int]) -> list[int]:
        time.sleep(0.25 * len(xs))
        return [x * 3 for x in xs]


class Hungry(ro.Pipeline):
    """One stage, 1 CPU an actor, up to the whole test cluster (8 CPUs)."""

    def __init__(self) -> None:
        super().__init__()
        self.work = ro.RayModule(Slow, num_cpus=1, batch_size=1, replicas=(1, 8))

    def forward(self, xs: Any) -> Any:
        return self.work(xs)


def wait_for(check: Any, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_run_that_arrives_gets_a_fair_share_of_a_cluster_another_run_holds(
        ray_local: None) -> None:
    first = Hungry().run(list(range(400)), progress=False, quiet=True, pool_sizing=FAST)
    results: dict[str, list[int]] = {}
    threads = [threading.Thread(target=lambda: results.__setitem__("first", first.collect()))]
    threads[0].start()
    assert first.pool_sizer is not None
    wait_for(lambda: max((c.after for c in first.pool_sizer.history), default=1) >= 6)

    second = Hungry().run(list(range(100)), progress=False, quiet=True, pool_sizing=FAST)
    threads.append(threading.Thread(target=lambda: results.__setitem__("second",
                                                                       second.collect())))
    threads[1].start()
    for thread in threads:
        thread.join(200)
    assert results["first"] == [x * 3 for x in range(400)]
    assert results["second"] == [x * 3 for x in range(100)]

    gave_back = [c for c in first.pool_sizer.history if c.after < c.before
                 and "more than its share" in c.reason]
    assert gave_back, first.pool_sizer.history  # the first run drained for the second one
    assert second.pool_sizer is not None
    assert max(c.after for c in second.pool_sizer.history) >= 2  # the second one grew
    assert first.pool_sizer.share is not None  # the ledger answered


class Replicated(ro.Pipeline):
    """A replica run's pipeline: importable by every driver (create_run records it)."""

    def __init__(self) -> None:
        super().__init__()
        self.work = ro.RayModule(Slow, num_cpus=1, batch_size=1, replicas="auto")

    def forward(self, xs: Any) -> Any:
        return self.work(xs)


def test_the_drivers_of_one_run_size_its_shared_pool_once_within_one_budget(
        ray_local: None, redis_url: str, tmp_path: Path, quick_pool_sizing: None) -> None:
    run_id = create_run(Replicated, [list(range(160))], store=redis_url, shards=4,
                        micro_batch=4, out_dir=str(tmp_path / "out"))
    handles = [join_run(run_id, store=redis_url, driver_id=name, quiet=True)
               for name in ("driver-a", "driver-b")]
    views: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    stop = threading.Event()

    def watch() -> None:  # both drivers' view of the shared pool's live actors
        while not stop.is_set():
            a, b = (tuple(sorted(s.index for s in h._driver.pools.pools["work"].live_slots()))
                    for h in handles)
            views.append((a, b))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    counts: dict[str, int] = {}
    threads = [threading.Thread(target=lambda h=h: counts.__setitem__(h.driver_id, h.wait()))
               for h in handles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(200)
    stop.set()
    watcher.join()
    for handle in handles:
        handle.close()

    sizers = [h._driver.sizer for h in handles]
    changes = [(h.driver_id, c) for h, s in zip(handles, sizers) for c in (s.history if s else [])]
    assert changes, "the shared pool never changed size"
    assert len({driver for driver, _ in changes}) == 1  # one leader sized it (the first)
    assert max(c.after for _, c in changes) >= 2  # it grew (a shared pool was fixed before)
    assert all(c.after <= 8 for _, c in changes)  # one budget: the cluster, not 2 x 8
    grown = [(a, b) for a, b in views if len(a) >= 2]
    assert any(a == b for a, b in grown), views[-20:]  # the follower adopted the live set

    store = open_store(redis_url)
    try:
        emitted = Counter(s.fact.index for facts in store.read_run(run_id).values() for s in facts
                          if isinstance(s.fact, OutputEmitted))
        assert emitted == Counter(range(160))  # exactly once, whichever driver
        assert audit_run(store, run_id).ok
    finally:
        store.close()
    import ray

    def left() -> list[str]:
        return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a["name"].startswith(f"rayorch:{run_id}:")]
    wait_for(lambda: not left(), timeout_s=5.0)  # no actor left behind, dropped ones included
