"""The memory store and the Redis store agree on every operation (a stateful machine)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from programs import nested_plan

from rayorch.core.facts import (
    REPORT_GROUP_FAILURE,
    REPORT_PRESENT,
    REPORT_RECORD_FAILURE,
    Fact,
    GrainCommitted,
    GrainDispatched,
    GrainFailed,
    GrainRetried,
    SourceAdmitted,
)
from rayorch.core.ids import Path
from rayorch.store import GrainSealedError, LeaseLostError, LineageStore, open_store

pytestmark = pytest.mark.integration

PLAN = nested_plan()  # Grains at depth 1 (render, assemble), 2 (split, join) and 3 (ocr)
SHARDS = 2
DRIVERS = ("a", "b")


def sources_of(shard: int) -> st.SearchStrategy[int]:
    return st.sampled_from([i for i in range(4) if i % SHARDS == shard])


def grain_paths(shard: int) -> st.SearchStrategy[tuple[str, Path]]:
    sources = sources_of(shard)
    grandchild = st.tuples(st.just("ocr"), st.tuples(sources, st.integers(0, 1),
                                                     st.integers(0, 2)))
    child = st.tuples(st.sampled_from(["split", "join"]), st.tuples(sources, st.integers(0, 2)))
    root = st.tuples(st.sampled_from(["render", "assemble"]), st.tuples(sources))
    return st.one_of(grandchild, child, root)


def sibling_parents(shard: int) -> st.SearchStrategy[tuple[str, Path]]:
    """A child Call and a parent path: three siblings there can meet a barrier."""
    sources = sources_of(shard)
    return st.one_of(st.tuples(st.just("ocr"), st.tuples(sources, st.integers(0, 1))),
                     st.tuples(st.just("split"), st.tuples(sources)))


def driver_fact(shard: int) -> st.SearchStrategy[Fact]:
    def build(kind: str, grain: tuple[str, Path], gen: int) -> Fact:
        call, path = grain
        if kind == "dispatch":
            return GrainDispatched(call, path, gen)
        if kind == "retry":
            return GrainRetried(call, path, gen, "crash")
        if kind == "fail":
            return GrainFailed(call, path, gen, "gave up")
        return SourceAdmitted(path[0], ("x",))

    return st.builds(build, st.sampled_from(["dispatch", "dispatch", "retry", "fail", "admit"]),
                     grain_paths(shard), st.integers(0, 2))


reports = st.builds(
    lambda grain, gen, outcome: GrainCommitted(
        grain[0], grain[1], gen, outcome,
        ("v",) if outcome == REPORT_PRESENT else None,
        None if outcome == REPORT_PRESENT else "bad"),
    st.one_of(grain_paths(0), grain_paths(1)),
    st.integers(0, 2),
    st.sampled_from([REPORT_PRESENT, REPORT_PRESENT, REPORT_RECORD_FAILURE,
                     REPORT_GROUP_FAILURE]),
)


def outcome(fn: Any) -> Any:
    """The result of a call, or a comparable description of the error it raised."""
    try:
        return ("ok", fn())
    except GrainSealedError as exc:
        return ("error", "GrainSealedError", exc.grains)
    except LeaseLostError as exc:  # who continued the shard, and at which epoch
        return ("error", type(exc).__name__, exc.args)
    except Exception as exc:  # compared between the stores
        return ("error", type(exc).__name__)


class StoresAgree(RuleBasedStateMachine):
    stores: tuple[LineageStore, LineageStore]

    def __init__(self) -> None:
        super().__init__()
        self.run = f"sm-{uuid.uuid4().hex[:10]}"
        for store in self.stores:
            store.open_run(self.run, PLAN, shards=SHARDS, micro_batch=1)
        self.epochs: dict[tuple[int, str], int] = {}

    def both(self, fn: Any) -> Any:
        results = [outcome(lambda s=s: fn(s)) for s in self.stores]
        assert results[0] == results[1]
        return results[0]

    @rule(shard=st.integers(0, SHARDS - 1), driver=st.sampled_from(DRIVERS))
    def acquire(self, shard: int, driver: str) -> None:
        result = self.both(lambda s: s.acquire_lease(self.run, shard, driver, ttl_s=600))
        if result[0] == "ok":
            self.epochs[(shard, driver)] = result[1]

    @rule(shard=st.integers(0, SHARDS - 1), driver=st.sampled_from(DRIVERS),
          back=st.integers(0, 1))
    def reacquire(self, shard: int, driver: str, back: int) -> None:
        after = self.epochs.get((shard, driver), 0) - back
        result = self.both(lambda s: s.acquire_lease(self.run, shard, driver, ttl_s=600,
                                                     after_epoch=after))
        if result[0] == "ok":
            self.epochs[(shard, driver)] = result[1]

    @rule(shard=st.integers(0, SHARDS - 1), driver=st.sampled_from(DRIVERS))
    def release(self, shard: int, driver: str) -> None:
        epoch = self.epochs.get((shard, driver), 0)
        self.both(lambda s: s.release_lease(self.run, shard, driver, epoch))

    @rule(data=st.data(), shard=st.integers(0, SHARDS - 1), driver=st.sampled_from(DRIVERS),
          stale=st.booleans())
    def append(self, data: st.DataObject, shard: int, driver: str, stale: bool) -> None:
        facts = data.draw(st.lists(driver_fact(shard), max_size=4))
        epoch = self.epochs.get((shard, driver), 0) - (1 if stale else 0)
        self.both(lambda s: s.append(self.run, shard, epoch, facts, driver=driver))

    @rule(data=st.data(), shard=st.integers(0, SHARDS - 1), driver=st.sampled_from(DRIVERS))
    def siblings_meet_a_barrier(self, data: st.DataObject, shard: int, driver: str) -> None:
        """Three siblings in flight; one fails its group; the others report after it."""
        call, parent = data.draw(sibling_parents(shard))
        self.acquire(shard, driver)  # held by the other driver: the appends are refused
        epoch = self.epochs.get((shard, driver), 0)
        kids = [(*parent, o) for o in range(3)]
        self.both(lambda s: s.append(self.run, shard, epoch,
                                     [GrainDispatched(call, k, 0) for k in kids], driver=driver))
        self.both(lambda s: s.commit(self.run, [
            GrainCommitted(call, kids[0], 0, REPORT_GROUP_FAILURE, None, "bad"),
            GrainCommitted(call, kids[1], 0, REPORT_PRESENT, ("v",))]))
        self.both(lambda s: s.commit(self.run, [
            GrainCommitted(call, kids[2], 0, REPORT_PRESENT, ("v",))]))

    @rule(data=st.data(), shard=st.integers(0, SHARDS - 1), driver=st.sampled_from(DRIVERS))
    def a_late_report_meets_a_retry(self, data: st.DataObject, shard: int, driver: str) -> None:
        """A Grain is retried and dispatched again; the first attempt's report comes late
        (stale), then the second's (issue 32: random reports seldom name a Grain in flight
        with another generation, and a memory gate accepting stale reports went unseen)."""
        call, path = data.draw(grain_paths(shard))
        self.acquire(shard, driver)
        epoch = self.epochs.get((shard, driver), 0)
        self.both(lambda s: s.append(self.run, shard, epoch, [
            GrainDispatched(call, path, 0), GrainRetried(call, path, 1, "crash"),
            GrainDispatched(call, path, 1)], driver=driver))
        for gen in (0, 1):
            self.both(lambda s, g=gen: s.commit(self.run, [
                GrainCommitted(call, path, g, REPORT_PRESENT, ("v",))]))

    @rule(batch=st.lists(reports, min_size=1, max_size=6))
    def commit(self, batch: list[GrainCommitted]) -> None:
        self.both(lambda s: s.commit(self.run, batch))

    @invariant()
    def same_facts_and_tables(self) -> None:
        for shard in range(SHARDS):
            self.both(lambda s, k=shard: [(f.seq, f.domain, f.fact) for f in s.read(self.run, k)])
            self.both(lambda s, k=shard: s.barriers(self.run, k))
            self.both(lambda s, k=shard: s.lease_holder(self.run, k))


def test_memory_and_redis_stores_agree(redis_url: str) -> None:
    redis_store = open_store(redis_url)

    class Machine(StoresAgree):
        stores = (open_store("memory://"), redis_store)

    Machine.TestCase.settings = settings(settings(), stateful_step_count=25)
    try:
        run_state_machine_as_test(Machine)  # type: ignore[no-untyped-call]
    finally:
        redis_store.close()
