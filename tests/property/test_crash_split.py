"""A record that crashes its actor fails alone (core/crash_split.py), on the real driver.

The real :class:`~rayorch.runtime.shard_driver.ShardDriver` and ``ActorPool`` run with
in-process actors (tests/property/inline_driver.py) whose actor *dies* when it runs a batch
holding a poison record: that batch and every other batch on the actor fail with an actor
error, as on Ray. Hypothesis picks the batch size, replicas, ``max_inflight``,
``max_attempts``, the poison records and which batch finishes next. Whatever it picks:

* every other record gives the reference's value (the plain sequential evaluation), and
  is never charged an attempt for a neighbour's crash;
* each poison record fails alone, with its actor's death as the cause, after exactly
  ``max_attempts`` charged deaths and at most ``uncharged_budget(batch_size)`` others;
* the run audits OK.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from inline_driver import InlinePool, make_driver

import rayorch as ro
from rayorch.actors.pool import InFlightBatch
from rayorch.actors.worker import BatchResult
from rayorch.core.crash_split import uncharged_budget
from rayorch.core.facts import GrainCommitted, GrainFailed, GrainRetried
from rayorch.core.outcome import FailedResult
from rayorch.core.reference import evaluate
from rayorch.core.run_view import fold_shard
from rayorch.inspect.audit import audit_run, entity_story
from rayorch.inspect.show import lineage, lineage_lines
from rayorch.runtime.delivery import CallerSink, IteratorFeed
from rayorch.runtime.shard_driver import LeaseMode
from rayorch.store.memory import MemoryStore


class Times10:
    def __call__(self, xs: list[int]) -> list[int]:
        return [10 * x for x in xs]


class OneStage(ro.Pipeline):
    def __init__(self, batch_size: int, replicas: int, inflight: int, attempts: int) -> None:
        super().__init__()
        self.work = ro.RayModule(Times10, batch_size=batch_size, replicas=replicas,
                                 max_inflight=inflight, max_attempts=attempts)

    def forward(self, xs: Any) -> Any:
        return self.work(xs)


def poison_pool(poison: frozenset[int]) -> type[InlinePool]:
    class PoisonPool(InlinePool):
        """Running a batch with a poison record kills the actor: that batch, and every
        batch still on the actor, fails with an actor error."""

        def _fetch(self, batch: InFlightBatch) -> BatchResult:
            actor = batch.ref.actor
            if actor.alive and any(row[0] in poison for row in batch.ref.task.rows):
                actor.alive = False
            return super()._fetch(batch)

    return PoisonPool


class AnyOrder:
    """Hypothesis decides which batch in flight finishes next."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def wait(self, refs: list[Any], num_returns: int, timeout: float) -> tuple[list, list]:
        if not refs:
            return [], []
        pick = self.data.draw(st.integers(0, len(refs) - 1), label="finishes")
        return [refs[pick]], [r for i, r in enumerate(refs) if i != pick]


def run_with_poison(data: st.DataObject, sources: list[int], poison: frozenset[int],
                    pipeline: OneStage, name: str) -> tuple[dict[int, Any], MemoryStore]:
    store = MemoryStore(f"memory://crash-split-{name}")
    plan = pipeline.compile()
    store.open_run(name, plan, shards=1, micro_batch=len(sources))
    rows = [(x,) for x in sources]
    driver = make_driver(store, plan, name, AnyOrder(data), mode=LeaseMode.HOLD_ALL,
                         feed=IteratorFeed(iter(rows), store.run_info(name), len(rows)),
                         sink=CallerSink(True), driver_id="caller",
                         pool_class=poison_pool(poison))
    outputs = dict(driver.results())
    driver.close()
    return outputs, store


def grain_facts(store: MemoryStore, run_id: str) -> dict[int, list[Any]]:
    by_source: dict[int, list[Any]] = {}
    for stored in store.read(run_id, 0):
        fact = stored.fact
        if isinstance(fact, GrainRetried | GrainFailed | GrainCommitted):
            by_source.setdefault(fact.path[0], []).append(fact)
    return by_source


RUNS = iter(range(10**9))


@given(data=st.data(), size=st.integers(1, 10), batch_size=st.integers(1, 6),
       replicas=st.integers(1, 2), inflight=st.integers(1, 2), attempts=st.integers(1, 3))
