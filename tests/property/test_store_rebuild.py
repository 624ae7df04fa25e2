"""Folding a shard's stored facts rebuilds the state the live driver had."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayorch.core.facts import REPORT_GROUP_FAILURE, Fact, GrainCommitted, LeaseAcquired
from rayorch.core.machine import barrier_fact
from rayorch.core.plan import Plan
from rayorch.store import LineageStore, open_store
from rayorch.store.scripted_run import scripted_plan, write_scripted_run

state = pytest.importorskip("rayorch.core.state")


class RecordingStore:
    """Passes every call to a store and keeps, per shard, the facts as the driver wrote them."""

    def __init__(self, inner: LineageStore) -> None:
        self.inner = inner
        self.written: dict[int, list[Fact]] = {}
        self.micro_batch = self.shards = 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def open_run(self, run_id: str, plan: Plan, **kw: Any) -> Any:
        self.shards, self.micro_batch = kw["shards"], kw["micro_batch"]
        return self.inner.open_run(run_id, plan, **kw)

    def acquire_lease(self, run_id: str, shard: int, driver: str, ttl_s: float) -> int:
        epoch = self.inner.acquire_lease(run_id, shard, driver, ttl_s)
        self.written.setdefault(shard, []).append(LeaseAcquired(shard, driver, epoch))
        return epoch

    def append(self, run_id: str, shard: int, epoch: int, facts: Sequence[Fact]) -> list[int]:
        seqs = self.inner.append(run_id, shard, epoch, facts)
        self.written.setdefault(shard, []).extend(facts)
        return seqs

    def commit(self, run_id: str, reports: Sequence[GrainCommitted]) -> Any:
        verdicts = self.inner.commit(run_id, reports)
        for r, verdict in zip(reports, verdicts):
            if verdict.accepted:
                shard = (r.path[0] // self.micro_batch) % self.shards
                self.written.setdefault(shard, []).append(r)
                if r.outcome == REPORT_GROUP_FAILURE and len(r.path) > 1:
                    self.written[shard].append(barrier_fact(r))
        return verdicts


def fold(plan: Plan, facts: Sequence[Fact]) -> dict[str, Any]:
    kernel = state.Kernel(plan)
    for fact in facts:
        kernel.apply(fact)
    kernel.validate()
    return cast(dict[str, Any], kernel.snapshot())


runs = st.fixed_dictionaries({
    "pages": st.lists(st.integers(0, 4), min_size=1, max_size=6),
    "shards": st.integers(1, 3),
    "micro_batch": st.integers(1, 3),
    "record_failure": st.none() | st.tuples(st.integers(0, 5), st.integers(0, 3)),
    "group_failure": st.none() | st.tuples(st.integers(0, 5), st.integers(0, 3)),
    "retry": st.none() | st.tuples(st.integers(0, 5), st.integers(0, 3)),
})


def check_rebuild(store: LineageStore, params: dict[str, Any]) -> None:
    recording = RecordingStore(store)
    run = f"rb-{uuid.uuid4().hex[:10]}"
    write_scripted_run(cast(LineageStore, recording), run, **params)
    plan = Plan.from_description(store.run_info(run).plan)
    for shard in range(params["shards"]):
        stored = [s.fact for s in store.read(run, shard)]
        written = recording.written.get(shard, [])
        assert stored == written
        assert fold(plan, stored) == fold(scripted_plan(), written)


@given(params=runs)
def test_memory_store_rebuild(params: dict[str, Any]) -> None:
    check_rebuild(open_store("memory://"), params)


@pytest.mark.integration
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # fresh run id per example
@given(params=runs)
def test_redis_store_rebuild(redis_url: str, params: dict[str, Any]) -> None:
    store = open_store(redis_url)
    check_rebuild(store, params)
    store.close()
