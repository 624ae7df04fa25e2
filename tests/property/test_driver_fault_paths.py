"""The driver's lease-loss and rejection paths, each a scripted scenario with an assertion.

The real :class:`~rayorch.runtime.shard_driver.ShardDriver` on in-process pools
(tests/property/inline_driver.py) and a real :class:`MemoryStore`, on one fake clock that
the driver's lease timing and the store's lease expiry both read. Each scenario puts the
driver where one guard matters and checks what that guard promises, by count or by what
was delivered, never by a time-out:

* a driver stalled between its lease renewal and a hand-over hands nothing more to its
  caller (the lease is checked before each hand-over, not only by the acknowledgement);
* a fenced refusal after a file sink wrote a part leaves no part behind;
* a report the store rejected but the driver expected is not folded: the driver resyncs
  from the store and the run still ends with the right outputs;
* a take-over re-dispatches every Grain that was in flight, each once.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from inline_driver import TTL, Killed, make_driver

import rayorch as ro
from rayorch.core.facts import (
    GrainCommitted,
    GrainDispatched,
    GrainFailed,
    GrainRetried,
    OutputEmitted,
    SourceAdmitted,
)
from rayorch.core.plan import Plan
from rayorch.inspect.audit import audit_run
from rayorch.runtime import shard_driver, shard_leases
from rayorch.runtime.delivery import CallerSink, IteratorFeed, ManifestFeed
from rayorch.runtime.shard_driver import LeaseLostStop, LeaseMode, ShardDriver
from rayorch.runtime.sink_audit import check_delivery
from rayorch.runtime.sinks import FileSink, read_outputs
from rayorch.store.errors import FencedError
from rayorch.store.memory import MemoryStore

SOURCES = list(range(6))


class Double:
    def __call__(self, xs: list[int]) -> list[int]:
        return [2 * x for x in xs]


class Doubler(ro.Pipeline):
    def __init__(self) -> None:
        super().__init__()
        self.double = ro.RayModule(Double, batch_size=2)

    def forward(self, xs: Any) -> Any:
        return self.double(xs)


class Clock:
    """The one clock of a scenario: the driver's ``time`` module and the store's clock."""

    def __init__(self) -> None:
        self.now = time.monotonic()  # ShardState.renewed starts from the real clock

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def lapse(self) -> None:
        """Past every lease's TTL (a stopped process, a long GC pause, a partition)."""
        self.now += TTL + 1


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    for module in (shard_driver, shard_leases):
        monkeypatch.setattr(module, "time", fake)
    return fake


class InOrder:
    """Batches finish in the order they were sent; ``before`` runs first on each wait."""

    def __init__(self, before: Callable[[int], None] = lambda _: None) -> None:
        self.before, self.waits = before, 0

    def wait(self, refs: list[Any], num_returns: int, timeout: float) -> tuple[list, list]:
        if not refs:
            return [], []
        self.waits += 1
        self.before(self.waits)
        return [refs[0]], refs[1:]


def new_run(clock: Clock, name: str) -> tuple[MemoryStore, Plan, str]:
    store = MemoryStore(f"memory://fault-paths-{name}-{id(clock)}", clock=clock.time)
    plan = Doubler().compile()
    store.open_run(name, plan, shards=1, micro_batch=len(SOURCES))
    return store, plan, name


def caller_driver(store: MemoryStore, plan: Plan, run_id: str, harness: InOrder,
                  sink: CallerSink | None = None) -> ShardDriver:
    rows = [(x,) for x in SOURCES]
    return make_driver(store, plan, run_id, harness, mode=LeaseMode.HOLD_ALL,
                       feed=IteratorFeed(iter(rows), store.run_info(run_id), len(rows)),
                       sink=sink or CallerSink(True), driver_id="caller")


