"""The driver's protocol as a state machine: events in, instructions out.

A :class:`ShardMachine` wraps the :class:`~rayorch.core.state.Kernel` of one shard
and owns the protocol every caller used to re-encode by hand (take a batch, fold
``GrainDispatched``, gate a report, fold its barrier, turn a failed attempt into
``GrainRetried``/``GrainFailed``, record a delivery). In the style of dask's worker
state machine, :meth:`ShardMachine.handle` takes events and returns instructions:

* :class:`WantSources` — room for more sources: answer with :class:`SourcesArrived`
  (or :class:`InputClosed` when there are none); asked again whenever the room changes;
* :class:`WriteFacts` — facts to append (fenced) to the shard's log, in this order,
  before any batch returned *after* them is sent;
* :class:`SendBatch` — a physical batch for an actor of the Call's pool;
* :class:`OutputReady` — a finished source item for the sink (not yet delivered:
  delivery is an event, :class:`OutputDelivered`, that the sink reports back);
* :class:`Resync` — the store knows something this machine does not (a report it
  rejected that the kernel expected): rebuild the shard from the store.

No clock: timestamps arrive inside events. No I/O but one: a reused Grain whose
outputs left its fact is read through the ``load`` its :class:`~rayorch.core.reuse.Reuse`
was handed (docs/ARCHITECTURE.md, "Kernel"). The Ray driver
(``rayorch.runtime.shard_driver``), the in-process executor (``runtime/in_process.py``)
and the simulator (``bench/simulator``) perform the same instructions
(docs/ARCHITECTURE.md, "One driver").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rayorch.core.errors import InvalidTransition
from rayorch.core.facts import (
    REPORT_GROUP_FAILURE,
    ExpansionClosed,
    Fact,
    GrainCommitted,
    GrainDispatched,
    OutputEmitted,
    RunCompleted,
    SourceAdmitted,
    barrier_fact,
)
from rayorch.core.ids import CallId, GrainKey, Path
from rayorch.core.outcome import FailedResult, Item, Outcome, source_result
from rayorch.core.plan import Plan
from rayorch.core.reuse import Reuse
from rayorch.core.state import UNBOUNDED, Kernel
from rayorch.core.vocabulary import CommitVerdict

GrainTag = tuple[Path, int]


# == events ===========================================================================
@dataclass(frozen=True, slots=True)
class Event:
    """Base of the stimuli a :class:`ShardMachine` handles."""


@dataclass(frozen=True, slots=True)
class SourcesArrived(Event):
    """Admit these sources (``(index, values, identity)``, see ``SourceAdmitted``): at most
    what :class:`WantSources` asked."""

    rows: tuple[tuple[int, tuple[Any, ...], str | None], ...]
    ts: float = 0.0


@dataclass(frozen=True, slots=True)
class InputClosed(Event):
    """No more sources will arrive for this shard."""


@dataclass(frozen=True, slots=True)
class SlotFree(Event):
    """An actor of ``call``'s pool can take one batch of at most ``limit`` Grains;
    ``idle``: nothing else is on that actor (a crash retry waits for one)."""

    call: CallId
    limit: int
    ts: float = 0.0
    idle: bool = True


@dataclass(frozen=True, slots=True)
class BatchCommitted(Event):
    """The commit gate's verdicts (store order) for a batch's reports of this shard."""

    reports: tuple[GrainCommitted, ...]
    verdicts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BatchFailed(Event):
    """A batch of ``call`` failed physically (crash, timeout, lost, rejected by the store).

    ``crashed``: its actor died under it (not its own timeout or ``ro.ActorFailure``);
    ``alone``: it was sent as :class:`SendBatch` ``alone`` (core/crash_split.py).
    """

    call: CallId
    tags: tuple[GrainTag, ...]
    cause: str
    ts: float = 0.0
    crashed: bool = False
    alone: bool = False


@dataclass(frozen=True, slots=True)
class OutputDelivered(Event):
    """The sink delivered source ``index`` (its consumer has it); see ``OutputEmitted``."""

    index: int
    outcome: str
    sink: str
    digest: str = ""
    ts: float = 0.0


@dataclass(frozen=True, slots=True)
class TakenOver(Event):
    """This machine was rebuilt from the store by a driver whose live batches carry
    ``live`` (``(call, path, generation)``): every other Grain in flight lost its driver."""

    live: frozenset[tuple[CallId, Path, int]]
    cause: str
    ts: float = 0.0


@dataclass(frozen=True, slots=True)
class FactsStored(Event):
    """Facts read from the store that this machine has not folded (a rebuild or catch-up)."""

    facts: tuple[Fact, ...]


# == instructions ======================================================================
@dataclass(frozen=True, slots=True)
class Instruction:
    """Base of what a :class:`ShardMachine` asks its driver to do."""


@dataclass(frozen=True, slots=True)
class WantSources(Instruction):
    """Up to ``limit`` more sources may be admitted now (replaces any earlier ask)."""

    limit: int


@dataclass(frozen=True, slots=True)
class WriteFacts(Instruction):
    facts: tuple[Fact, ...]


@dataclass(frozen=True, slots=True)
class SendBatch(Instruction):
    call: CallId
    tags: tuple[GrainTag, ...]
    rows: tuple[tuple[Any, ...], ...]
    alone: bool = False  # a crash retry: the actor runs nothing else while it holds it


@dataclass(frozen=True, slots=True)
class OutputReady(Instruction):
    """Source ``index`` finished: its ``value`` as the user sees it (or a ``FailedResult``)."""

    index: int
    value: Any
    outcome: str
    items: tuple[Item, ...] = ()  # the output Items themselves (tests, the simulator)


@dataclass(frozen=True, slots=True)
class Resync(Instruction):
    reason: str


@dataclass(frozen=True, slots=True)
class MachineLoad:
    """What a shard holds per Call now (:meth:`ShardMachine.load`): the one stats query the
    driver's progress and its pool sizing read."""

    ready: dict[CallId, int]
    """Ready Grains, waiting for an actor."""
    suppressed: dict[CallId, int]
    """Grains that ended Suppressed so far."""
    in_flight: int
    """Grains dispatched and not yet settled, over all Calls."""


