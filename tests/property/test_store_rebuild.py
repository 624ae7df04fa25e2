"""Folding a shard's stored facts rebuilds the state the live driver had."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from programs import ProgramSpec, RandomPipeline, programs

from rayorch.core.commit import CommitVerdict
from rayorch.core.facts import (
    REPORT_GROUP_FAILURE,
    BarrierInstalled,
    Fact,
    GrainCommitted,
    LeaseAcquired,
    barrier_fact,
)
from rayorch.core.plan import Plan
from rayorch.runtime.in_process import ExecutorOptions, execute
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

    def acquire_lease(self, run_id: str, shard: int, driver: str, ttl_s: float, *,
                      after_epoch: int | None = None) -> int:
        epoch = self.inner.acquire_lease(run_id, shard, driver, ttl_s, after_epoch=after_epoch)
        self.written.setdefault(shard, []).append(LeaseAcquired(shard, driver, epoch))
        return epoch

    def append(self, run_id: str, shard: int, epoch: int, facts: Sequence[Fact], *,
               driver: str) -> list[int]:
        seqs = self.inner.append(run_id, shard, epoch, facts, driver=driver)
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


# -- random programs nesting three levels (expand inside expand inside expand) ----------
schedules = st.builds(ExecutorOptions, batch_size=st.sampled_from([None, 1, 3]),
                      seed=st.integers(0, 2**16), random_order=st.booleans(),
                      fault_rate=st.sampled_from([0.0, 0.2]))
sources = st.lists(st.integers(0, 10_000), min_size=1, max_size=3, unique=True)


def check_program_rebuild(store: LineageStore, spec: ProgramSpec, schedule: ExecutorOptions,
                          values: list[int]) -> None:
    """A kernel's fact log written through the store reads back and folds to the same state.

    The driver facts go through fenced appends (one per run of consecutive ones, as a
    driver flushes them), the reports through the commit gate, which writes the barriers.
    """
    pipeline = RandomPipeline(spec)
    plan = pipeline.compile()
    assert len(plan.describe()["domains"]) >= 3  # nested at least two levels below the root
    # The executor ran on a memory store of its own: its lease is not replayed here.
    log = [f for f in execute(plan, [(v,) for v in values], schedule).log
           if not isinstance(f, LeaseAcquired)]
    run = f"rbp-{uuid.uuid4().hex[:10]}"
    store.open_run(run, plan, shards=1, micro_batch=1)
    epoch = store.acquire_lease(run, 0, "d", ttl_s=600)
    pending: list[Fact] = []
    for fact in [*log, None]:
        if pending and (fact is None or type(fact).__name__ not in _DRIVER_FACTS):
            store.append(run, 0, epoch, pending, driver="d")
            pending = []
        if isinstance(fact, GrainCommitted):
            assert store.commit(run, [fact]) == [CommitVerdict.ACCEPTED]
        elif fact is not None and not isinstance(fact, BarrierInstalled):
            pending.append(fact)
    stored = [s.fact for s in store.read(run, 0)]
    assert isinstance(stored[0], LeaseAcquired)
    # the store writes a barrier with its GroupFailure commit, before the facts the kernel
    # derived from that commit; the executor logged it after them (both orders fold alike)
    assert [f for f in stored[1:] if not isinstance(f, BarrierInstalled)] == \
        [f for f in log if not isinstance(f, BarrierInstalled)]
    assert {(f.call, f.parent) for f in stored if isinstance(f, BarrierInstalled)} == \
        {(f.call, f.parent) for f in log if isinstance(f, BarrierInstalled)}
    rebuilt, live = fold(plan, stored), fold(plan, log)
    rebuilt.pop("log")
    live.pop("log")
    assert rebuilt == live


_DRIVER_FACTS = frozenset({"SourceAdmitted", "GrainDispatched", "GrainRetried", "GrainFailed",
                           "ExpansionClosed", "OutputEmitted", "RunCompleted"})


@given(spec=programs, schedule=schedules, values=sources)
def test_memory_store_rebuilds_nested_programs(spec: ProgramSpec, schedule: ExecutorOptions,
                                               values: list[int]) -> None:
    check_program_rebuild(open_store("memory://"), spec, schedule, values)


@pytest.mark.integration
@settings(settings(), max_examples=15,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=programs, schedule=schedules, values=sources)
def test_redis_store_rebuilds_nested_programs(redis_url: str, spec: ProgramSpec,
                                              schedule: ExecutorOptions,
                                              values: list[int]) -> None:
    store = open_store(redis_url)
    check_program_rebuild(store, spec, schedule, values)
    store.close()
