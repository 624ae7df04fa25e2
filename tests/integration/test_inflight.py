"""Several batches in flight per actor (``max_inflight=N``), through the public API on real
Ray: an ``async def __call__`` module and a plain one each run N batches at once in one
actor, every batch is still its own fenced attempt committed through the gate, outputs
come back once and in order per parent, and a record that raises in one of the
overlapping batches fails alone.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import rayorch as ro
from rayorch import F
from rayorch.core import compile_errors as ce
from rayorch.core.facts import GrainCommitted, GrainRetried
from rayorch.core.outcome import FailedResult, Outcome
from rayorch.inspect.audit import audit_run
from rayorch.store import open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ray_cloudpickle = pytest.importorskip("ray.cloudpickle")
ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])

RENDEZVOUS_S = 30.0
"""How long the first batches wait for each other; only a broken overlap waits this long
(the test then fails on the peak it recorded, it does not hang)."""


class Pages:
    """doc ``(name, n)`` -> its pages ``name:0 .. name:n-1``."""

    def __call__(self, docs: list[Any]) -> list[Any]:
        return [[f"{name}:{k}" for k in range(n)] for name, n in docs]


class AsyncOverlap:
    """An async model stage that proves its batches overlap.

    Each call records how many calls are inside at once (``peak``). The first ``n`` calls
    wait until ``n`` are inside together; the very first of them then waits until the
    other ``n - 1`` have returned, so batches finish out of submission order. A page
    whose name ends in ``!raise`` raises (an exception, handled in the actor).
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.inside = self.peak = self.calls = self.returned = 0
        self.all_in = asyncio.Event()
        self.others_out = asyncio.Event()

    async def __call__(self, pages: list[str]) -> list[Any]:
        call = self.calls
        self.calls += 1
        self.inside += 1
        self.peak = max(self.peak, self.inside)
        if self.inside >= self.n:
            self.all_in.set()
        try:
            if call < self.n:
                await asyncio.wait_for(self.all_in.wait(), RENDEZVOUS_S)
            if call == 0:
                await asyncio.wait_for(self.others_out.wait(), RENDEZVOUS_S)
        except TimeoutError:
            pass
        finally:
            self.inside -= 1
        if 0 < call < self.n:
            self.returned += 1
            if self.returned == self.n - 1:
                self.others_out.set()
        for page in pages:
            if page.endswith("!raise"):
                raise ValueError(f"page {page} cannot be read")
        return [(page, self.peak, call) for page in pages]


