"""The one driver, without Ray: kills, resumes and store outages against the reference.

The real :class:`~rayorch.runtime.shard_driver.ShardDriver` runs random nested programs
(tests/property/programs.py) on in-process actor pools (tests/property/inline_driver.py: the
real ``ActorPool`` with its Ray calls replaced) and a real :class:`MemoryStore` on a fake
clock. Hypothesis decides which batch finishes next, when the driver process is killed
(nothing more is written; its leases lapse), when the store fails a call before or
after applying it (a lost reply), and how many drivers resume the run. A ``Pipeline.run``
caller (every shard, ordered or not) starts; each resume is ``rayorch resume`` with a
JSONL file sink. At the end every source was delivered exactly once (the caller's one
held item per kill excepted), with the reference's value, and the store audits OK.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inline_driver import TTL, Killed, make_driver
from programs import ProgramSpec, RandomPipeline, programs

from rayorch.core.machine import item_result
from rayorch.core.outcome import FailedResult
from rayorch.core.reference import evaluate
from rayorch.inspect.audit import audit_run
from rayorch.runtime.delivery import CallerSink, IteratorFeed, ManifestFeed
from rayorch.runtime.shard_driver import LeaseMode, ShardDriver
from rayorch.runtime.sinks import FileSink, read_outputs
from rayorch.store.errors import StoreUnavailableError
from rayorch.store.memory import MemoryStore


class Harness:
    """Hypothesis's hand on the physical world: completion order, kills, store faults."""

    def __init__(self, data: st.DataObject, kills: int) -> None:
        self.data = data
        self.kills_left = kills

    def wait(self, refs: list[Any], num_returns: int, timeout: float) -> tuple[list, list]:
        if not refs:
            return [], []
        if self.kills_left and self.data.draw(st.integers(0, 9), label="kill?") == 0:
            self.kills_left -= 1
            raise Killed
        pick = self.data.draw(st.integers(0, len(refs) - 1), label="finishes")
        return [refs[pick]], [r for i, r in enumerate(refs) if i != pick]


class FlakyStore(MemoryStore):
    """A memory store whose append and commit sometimes fail, before or after applying."""

    data: st.DataObject | None = None
    outages = 0

    def _fault(self) -> str | None:
        # At most 2 outages: with 2 kills a Grain's 5 attempts (programs.MAX_ATTEMPTS) are
        # never used up by infrastructure faults alone (each may re-dispatch it once).
        if self.data is None or self.outages >= 2:
            return None
        fault = self.data.draw(st.sampled_from([None] * 8 + ["before", "after"]), label="store")
        if fault is not None:
            self.outages += 1
        return fault

    def append(self, *args: Any, **kwargs: Any) -> list[int]:
        fault = self._fault()
        if fault == "before":
            raise StoreUnavailableError(self.url, "unreachable (injected)")
        out = super().append(*args, **kwargs)
        if fault == "after":
            raise StoreUnavailableError(self.url, "reply lost (injected)")
        return out

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        fault = self._fault()
        if fault == "before":
            raise StoreUnavailableError(self.url, "unreachable (injected)")
        out = super().commit(*args, **kwargs)
        if fault == "after":
            raise StoreUnavailableError(self.url, "reply lost (injected)")
        return out


def expected_record(value: Any) -> Any:
    if isinstance(value, FailedResult):
        return value.outcome.value
    return value


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(spec=programs, values=st.lists(st.integers(0, 10_000), min_size=1, max_size=8,
                                      unique=True),
       ordered=st.booleans(), shards=st.integers(1, 3), kills=st.integers(0, 2),
       data=st.data())
def test_killed_and_resumed_driver_delivers_every_source_once(
    spec: ProgramSpec, values: list[int], ordered: bool, shards: int, kills: int,
    data: st.DataObject, tmp_path_factory: pytest.TempPathFactory,
) -> None:
    pipeline = RandomPipeline(spec)
    plan = pipeline.compile()
    rows = [(v,) for v in values]
    pipeline.registry.clear()
    reference = evaluate(plan, rows).outputs
    pipeline.registry.clear()
    now = [0.0]
    store = FlakyStore(f"memory://driver-machine-{id(data)}", clock=lambda: now[0])
    run_id = "run"
    store.open_run(run_id, plan, shards=shards, micro_batch=2)
    harness = Harness(data, kills)
    store.data = data
    out_dir = tmp_path_factory.mktemp("out")
    received: list[int] = []
    dead: list[ShardDriver] = []  # a killed driver is never closed (no last writes)

    first = make_driver(store, plan, run_id, harness, mode=LeaseMode.HOLD_ALL,
                        feed=IteratorFeed(iter(rows), store.run_info(run_id), len(rows)),
                        sink=CallerSink(ordered), driver_id="caller")
    try:
        for index, value in first.results():
            assert expected_record(value) == expected_record(
                item_result(index, reference[index], plan.output_names))
            received.append(index)
        first.close()
    except Killed:
        dead.append(first)
    caller_killed = killed = bool(dead)
    number = 0
    while killed:
        number += 1
        now[0] += TTL + 1  # the dead driver's leases lapse
        sink = FileSink(out_dir, "jsonl", run_id=run_id)
        resumer = make_driver(store, plan, run_id, harness, mode=LeaseMode.SHARE,
                              feed=ManifestFeed(rows, store.run_info(run_id)), sink=sink,
                              driver_id=f"resume-{number}")
        try:
            for _ in resumer.results():
                pass
            resumer.close()
            killed = False
        except Killed:
            dead.append(resumer)
    store.data = None
    written = {int(r["index"]): r for r in read_outputs(out_dir)} if dead else {}
    counts = Counter(received) + Counter(written.keys())
    assert sorted(counts) == list(range(len(rows))), f"lost {set(range(len(rows))) - set(counts)}"
    # Only the item the killed caller held may arrive twice (once more, from the resume).
    assert sum(n - 1 for n in counts.values()) <= int(caller_killed), counts
    for index, record in written.items():
        value = item_result(index, reference[index], plan.output_names)
        if isinstance(value, FailedResult):
            assert record["outcome"] == value.outcome.value, record
        else:
            assert record.get("value") == (list(value) if isinstance(value, tuple) else value), (
                record)
    report = audit_run(store, run_id)
    assert report.ok, report.violations