def resume_driver(store: MemoryStore, plan: Plan, run_id: str, harness: InOrder,
                  sink: FileSink, driver_id: str = "resume",
                  sleep: Callable[[float], None] | None = None) -> ShardDriver:
    rows = [(x,) for x in SOURCES]
    return make_driver(store, plan, run_id, harness, mode=LeaseMode.SHARE,
                       feed=ManifestFeed(rows, store.run_info(run_id)), sink=sink,
                       driver_id=driver_id, sleep=sleep or idle_at_most(100))


def idle_at_most(turns: int) -> Callable[[float], None]:
    """A driver's idle wait that fails once it idled ``turns`` times: a run whose shard
    never moves (a Grain in flight nobody re-sends) fails here, not at pytest's timeout."""
    idled = 0

    def idle(seconds: float) -> None:
        nonlocal idled
        idled += 1
        assert idled < turns, f"the driver idled {idled} times: its held shards never move"

    return idle


def finish(driver: ShardDriver) -> list[int]:
    got = [index for index, _ in driver.results()]
    driver.close()
    return got


def steal_lease(store: MemoryStore, run_id: str, clock: Clock) -> int:
    """Another driver takes shard 0 over once the holder's lease has lapsed."""
    clock.lapse()
    return store.acquire_lease(run_id, 0, "thief", TTL)


class StallBeforeSecondHandOver(CallerSink):
    """The driver stops (SIGSTOP, a GC pause) after handing over its first item and
    acknowledging it, just before the second hand-over; meanwhile another driver takes
    its shard over."""

    def __init__(self, stall: Callable[[], None]) -> None:
        super().__init__(True)
        self.stall, self.handed = stall, 0

    def take(self) -> Iterator[tuple[int, Any]]:
        for entry in super().take():
            if self.handed == 1:
                self.stall()
            self.handed += 1
            yield entry


def test_a_driver_stalled_before_a_hand_over_hands_nothing_more(clock: Clock) -> None:
    store, plan, run_id = new_run(clock, "stalled")
    sink = StallBeforeSecondHandOver(lambda: steal_lease(store, run_id, clock))
    driver = caller_driver(store, plan, run_id, InOrder(), sink)
    received: list[int] = []
    with pytest.raises(LeaseLostStop, match="lease lost"):
        for index, _ in driver.results():
            received.append(index)
    assert received == [0], "the deposed driver handed an item over after its lease lapsed"
    assert store.lease_holder(run_id, 0).driver == "thief"  # type: ignore[union-attr]


class StolenAfterWrite(FileSink):
    """A file sink whose driver loses its lease between writing a part and recording it."""

    def __init__(self, out: Path, run_id: str, steal: Callable[[], None]) -> None:
        super().__init__(out, "jsonl", run_id=run_id)
        self.steal, self.parts_written = steal, 0

    def write_part(self, shard: int, records: Sequence[tuple[int, Any]], **kw: Any) -> list[Any]:
        facts = super().write_part(shard, records, **kw)
        self.parts_written += 1
        if self.parts_written == 1:
            self.steal()
        return facts


def test_a_fenced_refusal_after_a_part_is_written_leaves_no_part(
        clock: Clock, tmp_path: Path) -> None:
    store, plan, run_id = new_run(clock, "fenced-part")
    out = tmp_path / "out"
    sink = StolenAfterWrite(out, run_id, lambda: steal_lease(store, run_id, clock))

    def killed_while_idle(seconds: float) -> None:
        raise Killed  # it lost its only shard and waits for work: look at what it left

    driver = resume_driver(store, plan, run_id, InOrder(), sink, driver_id="deposed",
                           sleep=killed_while_idle)
    with pytest.raises(Killed):
        finish(driver)
    assert sink.parts_written == 1 and driver.counters.shards_lost == 1
    assert sorted(p.name for p in out.glob("part-*")) == [], "a refused part was left behind"
    # The thief's lease lapses too; the next driver delivers every source exactly once.
    clock.lapse()
    finish(resume_driver(store, plan, run_id, InOrder(), FileSink(out, "jsonl", run_id=run_id)))
    assert sorted(int(r["index"]) for r in read_outputs(out)) == SOURCES
    assert audit_run(store, run_id).ok


