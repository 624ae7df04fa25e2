"""A kernel that forgets delivered sources decides exactly like one that keeps them.

``Kernel(keep_history=False)`` (the driver's) keeps no fact log and drops everything
about a source once its ``OutputEmitted`` is folded, but its index
(docs/ARCHITECTURE.md, "Bounded driver memory"). Two kernels, one of each kind, fold the
same facts side by side; replayed, late, stale and conflicting facts for any source
(forgotten ones included) must leave both unchanged, and every answer they give (derived
announcements, verdicts, outputs, queues, counters) must agree.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from programs import Behaviour, ProgramSpec, RandomPipeline, programs
from test_kernel_invariance import schedules, sources

from rayorch.core.errors import InvalidTransition, KernelError
from rayorch.core.facts import (
    REPORT_GROUP_FAILURE,
    REPORT_PRESENT,
    REPORT_RECORD_FAILURE,
    BarrierInstalled,
    ExpansionClosed,
    Fact,
    GrainCommitted,
    GrainDispatched,
    GrainFailed,
    GrainRetried,
    OutputEmitted,
    SourceAdmitted,
)
from rayorch.core.ids import GrainKey
from rayorch.core.state import Kernel, rebuild
from rayorch.runtime.in_process import execute

SPEC = ProgramSpec(
    block=(("map",), ("expand", (("filter",), ("expand", (("broadcast", 0),
                                                           ("expand", (("map",),)))))),),
    side_output=True,
    behaviours=(Behaviour(),) * 8,
    batched=(True,) * 8,
)
PIPELINE = RandomPipeline(SPEC)
PLAN = PIPELINE.compile()
SOURCES = 8


def public_view(kernel: Kernel) -> dict[str, Any]:
    """Everything a caller can ask a kernel."""
    calls = list(kernel.tables.calls)
    return {
        "admissible": kernel.admissible(), "ready": kernel.ready_calls(),
        "in_flight": kernel.in_flight, "finished": kernel.finished,
        "run_completed": kernel.run_completed, "outputs_held": kernel.outputs_held,
        "admitted": kernel.admitted,
        "ready_count": [kernel.ready_count(c) for c in calls],
        "suppressed": [kernel.suppressed_count(c) for c in calls],
        "queues": {c: q.live() for c, q in kernel.queues.items()},
    }


def source_of(key: Any) -> int:
    """The source index inside a state key (``(port|call|domain|node, path)`` or a path)."""
    path = key[1] if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], tuple) \
        else key
    return int(path[0])


class KeepVersusForget(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.keep = Kernel(PLAN, max_active_sources=3, total_sources=SOURCES)
        self.lean = Kernel(PLAN, max_active_sources=3, total_sources=SOURCES,
                           keep_history=False)
        self.log: list[Fact] = []
        self.in_flight: list[tuple[GrainKey, int]] = []
        self.admitted = 0

    # -- folding the same fact into both ------------------------------------------------------
    def write(self, fact: Fact) -> None:
        derived = self.keep.apply(fact)
        assert self.lean.apply(fact) == derived, f"announcements differ after {fact!r}"
        self.log.append(fact)
        self.log.extend(derived)

    def replay(self, fact: Fact) -> None:
        """A fact that is history (duplicate, late, stale or conflicting): nothing changes.

        Where the keeping kernel calls it a no-op, so does the forgetting one; where it
        rejects it, the forgetting one rejects it too, unless the source was forgotten, or
        the fact seals a complete source's Grain at its generation: without the log, it
        cannot tell a conflicting fact from a duplicate there, and ignores it.
        """
        before_keep, before_lean = self.keep.snapshot(), self.lean.snapshot()
        logged = len(self.keep.log)
        try:
            kept = self.keep.apply(fact)
        except InvalidTransition:
            kept = None
        try:
            lean = self.lean.apply(fact)
        except InvalidTransition:
            lean = None
        index = fact.index if isinstance(fact, SourceAdmitted | OutputEmitted) else (
            fact.parent if isinstance(fact, BarrierInstalled | ExpansionClosed) else fact.path)
        index = index if isinstance(index, int) else index[0]
        forgotten = index in self.lean._emitted
        settled = index not in self.keep._pending and isinstance(fact, GrainCommitted | GrainFailed)
        if kept is None:
            assert lean is None or ((forgotten or settled) and lean == []), (fact, lean)
        else:
            assert kept == [] and lean == [], (fact, kept, lean)
        # Some history is logged again (OutputEmitted), and a barrier under a complete
        # source is recorded (it changes nothing): the store would hold those facts too.
        self.log.extend(self.keep.log[logged:])
        for before, kernel in ((before_keep, self.keep), (before_lean, self.lean)):
            after = kernel.snapshot()
            for key in ("log", "barriers"):
                before.pop(key), after.pop(key)
            assert after == before, fact

    def value_for(self, grain: GrainKey, size: int) -> Any:
        kind = PIPELINE.kinds[PLAN.call_node(grain[0]).call.module]  # type: ignore[union-attr]
        if kind == "fanout":
            return list(range(size))
        if kind == "pred":
            return size % 3 != 0
        return size

    # -- the protocol ---------------------------------------------------------------------------
    @precondition(lambda self: self.keep.admissible() > 0)
    @rule(value=st.integers(0, 100))
    def admit(self, value: int) -> None:
        self.write(SourceAdmitted(self.admitted, (value,)))
        self.admitted += 1

    @precondition(lambda self: bool(self.keep.ready_calls()))
    @rule(data=st.data(), limit=st.integers(1, 5))
    def dispatch(self, data: st.DataObject, limit: int) -> None:
        call = data.draw(st.sampled_from(self.keep.ready_calls()))
        batch = self.keep.take_batch(call, limit)
        assert self.lean.take_batch(call, limit) == batch
        for grain, gen in batch:
            self.write(GrainDispatched(grain[0], grain[1], gen))
            self.in_flight.append((grain, gen))

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data(), outcome=st.sampled_from(["v", "v", "v", "rf", "gf"]),
          size=st.integers(0, 4))
    def report(self, data: st.DataObject, outcome: str, size: int) -> None:
        grain, gen = self.in_flight.pop(data.draw(st.integers(0, len(self.in_flight) - 1)))
        if outcome == "v":
            fact = GrainCommitted(grain[0], grain[1], gen, REPORT_PRESENT,
                                  (self.value_for(grain, size),))
        else:
            kind = REPORT_RECORD_FAILURE if outcome == "rf" else REPORT_GROUP_FAILURE
            fact = GrainCommitted(grain[0], grain[1], gen, kind, None, "user says no")
        accepted = self.keep.verdict(fact).accepted
        assert self.lean.verdict(fact).accepted == accepted
        if not accepted:
            self.replay(fact)
            return
        self.write(fact)
        if outcome == "gf" and len(grain[1]) > 1:
            self.write(BarrierInstalled(grain[0], grain[1][:-1], "user says no"))

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data())
    def physical_failure(self, data: st.DataObject) -> None:
        count = data.draw(st.integers(1, len(self.in_flight)))
        batch, self.in_flight = self.in_flight[:count], self.in_flight[count:]
        facts = self.keep.physical_failure(batch, "RuntimeError: crash")
        assert self.lean.physical_failure(batch, "RuntimeError: crash") == facts
        for fact in facts:
            self.write(fact)

    @rule()
    def deliver(self) -> None:
        done = self.keep.pop_completed()
        assert self.lean.pop_completed() == done
        for index, _ in done:
            self.write(OutputEmitted(index, "present", "caller"))

    @precondition(lambda self: self.admitted == SOURCES)
    @rule()
    def close_input(self) -> None:
        derived = self.keep.close_input()
        assert self.lean.close_input() == derived
        self.log.extend(derived)

    # -- history coming back ----------------------------------------------------------------------
    @precondition(lambda self: bool(self.log))
    @rule(data=st.data())
    def duplicate(self, data: st.DataObject) -> None:
        """Any earlier fact again (a catch-up read, a replayed append)."""
        fact = data.draw(st.sampled_from(self.log))
        if isinstance(fact, GrainCommitted) and self.keep.verdict(fact).accepted:
            return  # still in flight at that generation: a legitimate report
        self.replay(fact)

    @precondition(lambda self: bool(self.log))
    @rule(data=st.data(), generation=st.integers(0, 3),
          kind=st.sampled_from(["commit", "dispatch", "retry", "fail", "admit", "barrier"]))
    def late(self, data: st.DataObject, generation: int, kind: str) -> None:
        """A stale or conflicting fact about a Grain or source seen before."""
        grains = [(f.call, f.path) for f in self.log if isinstance(f, GrainDispatched)]
        if kind == "admit":
            index = data.draw(st.integers(0, max(self.admitted - 1, 0)))
            if index >= self.admitted:
                return
            self.replay(SourceAdmitted(index, (data.draw(st.integers(0, 100)),)))
            return
        if not grains:
            return
        call, path = data.draw(st.sampled_from(grains))
        if ((call, path), generation) in self.in_flight:
            return  # that one is a legitimate report or retry
        if kind == "commit":
            fact: Fact = GrainCommitted(call, path, generation, REPORT_PRESENT, (1,))
        elif kind == "dispatch":
            fact = GrainDispatched(call, path, generation)
        elif kind == "retry":
            fact = GrainRetried(call, path, generation + 1, "late")
        elif kind == "fail":
            fact = GrainFailed(call, path, generation, "late")
        else:
            if len(path) < 2 or path[0] in self.keep._pending:
                return  # under an unfinished source a barrier is news, not history
            fact = BarrierInstalled(call, path[:-1], "late")
        if self.keep.verdict(GrainCommitted(call, path, generation, REPORT_PRESENT,
                                            (1,))).accepted:
            return  # in flight at that generation: not history
        if kind == "dispatch" and self.keep._phase.get((call, path)) == 1:
            return  # ready: a dispatch is the next step, not history
        self.replay(fact)

    @rule()
    def restart(self) -> None:
        """Both rebuilt from the store's facts (the log) agree with themselves."""
        keep = rebuild(PLAN, self.log, max_active_sources=3, total_sources=SOURCES)
        lean = rebuild(PLAN, self.log, max_active_sources=3, total_sources=SOURCES,
                       keep_history=False)
        if self.keep.run_completed:
            keep.close_input()
            lean.close_input()
        assert keep.snapshot() == self.keep.snapshot()
        assert lean.snapshot() == self.lean.snapshot()

    # -- invariants -------------------------------------------------------------------------------
    @invariant()
    def agree(self) -> None:
        assert public_view(self.lean) == public_view(self.keep)
        self.lean.validate()
        self.keep.validate()
        assert self.lean.log == []

    @invariant()
    def forgotten_leave_nothing(self) -> None:
        lean = self.lean
        gone = lean._emitted
        for table in (lean._items, lean._phase, lean._gen, lean._expansions, lean._barriers,
                      lean._reduce_left, lean._sealed_by):
            assert not any(source_of(key) in gone for key in table), table
        assert not any(i in gone for i in lean._sources)
        assert len(lean._sources) <= 3 + lean.outputs_held + len(lean._to_pop)


