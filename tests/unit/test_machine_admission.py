"""The shard machine decides admission: it asks for sources (WantSources), the shell answers.

Driven by hand, event by event, as the driver shell drives it (no Ray, no store)."""

from __future__ import annotations

from typing import Any

import pytest

import rayorch as ro
from rayorch.core.errors import InvalidTransition
from rayorch.core.facts import REPORT_PRESENT, GrainCommitted, RunCompleted, SourceAdmitted
from rayorch.core.machine import (
    BatchCommitted,
    FactsStored,
    InputClosed,
    Instruction,
    OutputDelivered,
    OutputReady,
    SendBatch,
    ShardMachine,
    SlotFree,
    SourcesArrived,
    WantSources,
    WriteFacts,
)
from rayorch.core.vocabulary import CommitVerdict


def double(x: int) -> int:
    return 2 * x


class Double(ro.Pipeline):
    def __init__(self) -> None:
        super().__init__()
        self.double = ro.RayModule(double, batch_size=8)

    def forward(self, x: Any) -> Any:
        return self.double(x)


def asks(instructions: list[Instruction]) -> list[int]:
    return [i.limit for i in instructions if isinstance(i, WantSources)]


def written(instructions: list[Instruction]) -> list[Any]:
    return [f for i in instructions if isinstance(i, WriteFacts) for f in i.facts]


def rows(*indexes: int) -> SourcesArrived:
    return SourcesArrived(tuple((i, (i,), None) for i in indexes))


def finish_all(machine: ShardMachine) -> list[Instruction]:
    """Run every ready Grain (one batch) and deliver what finishes; the instructions."""
    out: list[Instruction] = []
    for ins in machine.handle(SlotFree("double", 8)):
        out.append(ins)
        if isinstance(ins, SendBatch):
            reports = tuple(GrainCommitted("double", path, gen, REPORT_PRESENT, (2 * row[0],))
                            for (path, gen), row in zip(ins.tags, ins.rows, strict=True))
            accepted = (int(CommitVerdict.ACCEPTED),) * len(reports)
            out.extend(machine.handle(BatchCommitted(reports, accepted)))
    for ready in [i for i in out if isinstance(i, OutputReady)]:
        out.extend(machine.handle(OutputDelivered(ready.index, ready.outcome, "test")))
    return out


def test_the_machine_asks_for_its_room_capped_by_the_micro_batch() -> None:
    plan = Double().compile()
    assert asks(ShardMachine(plan, micro_batch=3).handle(FactsStored(()))) == [3]
    bounded = ShardMachine(plan, max_active_sources=2, micro_batch=8)
    assert asks(bounded.handle(FactsStored(()))) == [2]


def test_each_answer_is_followed_by_an_ask_for_the_room_left_and_none_when_full() -> None:
    machine = ShardMachine(Double().compile(), max_active_sources=2, micro_batch=8)
    machine.handle(FactsStored(()))
    out = machine.handle(rows(0))
    assert written(out) == [SourceAdmitted(0, (0,))]
    assert asks(out) == [1]
    assert asks(machine.handle(rows(1))) == []  # no room: no ask
    # A delivered source frees its room: the machine asks again, by itself.
    assert asks(finish_all(machine)) == [2]


def test_more_sources_than_asked_are_refused() -> None:
    machine = ShardMachine(Double().compile(), max_active_sources=2)
    machine.handle(FactsStored(()))
    with pytest.raises(InvalidTransition, match="3 sources arrived for an ask of 2"):
        machine.handle(rows(0, 1, 2))


def test_after_the_input_closes_the_machine_never_asks_and_completes_the_run() -> None:
    machine = ShardMachine(Double().compile(), micro_batch=4)
    machine.handle(FactsStored(()))
    machine.handle(rows(0, 1))
    out = machine.handle(InputClosed())
    assert machine.input_closed and asks(out) == []
    out = finish_all(machine)
    assert asks(out) == [] and RunCompleted(2) in written(out)
    assert machine.run_completed
    with pytest.raises(InvalidTransition):
        machine.handle(rows(2))  # no ask is open