class LandsThenFenced(MemoryStore):
    """The append recording the first part lands, its reply is lost, and by the client's
    retry another driver has taken the shard: the retry is refused as fenced."""

    def __init__(self, url: str, clock: Clock, run_id: str) -> None:
        super().__init__(url, clock=clock.time)
        self.scenario_clock, self.run_id, self.landed = clock, run_id, False

    def append(self, run_id: str, shard: int, epoch: int, facts: Sequence[Any], *,
               driver: str, basis: Any = None) -> list[int]:
        seqs = super().append(run_id, shard, epoch, facts, driver=driver, basis=basis)
        if not self.landed and any(isinstance(f, OutputEmitted) for f in facts):
            self.landed = True
            thief = steal_lease(self, run_id, self.scenario_clock)
            raise FencedError(run_id, shard, epoch, thief, "thief")
        return seqs


def test_a_part_whose_record_landed_before_a_fenced_retry_is_kept(
        clock: Clock, tmp_path: Path) -> None:
    """A deposed driver removes a part only when the store does not hold its record: the
    part an ``OutputEmitted`` names stays, and the run ends with every source once."""
    store = LandsThenFenced(f"memory://fault-paths-landed-{id(clock)}", clock, "landed")
    plan = Doubler().compile()
    run_id = "landed"
    store.open_run(run_id, plan, shards=1, micro_batch=2)
    out = tmp_path / "out"

    def killed_while_idle(seconds: float) -> None:
        raise Killed  # it lost its only shard and waits for work: look at what it left

    driver = resume_driver(store, plan, run_id, InOrder(), FileSink(out, "jsonl", run_id=run_id),
                           driver_id="deposed", sleep=killed_while_idle)
    with pytest.raises(Killed):
        finish(driver)
    assert store.landed and driver.counters.shards_lost == 1
    named = {f.fact.sink.partition(":")[2] for f in store.read(run_id, 0)
             if isinstance(f.fact, OutputEmitted)}
    assert named and named <= {p.name for p in out.glob("part-*")}, "a recorded part is gone"
    clock.lapse()
    finish(resume_driver(store, plan, run_id, InOrder(), FileSink(out, "jsonl", run_id=run_id)))
    assert sorted(int(r["index"]) for r in read_outputs(out)) == SOURCES
    assert audit_run(store, run_id).ok
    emitted = [f.fact for f in store.read(run_id, 0) if isinstance(f.fact, OutputEmitted)]
    assert check_delivery(out, emitted, complete=True) == []


class RejectsFirstReport(MemoryStore):
    """The store's state disagrees with the driver's once: the first report it is sent
    carries another generation than the store's (as after another driver re-dispatched
    it), so the commit gate rejects it as stale without applying it."""

    rejected: GrainCommitted | None = None

    def commit(self, run_id: str, reports: Sequence[GrainCommitted], *,
               token: str | None = None) -> Any:
        if self.rejected is None and reports:
            self.rejected = reports[0]
            reports = [replace(reports[0], generation=reports[0].generation + 7),
                       *reports[1:]]
        return super().commit(run_id, reports, token=token)


def test_a_rejected_expected_report_resyncs_instead_of_folding(
        clock: Clock, tmp_path: Path) -> None:
    store = RejectsFirstReport(f"memory://fault-paths-rejected-{id(clock)}", clock=clock.time)
    plan = Doubler().compile()
    run_id = "rejected"
    store.open_run(run_id, plan, shards=1, micro_batch=len(SOURCES))
    driver = caller_driver(store, plan, run_id, InOrder())
    got = dict(driver.results())
    driver.close()
    assert store.rejected is not None
    assert driver.counters.resyncs == 1, "a rejected expected report was folded as accepted"
    assert got == {x: 2 * x for x in SOURCES}
    commits = [f.fact for f in store.read(run_id, 0) if isinstance(f.fact, GrainCommitted)]
    rejected = (store.rejected.call, store.rejected.path)
    assert [c.generation for c in commits if (c.call, c.path) == rejected] == [
        store.rejected.generation + 1], "the rejected Grain was not run again after the resync"
    assert audit_run(store, run_id).ok