def test_a_poison_record_fails_alone_within_its_bound(
    data: st.DataObject, size: int, batch_size: int, replicas: int, inflight: int,
    attempts: int,
) -> None:
    sources = list(range(size))
    poison = frozenset(data.draw(st.sets(st.sampled_from(sources), max_size=2), label="poison"))
    pipeline = OneStage(batch_size, replicas, inflight, attempts)
    name = f"run-{next(RUNS)}"
    outputs, store = run_with_poison(data, sources, poison, pipeline, name)
    reference = evaluate(pipeline.compile(), [(x,) for x in sources])
    facts = grain_facts(store, name)
    bound = uncharged_budget(batch_size) + attempts
    for index in sources:
        own = facts[index]
        if index in poison:
            value = outputs[index]
            assert isinstance(value, FailedResult), (index, value)
            assert value.outcome is ro.ItemOutcome.FAILED
            assert "actor of 'work' died" in value.cause and "the actor died" in value.cause
            charged = [f for f in own if isinstance(f, GrainRetried) and f.charged]
            assert len(charged) == attempts - 1, own  # then GrainFailed: max_attempts deaths
            assert isinstance(own[-1], GrainFailed) and own[-1].generation < bound, own
        else:
            assert outputs[index] == reference.outputs[index][0].value, (index, outputs[index])
            assert not any(isinstance(f, GrainRetried) and f.charged for f in own), own
            assert not any(isinstance(f, GrainFailed) for f in own), own
            assert all(f.generation <= uncharged_budget(batch_size) for f in own), own
    assert audit_run(store, name).ok


class Scripted:
    """Batches finish in a scripted order (index into the refs in flight), then first-sent."""

    def __init__(self, picks: list[int]) -> None:
        self.picks = picks

    def wait(self, refs: list[Any], num_returns: int, timeout: float) -> tuple[list, list]:
        if not refs:
            return [], []
        pick = min(self.picks.pop(0), len(refs) - 1) if self.picks else 0
        return [refs[pick]], [r for i, r in enumerate(refs) if i != pick]


def scripted_run(picks: list[int], sources: list[int], poison: frozenset[int],
                 pipeline: OneStage, name: str
                 ) -> tuple[dict[int, Any], dict[int, list[Any]], MemoryStore]:
    store = MemoryStore(f"memory://crash-split-{name}")
    plan = pipeline.compile()
    store.open_run(name, plan, shards=1, micro_batch=len(sources))
    rows = [(x,) for x in sources]
    driver = make_driver(store, plan, name, Scripted(picks), mode=LeaseMode.HOLD_ALL,
                         feed=IteratorFeed(iter(rows), store.run_info(name), len(rows)),
                         sink=CallerSink(True), driver_id="caller",
                         pool_class=poison_pool(poison))
    outputs = dict(driver.results())
    driver.close()
    assert audit_run(store, name).ok
    return outputs, grain_facts(store, name), store


def show_text(store: MemoryStore, run_id: str, index: int) -> str:
    """What ``rayorch show RUN INDEX`` prints."""
    stored = entity_story(store, run_id, (index,))
    view = fold_shard(index, ((s.seq, s.fact) for s in stored))
    return "\n".join(lineage_lines(lineage(view, (index,))))


def test_a_batch_of_one_queued_behind_a_poison_one_is_not_charged() -> None:
    """Frozen from Hypothesis (crashes charged like any failure): two batches of one on one
    actor, the poison one first; its neighbour died with it and must not lose an attempt."""
    outputs, facts, _ = scripted_run([], [0, 1], frozenset({0}), OneStage(1, 1, 1, 1),
                                     "queued")
    assert outputs[1] == 10 and isinstance(outputs[0], FailedResult)
    assert [type(f) for f in facts[1]] == [GrainRetried, GrainCommitted]
    assert not facts[1][0].charged and facts[1][0].alone


def test_a_crash_retry_has_its_actor_to_itself() -> None:
    """Frozen from Hypothesis (retries not isolated): a poison record and its batch-mate,
    batch_size 2, one actor: the halves go one at a time, the batch-mate is never charged."""
    outputs, facts, store = scripted_run([0, 0, 0, 1, 0], [0, 1], frozenset({0}),
                                         OneStage(2, 1, 1, 2), "isolated")
    assert outputs[1] == 10 and isinstance(outputs[0], FailedResult)
    assert all(not f.charged for f in facts[1] if isinstance(f, GrainRetried))
    poison = [f for f in facts[0] if isinstance(f, GrainRetried)]
    assert [(f.limit, f.charged) for f in poison] == [(1, False), (1, True)]  # split, blamed
    shown = show_text(store, "isolated", 0)  # rayorch show says what happened
    assert "(on an actor of its own, in a batch of at most 1, not charged)" in shown
    assert "(on an actor of its own, in a batch of at most 1)" in shown
    assert "FAILED after 3 attempts: actor of 'work' died" in shown


def test_no_fresh_batch_joins_a_crash_retry_planned_in_the_same_turn() -> None:
    """Frozen from Hypothesis (the real code): two actors, poison records 1 and 4, batch 4.
    In one dispatch turn [0] was planned alone on an idle actor, then a fresh [4] was
    planned on the same actor (not sent yet, it looked free) and killed [0], charged."""
    outputs, facts, _ = scripted_run([0, 0, 0, 1, 1, 0, 0, 0, 0, 0], list(range(5)),
                                     frozenset({1, 4}), OneStage(4, 2, 1, 1), "same-turn")
    assert [outputs[i] for i in (0, 2, 3)] == [0, 20, 30]
    assert isinstance(outputs[1], FailedResult) and isinstance(outputs[4], FailedResult)
    assert not any(isinstance(f, GrainRetried) and f.charged for f in facts[0])