item_result = source_result  # the value(s) or a FailedResult (one place: core.outcome)


class ShardMachine:
    """The driver protocol of one shard around its :class:`Kernel`; see the module docstring.

    >>> m = ShardMachine(plan, total_sources=2)                      # doctest: +SKIP
    >>> m.handle(SourcesArrived(((0, ("a.pdf",), None), (1, ("b.pdf",), None))))  # doctest: +SKIP
    [WriteFacts(facts=(SourceAdmitted(0, ...), SourceAdmitted(1, ...)))]
    """

    def __init__(self, plan: Plan, *, max_active_sources: int | None = None,
                 total_sources: int | None = None, keep_history: bool = True,
                 reuse: Reuse | None = None, micro_batch: int | None = None) -> None:
        self.plan = plan
        self.kernel = Kernel(plan, max_active_sources=max_active_sources,
                             total_sources=total_sources, keep_history=keep_history)
        # Reuse keys on dispatches; ready Grains an earlier run holds are sealed by
        # GrainReused instead of dispatched (core/reuse.py).
        self.reuse = reuse
        if reuse is not None:
            reuse.attach(self.kernel)
        # Admission: at most ``micro_batch`` sources per ask, none once the input closed.
        self.micro_batch = UNBOUNDED if micro_batch is None else max(1, micro_batch)
        self.input_closed = False
        self._asked = 0  # the limit of the ask not yet answered (0: none)
        self.disagreements = 0  # store accepted a report after a barrier the kernel folded
        self.rerun = 0  # Grains re-dispatched because their driver died (TakenOver)
        self._outbox: list[Instruction] = []
        self._facts: list[Fact] = []

    # -- the one entry point --------------------------------------------------------------
    def handle(self, *events: Event) -> list[Instruction]:
        """Fold ``events`` in order; the instructions they produce, in order."""
        for event in events:
            handler = _HANDLERS.get(type(event))
            if handler is None:
                raise TypeError(f"ShardMachine does not handle {type(event).__name__}")
            handler(self, event)
        if self.reuse is not None:
            for folded, written in self.reuse.seal_ready(self.kernel):
                derived = self.kernel.apply(folded)
                self._facts.append(written)
                self._facts.extend(derived)
        self._flush_facts()
        self._ready_outputs()
        self._ask_for_sources()
        out, self._outbox = self._outbox, []
        return out

    # -- queries (no state change) ----------------------------------------------------------
    def ready_calls(self) -> list[CallId]:
        return self.kernel.ready_calls()

    def needs_idle(self, call: CallId) -> bool:
        """Whether ``call``'s next batch is a crash retry, which waits for an idle actor
        (:class:`SlotFree` ``idle``): other work must not keep every actor busy."""
        return self.kernel.queues[call].needs_idle()

    def load(self) -> MachineLoad:
        """Ready and suppressed Grains per Call, and Grains in flight; O(Calls)."""
        kernel = self.kernel
        calls = kernel.tables.calls
        return MachineLoad({call: kernel.ready_count(call) for call in calls},
                           {call: kernel.suppressed_count(call) for call in calls},
                           kernel.in_flight)

    def expects(self, report: GrainCommitted) -> bool:
        """Would the kernel accept ``report`` (the Grain is in flight at that generation)?"""
        return self.kernel.verdict(report) is CommitVerdict.ACCEPTED

    @property
    def run_completed(self) -> bool:
        return self.kernel.run_completed

    @property
    def holds_work(self) -> bool:
        """A Grain is in flight, or a finished source's output is not yet delivered: the
        shard may not be released (a barred Grain's report will be refused: not counted)."""
        return bool(self.kernel.in_flight or self.kernel.outputs_held)

    # -- handlers -----------------------------------------------------------------------
    def _fold(self, fact: Fact, *, write: bool = True) -> None:
        derived = self.kernel.apply(fact)
        if write:
            self._facts.append(fact)
        self._facts.extend(derived)

    def _flush_facts(self) -> None:
        if self._facts:
            self._outbox.append(WriteFacts(tuple(self._facts)))
            self._facts = []

    def _ask_for_sources(self) -> None:
        if self.input_closed:
            return
        limit = min(self.kernel.admissible(), self.micro_batch)
        if limit != self._asked:
            self._asked = limit
            if limit > 0:
                self._outbox.append(WantSources(limit))

    def _on_sources(self, event: SourcesArrived) -> None:
        if len(event.rows) > self._asked:
            raise InvalidTransition(
                f"{len(event.rows)} sources arrived for an ask of {self._asked}")
        self._asked = 0  # answered: asked again (handle's end) while there is room
        for index, values, identity in event.rows:
            self._fold(SourceAdmitted(index, tuple(values), identity=identity, ts=event.ts))

    def _on_input_closed(self, event: InputClosed) -> None:
        if self.input_closed:
            return
        self.input_closed = True
        self._asked = 0
        self._facts.extend(self.kernel.close_input())

    def _on_slot_free(self, event: SlotFree) -> None:
        grains, alone = self.kernel.take_for(event.call, event.limit, event.idle)
        if not grains:
            return
        tags: list[GrainTag] = []
        rows: list[tuple[Any, ...]] = []
        reuse, kernel = self.reuse, self.kernel
        for grain, generation in grains:
            values = kernel.inputs_of(grain)
            key = "" if reuse is None else reuse.key_of(kernel, grain, values)
            self._fold(GrainDispatched(grain[0], grain[1], generation, key, ts=event.ts))
            tags.append((grain[1], generation))
            rows.append(values)
        self._flush_facts()  # the store must know the dispatches before a worker commits
        self._outbox.append(SendBatch(event.call, tuple(tags), tuple(rows), alone))

    def _on_committed(self, event: BatchCommitted) -> None:
        unexplained: list[str] = []
        for report, code in zip(event.reports, event.verdicts, strict=True):
            expected = self.expects(report)
            if code == CommitVerdict.ACCEPTED:
                if not expected:
                    # The store accepted a sibling just before a GroupFailure barrier that
                    # reached this kernel first; the parent is Suppressed either way.
                    self.disagreements += 1
                    continue
                self._fold(report, write=False)  # the commit gate already stored it
                if report.outcome == REPORT_GROUP_FAILURE and len(report.path) > 1:
                    self._fold(barrier_fact(report), write=False)
            elif code != CommitVerdict.BARRED and expected:
                unexplained.append(f"{report.call}{list(report.path)}: "
                                   f"{CommitVerdict(code).name}")
        if unexplained:
            self._flush_facts()
            self._outbox.append(Resync("the lineage store rejected reports the driver "
                                       "expected (" + ", ".join(unexplained[:3]) + ")"))

    def _on_failed(self, event: BatchFailed) -> None:
        grains: list[tuple[GrainKey, int]] = [((event.call, path), gen)
                                              for path, gen in event.tags]
        for fact in self.kernel.physical_failure(grains, event.cause, ts=event.ts,
                                                 crashed=event.crashed, alone=event.alone):
            self._fold(fact)

    def _on_taken_over(self, event: TakenOver) -> None:
        orphans = [(grain, gen) for grain, gen in self.kernel.in_flight_grains()
                   if (grain[0], grain[1], gen) not in event.live]
        self.rerun += len(orphans)
        for fact in self.kernel.physical_failure(orphans, event.cause, ts=event.ts):
            self._fold(fact)

    def _on_delivered(self, event: OutputDelivered) -> None:
        self._fold(OutputEmitted(event.index, event.outcome, event.sink, event.digest,
                                 ts=event.ts))

    def _on_stored(self, event: FactsStored) -> None:
        # Announcements the fold derives that the store lacks (their writer died before
        # writing them) are written back; those the store has are checked, not repeated.
        missing: list[Fact] = []
        for fact in event.facts:
            if isinstance(fact, GrainCommitted) and not self.expects(fact):
                self.disagreements += 1  # see _on_committed: the kernel keeps its view
                continue
            if isinstance(fact, ExpansionClosed | RunCompleted) and fact in missing:
                missing.remove(fact)
            missing.extend(self.kernel.apply(fact))
        self._facts.extend(missing)

    def _ready_outputs(self) -> None:
        names = self.plan.output_names
        for index, items in self.kernel.pop_completed():
            value = item_result(index, items, names)
            outcome = (value.outcome if isinstance(value, FailedResult) else Outcome.PRESENT).value
            self._outbox.append(OutputReady(index, value, outcome, tuple(items)))


_HANDLERS: dict[type, Any] = {
    SourcesArrived: ShardMachine._on_sources,
    InputClosed: ShardMachine._on_input_closed,
    SlotFree: ShardMachine._on_slot_free,
    BatchCommitted: ShardMachine._on_committed,
    BatchFailed: ShardMachine._on_failed,
    OutputDelivered: ShardMachine._on_delivered,
    FactsStored: ShardMachine._on_stored,
    TakenOver: ShardMachine._on_taken_over,
}

__all__ = [
    "BatchCommitted", "BatchFailed", "Event", "FactsStored", "GrainTag", "InputClosed",
    "MachineLoad",
    "Instruction", "OutputDelivered", "OutputReady", "Resync", "SendBatch", "ShardMachine",
    "SlotFree", "SourcesArrived", "TakenOver", "WantSources", "WriteFacts",
    "item_result",
]