def in_flight(store: MemoryStore, run_id: str) -> dict[tuple[Any, Any], int]:
    """Grains of shard 0 dispatched and not yet decided, by the store's own facts."""
    flying: dict[tuple[Any, Any], int] = {}
    for stored in store.read(run_id, 0):
        fact = stored.fact
        if isinstance(fact, GrainDispatched):
            flying[(fact.call, fact.path)] = fact.generation
        elif isinstance(fact, GrainCommitted | GrainRetried | GrainFailed):
            flying.pop((fact.call, fact.path), None)
    return flying


def kill_at_first_wait(waits: int) -> None:
    raise Killed  # SIGKILL while every batch sent so far is in flight


def test_a_take_over_re_dispatches_every_in_flight_grain(
        clock: Clock, tmp_path: Path) -> None:
    store, plan, run_id = new_run(clock, "take-over")
    with pytest.raises(Killed):
        finish(caller_driver(store, plan, run_id, InOrder(kill_at_first_wait)))
    orphans = in_flight(store, run_id)
    assert len(orphans) >= 2, orphans  # several batches were in flight when it died
    clock.lapse()
    out = tmp_path / "out"
    idle: list[float] = []

    def idles(seconds: float) -> None:  # nothing in flight, nothing to do, a shard held
        idle.append(seconds)
        clock.sleep(seconds)
        assert len(idle) < 20, "the new holder idles: its in-flight Grains were never re-sent"

    resumer = resume_driver(store, plan, run_id, InOrder(), FileSink(out, "jsonl", run_id=run_id),
                            sleep=idles)
    finish(resumer)
    assert resumer.counters.grains_rerun == len(orphans)
    redispatched: dict[tuple[Any, Any], list[int]] = {}
    for stored in store.read(run_id, 0):
        fact = stored.fact
        if isinstance(fact, GrainDispatched) and (fact.call, fact.path) in orphans:
            redispatched.setdefault((fact.call, fact.path), []).append(fact.generation)
    for grain, generation in orphans.items():
        later = [g for g in redispatched[grain] if g > generation]
        assert len(later) == 1, (grain, redispatched[grain])
    assert sorted(int(r["index"]) for r in read_outputs(out)) == SOURCES
    assert audit_run(store, run_id).ok


class SnapshotAtFirstPart(FileSink):
    """Keeps a copy of the store's state when its driver starts writing its first part
    (later batches still in flight): what a store restored from an older snapshot, or an
    AOF cut short by an OS crash, holds."""

    def __init__(self, out: Path, run_id: str, store: MemoryStore) -> None:
        super().__init__(out, "jsonl", run_id=run_id)
        self.store, self.snapshot, self.parts = store, None, 0

    def write_part(self, shard: int, records: Sequence[tuple[int, Any]], **kw: Any) -> list[Any]:
        self.parts += 1
        if self.parts == 1:
            self.snapshot = copy.deepcopy(self.store._runs)
        return super().write_part(shard, records, **kw)


def test_after_a_store_rollback_outputs_already_in_parts_are_adopted_not_written_again(
        clock: Clock, tmp_path: Path) -> None:
    """The run completes; then the store goes back to a state from before most of its
    deliveries. The next driver recomputes those sources, batch by batch; each one a part
    already holds is adopted from it whenever it becomes ready (not only in its first
    delivery), so no source is in two parts and the audit is clean."""
    store = MemoryStore(f"memory://fault-paths-rollback-{id(clock)}", clock=clock.time)
    plan = Doubler().compile()
    run_id = "rolled-back"
    store.open_run(run_id, plan, shards=1, micro_batch=2)
    out = tmp_path / "out"
    first = SnapshotAtFirstPart(out, run_id, store)
    finish(resume_driver(store, plan, run_id, InOrder(), first))
    assert first.parts >= 2 and first.snapshot is not None
    store._runs = first.snapshot  # the rollback
    clock.lapse()
    finish(resume_driver(store, plan, run_id, InOrder(), FileSink(out, "jsonl", run_id=run_id),
                         driver_id="after-rollback"))
    assert sorted(int(r["index"]) for r in read_outputs(out)) == SOURCES  # each once
    assert audit_run(store, run_id).ok