KeepVersusForget.TestCase.settings = settings(max_examples=150, stateful_step_count=60,
                                              deadline=None)
test_keep_versus_forget = KeepVersusForget.TestCase


@given(spec=programs, schedule=schedules, values=sources)
def test_executor_forgetting_delivered_sources_writes_the_same_facts(
    spec: Any, schedule: Any, values: list[int]
) -> None:
    """Random programs and schedules: the same outputs, facts and completion order."""
    pipeline = RandomPipeline(spec)
    plan = pipeline.compile()
    rows = [(v,) for v in values]
    runs = []
    for keep in (True, False):
        pipeline.registry.clear()
        options = schedule.__class__(**{**schedule.__dict__, "keep_history": keep})
        runs.append(execute(plan, rows, options))
    kept, lean = runs
    assert lean.outputs == kept.outputs
    assert lean.log == kept.log
    assert lean.completion_order == kept.completion_order
    assert lean.stats == kept.stats
    assert lean.kernel.log == [] and len(lean.kernel._emitted) == len(values)
    assert not lean.kernel._sources and not lean.kernel._phase and not lean.kernel._expansions


def test_a_forgetting_kernel_has_no_story() -> None:
    kernel = Kernel(PLAN, keep_history=False)
    with pytest.raises(KernelError, match="keeps none"):
        kernel.story(0)


def test_a_delivered_source_admitted_again_is_not_run_again() -> None:
    """Regression: forgetting a source must not let a replayed SourceAdmitted re-admit it."""
    kernel = Kernel(PLAN, total_sources=2, keep_history=False)
    PIPELINE.registry.clear()
    kernel.apply(SourceAdmitted(0, (5,)))
    while not kernel.pop_completed():
        for call in kernel.ready_calls():
            for grain, gen in kernel.take_batch(call, 100):
                kernel.apply(GrainDispatched(grain[0], grain[1], gen))
                kernel.apply(GrainCommitted(grain[0], grain[1], gen, REPORT_RECORD_FAILURE,
                                            None, "no"))
    kernel.apply(OutputEmitted(0, "failed", "caller"))
    assert kernel.apply(SourceAdmitted(0, (5,))) == []
    assert kernel.admitted == 1 and kernel.ready_calls() == [] and kernel.finished
    with pytest.raises(InvalidTransition):
        kernel.apply(SourceAdmitted(0, (5, 6)))  # a malformed fact is still refused
