"""The Lua commit gate equals ``core.commit.commit_verdict`` on random report sequences."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from programs import nested_plan

from rayorch.core.commit import CommitVerdict, GrainPhase, commit_verdict
from rayorch.core.facts import (
    REPORT_GROUP_FAILURE,
    REPORT_PRESENT,
    REPORT_RECORD_FAILURE,
    Fact,
    GrainCommitted,
    GrainDispatched,
    GrainFailed,
    GrainRetried,
)
from rayorch.core.ids import GrainKey, Path
from rayorch.store import GrainSealedError, open_store
from rayorch.store.keys import ShardKeys, grain_field
from rayorch.store.records import encode_fact
from rayorch.store.redis_store import COMMIT_BATCH
from rayorch.store.scripted_run import scripted_plan

pytestmark = pytest.mark.integration

PLAN = nested_plan()  # Grains at depth 1 (render), 2 (split) and 3 (ocr)
SHARDS = 2
grains = st.one_of(
    st.tuples(st.just("ocr"), st.tuples(st.integers(0, 3), st.integers(0, 1), st.integers(0, 2))),
    st.tuples(st.just("split"), st.tuples(st.integers(0, 3), st.integers(0, 2))),
    st.tuples(st.just("render"), st.tuples(st.integers(0, 3))),
)
driver_step = st.tuples(st.sampled_from(["dispatch", "dispatch", "retry", "fail"]), grains)
report = st.tuples(grains, st.integers(-1, 1),  # generation relative to the current one
                   st.sampled_from([REPORT_PRESENT, REPORT_RECORD_FAILURE, REPORT_GROUP_FAILURE]))
# Siblings under one parent all dispatched, one fails its group, the others report after it
# (in the same commit call and in a later one): every example exercises the barrier rule.
siblings = st.one_of(
    st.tuples(st.just("ocr"), st.tuples(st.integers(0, 3), st.integers(0, 1))),
    st.tuples(st.just("split"), st.tuples(st.integers(0, 3))),
)
step = st.one_of(driver_step.map(lambda d: ("driver", d)),
                 st.lists(report, min_size=1, max_size=5).map(lambda r: ("commit", r)),
                 siblings.map(lambda s: ("siblings", s)))


class PythonGate:
    """The commit rule applied sequentially, the way the memory store and kernel do."""

    def __init__(self) -> None:
        self.phase: dict[GrainKey, tuple[GrainPhase, int]] = {}
        self.barriers: set[tuple[str, Path]] = set()

    def commit(self, reports: list[GrainCommitted]) -> list[CommitVerdict]:
        verdicts = []
        for r in reports:
            phase, gen = self.phase.get((r.call, r.path)) or (None, 0)
            barred = len(r.path) > 1 and (r.call, r.path[:-1]) in self.barriers
            verdict = commit_verdict(phase, gen, r.generation, barred)
            if verdict.accepted:
                self.phase[(r.call, r.path)] = (GrainPhase.SEALED, r.generation)
                if r.outcome == REPORT_GROUP_FAILURE and len(r.path) > 1:
                    self.barriers.add((r.call, r.path[:-1]))
            verdicts.append(verdict)
        return verdicts


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # fresh run id per example
@given(steps=st.lists(step, min_size=1, max_size=30))
def test_lua_commit_rule_matches_python(redis_url: str, steps: list[tuple[str, Any]]) -> None:
    store = open_store(redis_url)
    run = f"diff-{uuid.uuid4().hex[:10]}"
    store.open_run(run, PLAN, shards=SHARDS, micro_batch=1)
    epochs = [store.acquire_lease(run, k, "d", ttl_s=600) for k in range(SHARDS)]
    gate = PythonGate()

    def drive(action: str, call: str, path: Path) -> None:
        phase, gen = gate.phase.get((call, path)) or (None, 0)
        fact: Fact
        if action == "dispatch":
            fact = GrainDispatched(call, path, gen)
            new = (GrainPhase.IN_FLIGHT, gen)
        elif action == "retry":
            fact = GrainRetried(call, path, gen + 1, "crash")
            new = (GrainPhase.READY, gen + 1)
        else:
            fact = GrainFailed(call, path, gen, "gave up")
            new = (GrainPhase.SEALED, gen)
        shard = path[0] % SHARDS
        if phase is GrainPhase.SEALED:
            with pytest.raises(GrainSealedError):
                store.append(run, shard, epochs[shard], [fact], driver="d")
        else:
            store.append(run, shard, epochs[shard], [fact], driver="d")
            gate.phase[(call, path)] = new

    def commit(reports: list[tuple[tuple[str, Path], int, str]]) -> None:
        batch = []
        for (call, path), delta, outcome in reports:
            gen = max(0, (gate.phase.get((call, path)) or (None, 0))[1] + delta)
            outputs = ("v",) if outcome == REPORT_PRESENT else None
            batch.append(GrainCommitted(call, path, gen, outcome, outputs, "c"))
        expected = gate.commit(batch)
        assert store.commit(run, batch) == expected, batch

    for kind, payload in steps:
        if kind == "driver":
            drive(payload[0], payload[1][0], payload[1][1])
        elif kind == "commit":
            commit(payload)
        else:
            call, parent = payload
            children = [(call, (*parent, o)) for o in range(3)]
            for child in children:
                drive("dispatch", *child)
            commit([(children[0], 0, REPORT_GROUP_FAILURE), (children[1], 0, REPORT_PRESENT)])
            commit([(children[2], 0, REPORT_PRESENT)])
    for (call, path), state in gate.phase.items():
        assert store.grain_phase(run, path[0] % SHARDS, call, path) == state
    assert store.barriers(run, 0) | store.barriers(run, 1) == frozenset(gate.barriers)
    store.close()


def test_a_retried_commit_call_answers_as_the_first_one(redis_url: str) -> None:
    """A commit re-sent after a lost reply (same token) is not a duplicate of itself."""
    store = open_store(redis_url)
    store.open_run("replay", scripted_plan())
    epoch = store.acquire_lease("replay", 0, "d", ttl_s=60)
    store.append("replay", 0, epoch, [GrainDispatched("ocr", (0, 0), 0)], driver="d")
    keys = ShardKeys("replay", 0)
    report = GrainCommitted("ocr", (0, 0), 0, REPORT_PRESENT, ("v",))
    args: list[Any] = [2, "token-1",
            grain_field("ocr", (0, 0)), 2, 0, "ocr|0", "0", 1, encode_fact(report),
            grain_field("ocr", (0, 0)), 2, 0, "ocr|0", "0", 1, encode_fact(report)]
    client = redis.Redis.from_url(redis_url)
    keys_and_args = [keys.barriers, keys.seq, keys.facts("root/0"), keys.grain_bucket("0"),
                     *args]
    assert client.eval(COMMIT_BATCH.source, 4, *keys_and_args) == [1, -3]
    # the replay: same answers, nothing written
    assert client.eval(COMMIT_BATCH.source, 4, *keys_and_args) == [1, -3]
    assert len(store.read("replay", 0, domain="root/0")) == 2  # dispatch + one commit
    assert store.commit("replay", [report]) == [CommitVerdict.SEALED]  # a new call: duplicate