class LosesOneCommit(MemoryStore):
    """A store that acknowledges the ``lose``-th commit, then goes back to the state from
    before it at the driver's next append: an OS crash under ``appendfsync everysec`` right
    after the commit's reply, with the driver's lease kept (it never noticed)."""

    lose = 2
    commits = 0
    before: Any = None
    lost: GrainCommitted | None = None

    def commit(self, run_id: str, reports: Sequence[GrainCommitted], *,
               token: str | None = None) -> Any:
        self.commits += 1
        if self.commits == self.lose:
            self.before, self.lost = copy.deepcopy(self._runs), reports[0]
        return super().commit(run_id, reports, token=token)

    def append(self, run_id: str, shard: int, epoch: int, facts: Sequence[Any], *,
               driver: str, basis: Any = None) -> list[int]:
        if self.before is not None:
            self._runs, self.before = self.before, None  # the rollback
        return super().append(run_id, shard, epoch, facts, driver=driver, basis=basis)


def test_a_commit_the_store_lost_after_acknowledging_it_is_not_built_on(
        clock: Clock, tmp_path: Path) -> None:
    """The driver folded a commit the store then forgot: its next append (the output that
    commit made) is refused, the shard is rebuilt, the Grain runs again, and the part
    already written is adopted: every source once, a clean audit."""
    store = LosesOneCommit(f"memory://fault-paths-lost-commit-{id(clock)}", clock=clock.time)
    plan = Doubler().compile()
    run_id = "lost-commit"
    store.open_run(run_id, plan, shards=1, micro_batch=2)
    out = tmp_path / "out"
    driver = resume_driver(store, plan, run_id, InOrder(), FileSink(out, "jsonl", run_id=run_id))
    finish(driver)
    assert store.lost is not None and driver.counters.rollbacks == 1
    lost = (store.lost.call, store.lost.path)
    commits = [f.fact for f in store.read(run_id, 0) if isinstance(f.fact, GrainCommitted)]
    assert [c.generation for c in commits if (c.call, c.path) == lost] == [
        store.lost.generation + 1], "the Grain whose commit was lost did not run again"
    records = list(read_outputs(out))
    assert sorted(int(r["index"]) for r in records) == SOURCES  # each once
    assert {int(r["index"]): r["value"] for r in records} == {x: 2 * x for x in SOURCES}
    assert audit_run(store, run_id).ok


class GoesBackOnce(MemoryStore):
    """A store that goes back, at the append after it (or at the first append holding an
    ``at`` fact), to the state from before the ``nth`` append holding a ``kind`` fact: an
    OS crash right after the store acknowledged it. ``OutputEmitted``: the caller already
    holds that output; ``SourceAdmitted``: the caller's iterator has handed those sources
    over and cannot give them again."""

    def __init__(self, url: str, kind: type, nth: int, clock: Callable[[], float],
                 at: type | None = None) -> None:
        super().__init__(url, clock=clock)
        self.kind, self.nth, self.seen, self.at = kind, nth, 0, at
        self.before: Any = None
        self.forgotten: list[int] = []

    def append(self, run_id: str, shard: int, epoch: int, facts: Sequence[Any], *,
               driver: str, basis: Any = None) -> list[int]:
        if self.before is not None and (
                self.at is None or any(isinstance(f, self.at) for f in facts)):
            self._runs, self.before = self.before, None  # the rollback
        indexes = [f.index for f in facts if isinstance(f, self.kind)]
        if indexes and not self.forgotten:
            self.seen += 1
            if self.seen == self.nth:
                self.before, self.forgotten = copy.deepcopy(self._runs), indexes
        return super().append(run_id, shard, epoch, facts, driver=driver, basis=basis)


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize(("kind", "nth", "at"), [
    (OutputEmitted, 2, None), (SourceAdmitted, 1, None), (SourceAdmitted, 1, OutputEmitted)])
