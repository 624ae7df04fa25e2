"""A stateful machine driving the kernel directly; ``validate()`` is the invariant.

Rules admit sources, dispatch batches, commit (value, RecordFailure, GroupFailure),
fail attempts physically, deliver bogus reports (which must be rejected and change
nothing) and rebuild the kernel from its log (which must give the identical state).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from programs import Behaviour, ProgramSpec, RandomPipeline

from rayorch.core.errors import InvalidTransition
from rayorch.core.facts import (
    REPORT_GROUP_FAILURE,
    REPORT_PRESENT,
    REPORT_RECORD_FAILURE,
    BarrierInstalled,
    Fact,
    GrainCommitted,
    GrainDispatched,
    SourceAdmitted,
)
from rayorch.core.ids import GrainKey
from rayorch.core.state import Kernel, rebuild

SPEC = ProgramSpec(
    block=(("map",), ("expand", (("filter",), ("expand", (("broadcast", 0),
                                                           ("expand", (("map",),)))))),),
    side_output=True,
    behaviours=(Behaviour(),) * 8,
    batched=(True,) * 8,
)
PIPELINE = RandomPipeline(SPEC)
PLAN = PIPELINE.compile()


class KernelMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = Kernel(PLAN, max_active_sources=3)
        self.log: list[Fact] = []
        self.in_flight: list[tuple[GrainKey, int]] = []
        self.admitted = 0

    def write(self, fact: Fact) -> None:
        self.log.append(fact)
        self.log.extend(self.kernel.apply(fact))

    def value_for(self, grain: GrainKey, size: int) -> Any:
        kind = PIPELINE.kinds[PLAN.call_node(grain[0]).call.module]  # type: ignore[union-attr]
        if kind == "fanout":
            return list(range(size))
        if kind == "pred":
            return size % 3 != 0
        return size

    @precondition(lambda self: self.kernel.admissible() > 0 and self.admitted < 6)
    @rule(value=st.integers(0, 100))
    def admit(self, value: int) -> None:
        self.write(SourceAdmitted(self.admitted, (value,)))
        self.admitted += 1

    @precondition(lambda self: bool(self.kernel.ready_calls()))
    @rule(data=st.data(), limit=st.integers(1, 5))
    def dispatch(self, data: st.DataObject, limit: int) -> None:
        call = data.draw(st.sampled_from(self.kernel.ready_calls()))
        for grain, gen in self.kernel.take_batch(call, limit):
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
        if not self.kernel.verdict(fact).accepted:
            self.bogus(fact)  # barred meanwhile: must be rejected and change nothing
            return
        self.write(fact)
        if outcome == "gf" and len(grain[1]) > 1:
            self.write(BarrierInstalled(grain[0], grain[1][:-1], "user says no"))

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data())
    def physical_failure(self, data: st.DataObject) -> None:
        count = data.draw(st.integers(1, len(self.in_flight)))
        batch, self.in_flight = self.in_flight[:count], self.in_flight[count:]
        for fact in self.kernel.physical_failure(batch, "RuntimeError: crash"):
            self.write(fact)

    @rule(data=st.data(), generation=st.integers(0, 3))
    def stale_report(self, data: st.DataObject, generation: int) -> None:
        grains = [(f.call, f.path) for f in self.log if isinstance(f, GrainDispatched)]
        if not grains:
            return
        grain = data.draw(st.sampled_from(grains))
        if (grain, generation) in self.in_flight:
            return  # that one is a legitimate report
        self.bogus(GrainCommitted(grain[0], grain[1], generation, REPORT_PRESENT, (1,)))

    def bogus(self, fact: GrainCommitted) -> None:
        """Rejected, or (an identical copy of an applied report) a no-op: nothing changes."""
        assert not self.kernel.verdict(fact).accepted
        before = self.kernel.snapshot()
        if fact in self.log:
            assert self.kernel.apply(fact) == []
        else:
            with pytest.raises(InvalidTransition):
                self.kernel.apply(fact)
        assert self.kernel.snapshot() == before

    @rule()
    def restart(self) -> None:
        again = rebuild(PLAN, self.log, max_active_sources=3)
        assert again.snapshot() == self.kernel.snapshot()
        assert again.log == self.log
        self.kernel = again

    @invariant()
    def valid(self) -> None:
        self.kernel.validate()
        if not self.in_flight:
            self.kernel.check_progress()
        assert self.kernel.in_flight == len(
            [t for t in self.in_flight if self.kernel.verdict(
                GrainCommitted(t[0][0], t[0][1], t[1], REPORT_PRESENT, (0,))).accepted])


KernelMachine.TestCase.settings = settings(
    KernelMachine.TestCase.settings, stateful_step_count=40
)
test_kernel_machine = KernelMachine.TestCase