class ThreadOverlap:
    """The same proof for a plain ``__call__`` run in threads (``max_inflight`` threads)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.inside = self.peak = 0
        self.lock = threading.Condition()

    def __call__(self, pages: list[str]) -> list[Any]:
        with self.lock:
            self.inside += 1
            self.peak = max(self.peak, self.inside)
            self.lock.notify_all()
            self.lock.wait_for(lambda: self.peak >= self.n, timeout=RENDEZVOUS_S)
            self.inside -= 1
            return [(page, self.peak, 0) for page in pages]


class Gather:
    def __call__(self, groups: list[list[Any]]) -> list[Any]:
        return [[list(p) for p in g] for g in groups]


class Stage(ro.Pipeline):
    def __init__(self, model: Any, n: int, **options: Any) -> None:
        super().__init__()
        self.pages = ro.RayModule(Pages, num_cpus=0.1, batch_size=8)
        self.model = ro.RayModule(model, n=n, num_cpus=0.1, batch_size=2, max_inflight=n,
                                  **options)
        self.gather = ro.RayModule(Gather, num_cpus=0.1)

    def forward(self, docs: Any) -> Any:
        return self.gather(F.reduce(self.model(F.expand(self.pages(docs)))))


DOCS = [("a", 3), ("b", 1), ("c", 4), ("d", 2), ("e", 5), ("f", 1)]


def pages_of(doc: tuple[str, int]) -> list[str]:
    return [f"{doc[0]}:{k}" for k in range(doc[1])]


def committed_once(store_url: str, run_id: str, call: str) -> dict[Any, int]:
    """How many GrainCommitted facts the store holds per Grain of ``call``."""
    counts: dict[Any, int] = {}
    for stored in open_store(store_url).iter_facts(run_id, 0):
        fact = stored.fact
        if isinstance(fact, GrainCommitted) and fact.call == call:
            counts[fact.path] = counts.get(fact.path, 0) + 1
    return counts


def test_async_module_keeps_n_batches_in_flight_in_one_actor(store_url: str) -> None:
    n = 3
    run = Stage(AsyncOverlap, n).run(DOCS, store=store_url, progress=False)
    got = run.collect()
    assert [[p[0] for p in doc] for doc in got] == [pages_of(d) for d in DOCS]  # once, in order
    assert max(p[1] for doc in got for p in doc) == n  # n calls were inside the actor at once
    calls = [p[2] for doc in got for p in doc]
    # Call 0 returned after calls 1..n-1: each batch is committed on its own, in any order.
    assert 0 in calls and all(c in calls for c in range(1, n))
    counts = committed_once(store_url, run.run_id, "model")
    assert len(counts) == sum(n for _, n in DOCS) and set(counts.values()) == {1}
    report = audit_run(open_store(store_url), run.run_id)
    assert report.ok, [str(v) for v in report.violations]


def test_plain_module_runs_n_batches_at_once_in_threads(ray_local: None) -> None:
    n = 3
    got = Stage(ThreadOverlap, n).run(DOCS, progress=False).collect()
    assert [[p[0] for p in doc] for doc in got] == [pages_of(d) for d in DOCS]
    assert max(p[1] for doc in got for p in doc) == n


def test_record_raising_in_an_overlapping_batch_fails_alone(store_url: str) -> None:
    n = 3
    # Every doc expands in one batch, so the model's first batch (call 0, which waits for
    # calls 1 and 2 to be inside with it) is x's one page and a:0.
    docs = [("x", 1), ("a", 3), ("c", 4), ("d", 2)]
    run = Stage(AsyncOverlapRaising, n).run(docs, store=store_url, progress=False)
    got = run.collect()
    assert isinstance(got[0], FailedResult) and got[0].outcome is Outcome.SUPPRESSED
    assert [[p[0] for p in got[i]] for i in (1, 2, 3)] == [pages_of(docs[i]) for i in (1, 2, 3)]
    assert max(p[1] for i in (1, 2, 3) for p in got[i]) == n
    facts = [s.fact for s in open_store(store_url).iter_facts(run.run_id, 0)]
    failed = [f for f in facts if isinstance(f, GrainCommitted) and f.outcome != "present"]
    assert [(f.call, f.path) for f in failed] == [("model", (0, 0))], failed
    assert "ValueError: page x:0!raise cannot be read" in (failed[0].cause or "")
    # Handled in the living actor: no batch went back to the driver as a physical failure.
    assert not [f for f in facts if isinstance(f, GrainRetried)]
    report = audit_run(open_store(store_url), run.run_id)
    assert report.ok, [str(v) for v in report.violations]


class AsyncOverlapRaising(AsyncOverlap):
    """:class:`AsyncOverlap` whose pages of doc ``x`` raise."""

    async def __call__(self, pages: list[str]) -> list[Any]:
        return await super().__call__([f"{p}!raise" if p.startswith("x:") else p
                                       for p in pages])


def test_invalid_max_inflight_is_refused_at_its_line() -> None:
    here = Path(__file__).name
    for bad in (0, -2, "4", 2.5, True):
        with pytest.raises(ce.ModuleDefinitionError) as err:
            ro.RayModule(Pages, max_inflight=bad)
        text = str(err.value)
        assert f"{here}:" in text and f"invalid option max_inflight={bad!r}" in text, text
        assert "an int >= 1" in text, text
    with pytest.raises(ce.ModuleDefinitionError) as err:
        ro.RayModule(Pages, ray_options={"max_concurrency": 4})
    assert f"{here}:" in str(err.value) and "set max_inflight=N" in str(err.value)
    assert ro.RayModule(Pages).ray_options(max_inflight=4).options.max_inflight == 4


class HangOnce:
    """An async stage whose page ``h:0`` hangs on its first attempt (a marker file says)."""

    def __init__(self, n: int, marker_dir: str) -> None:
        self.marker = Path(marker_dir) / "hung"

    async def __call__(self, pages: list[str]) -> list[Any]:
        if "h:0" in pages and not self.marker.exists():
            self.marker.write_text(str(os.getpid()))
            await asyncio.sleep(3600)
        return [(page, 0, 0) for page in pages]


def test_batch_past_timeout_replaces_the_actor_and_its_batch_mates_retry(
        store_url: str, tmp_path: Path) -> None:
    docs = [("a", 3), ("h", 2), ("c", 4)]
    pipeline = Stage(HangOnce, 2, marker_dir=str(tmp_path), timeout_s=5.0)
    run = pipeline.run(docs, store=store_url, progress=False)
    got = run.collect()
    assert [[p[0] for p in doc] for doc in got] == [pages_of(d) for d in docs]
    assert (tmp_path / "hung").exists()
    facts = [s.fact for s in open_store(store_url).iter_facts(run.run_id, 0)]
    retried = [f for f in facts if isinstance(f, GrainRetried)]
    assert any(f.path == (1, 0) and "ran past timeout_s=5.0" in f.cause for f in retried)
    assert set(committed_once(store_url, run.run_id, "model").values()) == {1}
    report = audit_run(open_store(store_url), run.run_id)
    assert report.ok, [str(v) for v in report.violations]