def test_what_a_rolled_back_store_forgot_of_a_caller_run_is_recorded_again_once(
        clock: Clock, ordered: bool, kind: type, nth: int, at: type | None) -> None:
    """`Pipeline.run`'s driver sees the store forget what it had acknowledged:
    * a delivery (the caller holds the output): it rebuilds the shard and records that
      delivery again, never handing the output twice;
    * admissions (its iterator gives a source once): it still has those sources, admits
      them again and delivers each once, instead of ending the run without them;
    * admissions, forgotten at the append of the first delivery (issue 32): the refused
      append does not release that source's row from the feed, so it is admitted again and
      its delivery recorded (the feed lets a row go only once its ``OutputEmitted`` is
      stored, not before the append)."""
    store = GoesBackOnce(
        f"memory://fault-paths-{kind.__name__}-{at and at.__name__}-{ordered}-{id(clock)}",
        kind, nth, clock.time, at)
    plan = Doubler().compile()
    run_id = "forgotten"
    store.open_run(run_id, plan, shards=1, micro_batch=2)
    driver = caller_driver(store, plan, run_id, InOrder(), CallerSink(ordered))
    received = finish(driver)
    assert store.forgotten and driver.counters.rollbacks == 1
    assert sorted(received) == SOURCES, f"handed to the caller: {received}"
    recorded = [f.fact.index for f in store.read(run_id, 0) if isinstance(f.fact, kind)]
    assert sorted(recorded) == SOURCES
    emitted = [f.fact.index for f in store.read(run_id, 0) if isinstance(f.fact, OutputEmitted)]
    assert sorted(emitted) == SOURCES, "a source handed over has no stored OutputEmitted"
    assert audit_run(store, run_id).ok


class LateCommitOnTakeOver(MemoryStore):
    """A dead driver's actor commits one of its in-flight Grains just after the new holder
    read the shard, before the holder's first append (which re-dispatches that Grain)."""

    late: GrainCommitted | None = None
    landed = False

    def append(self, run_id: str, shard: int, epoch: int, facts: Sequence[Any], *,
               driver: str, basis: Any = None) -> list[int]:
        if self.late is not None and not self.landed and any(
                isinstance(f, GrainRetried) for f in facts):
            self.landed = True
            assert self.commit(run_id, [self.late]) == [ro.core.commit.CommitVerdict.ACCEPTED]
        return super().append(run_id, shard, epoch, facts, driver=driver, basis=basis)


def test_a_commit_landing_while_a_shard_is_taken_over_is_kept(clock: Clock, tmp_path: Path
                                                              ) -> None:
    store = LateCommitOnTakeOver(f"memory://fault-paths-late-{id(clock)}", clock=clock.time)
    plan = Doubler().compile()
    run_id = "late-commit"
    store.open_run(run_id, plan, shards=1, micro_batch=len(SOURCES))
    with pytest.raises(Killed):
        finish(caller_driver(store, plan, run_id, InOrder(kill_at_first_wait)))
    (call, path), gen = next(iter(in_flight(store, run_id).items()))
    store.late = GrainCommitted(call, path, gen, "present", (2 * path[0],))
    clock.lapse()
    out = tmp_path / "out"
    idle: list[float] = []

    def idles(seconds: float) -> None:
        idle.append(seconds)
        clock.sleep(seconds)
        assert len(idle) < 50, "the new holder never took the shard over"

    finish(resume_driver(store, plan, run_id, InOrder(), FileSink(out, "jsonl", run_id=run_id),
                         sleep=idles))
    assert store.landed
    commits = [f.fact for f in store.read(run_id, 0) if isinstance(f.fact, GrainCommitted)
               and (f.fact.call, f.fact.path) == (call, path)]
    assert [c.generation for c in commits] == [gen], "the late commit was not kept"
    assert sorted(int(r["index"]) for r in read_outputs(out)) == SOURCES
    assert audit_run(store, run_id).ok
