"""How the kernel holds a run's Items and propagates a terminal Item through the plan.

:class:`ItemPropagation` is the bottom layer of :class:`~rayorch.core.state.Kernel`: the
fold state itself and ``_resolve`` (an Item becomes terminal, its consumers react: a Call
Grain becomes ready or is decided without running, an Expansion closes and creates its
children, a reduce collects its members, a filter or broadcast passes a value on), then
source completion. The Grain lifecycle facts are folded one layer up
(:mod:`rayorch.core.grain_lifecycle`), the public API on top (:mod:`rayorch.core.state`).

Internal representation (kept flat for speed, see ``bench/kernel.py``):

* ``_items[(port, path)]``: the terminal Item of a Port for an Entity; a Present value is
  stored as is, any other outcome as an :class:`Absent`. A missing key means pending.
* ``_phase[grain]``: READY / IN_FLIGHT / SEALED / BARRED (in flight when a barrier
  suppressed it). Waiting Grains and Grains decided without running (inputs Dropped,
  Failed or Suppressed, or suppressed before dispatch) have no phase entry.
* ``_gen[grain]``: the generation, stored only when > 0.
* ``_expansions[(child_domain, parent_path)]``: child count, or DROPPED_X / FAILED_X.
* ``_pending[source]``: how many Items of the source's tree are still pending; the
  source is complete when it reaches 0 (then its Items are released).
* ``keep_history=False`` (the driver): no fact log, and a source whose output was
  delivered (``OutputEmitted``) is *forgotten*: everything about it goes but its index
  in ``_emitted`` (an :class:`IndexSet`), so memory follows the active sources
  (docs/ARCHITECTURE.md, "Bounded driver memory").
* ``_ready[call]`` / ``_suppressed[call]`` / ``_in_flight``: counters kept as the state
  changes, so the scheduler and the progress display never scan.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from rayorch.core.errors import InvalidTransition
from rayorch.core.facts import ExpansionClosed, Fact, RunCompleted, SourceAdmitted
from rayorch.core.ids import CallId, GrainKey, Path, format_path
from rayorch.core.index_set import IndexSet
from rayorch.core.kernel_audit import story_of
from rayorch.core.outcome import Item, Outcome
from rayorch.core.plan import Plan
from rayorch.core.plan_tables import BroadcastInfo, CallInfo, ExpandInfo, PlanTables, ReduceInfo
from rayorch.core.scheduler import CallQueue
from rayorch.core.udf import expansion_elements
from rayorch.core.vocabulary import (
    EXPANSION_DROPPED,
    EXPANSION_FAILED,
    EXPANSION_SUCCEEDED,
    READY,
)

# == the item representation ==========================================================
DROPPED_X = -1  # expansion states besides a child count
FAILED_X = -2


class Absent:
    """A terminal Item that is not Present (Dropped, Failed or Suppressed)."""

    __slots__ = ("cause", "origin", "outcome")

    def __init__(self, outcome: Outcome, cause: str | None, origin: str = "") -> None:
        self.outcome = outcome
        self.cause = cause
        self.origin = origin  # the Grain whose failure this is (Failed only)

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is Absent and other.outcome is self.outcome and other.cause == self.cause
        )

    def __hash__(self) -> int:
        return hash((self.outcome, self.cause))

    def __repr__(self) -> str:
        return f"Absent({self.outcome.value}, {self.cause!r})"


def suppressed_by(cause: Absent) -> Absent:
    """The Suppressed Item that a Failed or Suppressed input causes downstream."""
    if cause.outcome is Outcome.SUPPRESSED:
        return cause
    return Absent(Outcome.SUPPRESSED, f"{cause.origin or 'an input'} failed: {cause.cause}")


def as_item(value: Any) -> Item:
    """The public :class:`Item` of an internal value."""
    if type(value) is Absent:
        return Item(value.outcome, None, value.cause)
    return Item(Outcome.PRESENT, value)


def expansion_outcome(state: int) -> tuple[str, int]:
    if state == DROPPED_X:
        return EXPANSION_DROPPED, 0
    if state == FAILED_X:
        return EXPANSION_FAILED, 0
    return EXPANSION_SUCCEEDED, state


def broadcast_item(value: Any) -> Any:
    if type(value) is Absent and value.outcome is not Outcome.DROPPED:
        return suppressed_by(value)
    return value


_PENDING: Any = object()
_DROPPED = Absent(Outcome.DROPPED, None)


class ItemPropagation:
    """The fold state of one run (or one shard) and the propagation of terminal Items."""

    def __init__(self, plan: Plan, total_sources: int | None, keep_history: bool = True) -> None:
        self.plan = plan
        self.keep_history = keep_history
        self.tables = tables = PlanTables(plan)
        self._items: dict[tuple[int, Path], Any] = {}
        self._phase: dict[GrainKey, int] = {}
        self._gen: dict[GrainKey, int] = {}
        self._sealed_by: dict[GrainKey, Fact] = {}
        self._barriers: dict[tuple[CallId, Path], str] = {}
        self._expansions: dict[tuple[str, Path], int] = {}
        self._reduce_left: dict[tuple[int, Path], int] = {}
        self._pending: dict[int, int] = {}
        self._sources: dict[int, SourceAdmitted] = {}  # without history: the active ones
        self._admitted = 0
        self._completed: list[int] = []  # completion order (kept only with history)
        self._completed_count = 0
        self._to_pop: deque[int] = deque()  # complete, not yet returned by pop_completed
        self._outputs: dict[int, tuple[Item, ...]] = {}
        self._emitted = IndexSet()
        self._ready: dict[CallId, int] = {c: 0 for c in tables.calls}
        self._suppressed: dict[CallId, int] = {c: 0 for c in tables.calls}
        self._in_flight = 0
        self._total = total_sources
        self._run_completed = False
        self.log: list[Fact] = []  # stays empty without history
        self._announce: list[Fact] = []
        # Grains that became ready (fresh, not retried), collected only when a reuse hook
        # asks for them (core.reuse: the machine seals the reusable ones before dispatch).
        self.newly_ready: list[GrainKey] | None = None
        self.queues: dict[CallId, CallQueue] = {
            c: CallQueue(c, info.policy, self._phase, self._gen) for c, info in tables.calls.items()
        }
        tables.bind(
            {"call": self._try_ready, "expand": self._expand, "reduce": self._member_done,
             "reduce_members": self._membership_done, "filter": self._filter,
             "broadcast": self._broadcast_from},
            self.queues,
        )
        self._calls = tables.calls
        self._consumers = tables.consumers

    def _emit(self, fact: Fact) -> None:
        if self.keep_history:
            self.log.append(fact)
        self._announce.append(fact)

    def _reject(self, message: str, obj: Any) -> InvalidTransition:
        return InvalidTransition(message, tuple(story_of(self.log, self.tables, obj)))

    def _forgotten(self, source: int) -> bool:
        """``source`` was delivered and forgotten (only without history)."""
        return not self.keep_history and source in self._emitted and source not in self._sources

    # == propagation =================================================================
    def _resolve(self, port: int, path: Path, value: Any) -> None:
        """Make ``(port, path)`` terminal and propagate to its consumers."""
        key = (port, path)
        items = self._items
        if key in items:
            raise self._reject(
                f"Item {self.tables.port_names[port]}[{format_path(path)}] is already terminal",
                path)
        items[key] = value
        for handler, info in self._consumers[port]:
            handler(info, path, value)
        pending = self._pending
        source = path[0]
        left = pending[source] - 1
        if left:
            pending[source] = left
        else:
            self._complete(source)

    def _try_ready(self, info: CallInfo, path: Path, value: Any) -> None:
        """An input of a Call resolved for ``path``: wait, decide, or make the Grain ready."""
        items = self._items
        if (info.outputs[0], path) in items:
            return  # already decided (early suppression or a barrier)
        if info.single:
            if type(value) is Absent:
                self._decide_without_running(info, path, value)
                return
        else:
            dropped = None
            waiting = False
            for port in info.inputs:
                item = items.get((port, path), _PENDING)
                if item is _PENDING:
                    waiting = True
                elif type(item) is Absent:
                    if item.outcome is not Outcome.DROPPED:
                        self._decide_without_running(info, path, item)
                        return
                    dropped = item
            if waiting:
                return
            if dropped is not None:
                self._decide_without_running(info, path, dropped)
                return
        grain = (info.id, path)
        if self._barriers and not info.root and (info.id, path[:-1]) in self._barriers:
            suppressed = Absent(Outcome.SUPPRESSED, self._barriers[(info.id, path[:-1])])
            self._suppressed[info.id] += 1
            for port in info.outputs:
                self._resolve(port, path, suppressed)
            return
        self._phase[grain] = READY
        self._ready[info.id] += 1
        info.queue_push(grain)
        if self.newly_ready is not None:
            self.newly_ready.append(grain)

    def _decide_without_running(self, info: CallInfo, path: Path, cause: Absent) -> None:
        if cause.outcome is Outcome.DROPPED:
            result = _DROPPED
        else:
            result = suppressed_by(cause)
            self._suppressed[info.id] += 1
        for port in info.outputs:
            self._resolve(port, path, result)

    def _expand(self, info: ExpandInfo, path: Path, value: Any) -> None:
        """The expanded Item of ``path`` resolved: close the Expansion, create the children."""
        key = (info.domain, path)
        if len(info.inputs) > 1:  # F.expand_aligned: wait for every aligned output
            values = [self._items.get((port, path), _PENDING) for port in info.inputs]
            if any(v is _PENDING for v in values):
                return
            value = next((v for v in values if type(v) is Absent), value)
        else:
            values = [value]
        if type(value) is Absent:
            dropped = value.outcome is Outcome.DROPPED
            self._close_expansion(key, DROPPED_X if dropped else FAILED_X)
            result = _DROPPED if dropped else suppressed_by(value)
            for reduce in info.reduces:
                self._resolve(reduce.output, path, result)
            return
        columns = [expansion_elements(v) for v in values]
        problem = None
        bad = next((v for v, c in zip(values, columns) if c is None), None)
        if any(c is None for c in columns):
            problem = (f"the value is a {type(bad).__name__}, not a sequence; the expanded "
                       "module must return a list per record")
        elif len({len(c) for c in columns if c is not None}) > 1:
            problem = (f"the aligned lists have different lengths "
                       f"{[len(c) for c in columns if c is not None]}")
        if problem is not None:
            self._close_expansion(key, FAILED_X)
            failure = Absent(Outcome.SUPPRESSED,
                             f"F.expand into {info.domain} at {format_path(path)}: {problem}")
            for reduce in info.reduces:
                self._resolve(reduce.output, path, failure)
            return
        elements = columns[0]
        assert elements is not None
        count = len(elements)
        self._close_expansion(key, count)
        if count == 0:
            for reduce in info.reduces:
                self._resolve(reduce.output, path, [])
            return
        for reduce in info.reduces:
            self._reduce_left[(reduce.node, path)] = count * reduce.ports
        self._pending[path[0]] += count * info.ports_per_child
        broadcasts = info.broadcasts
        for ordinal in range(count):
            child = (*path, ordinal)
            for port, column in zip(info.outputs, columns):
                assert column is not None
                self._resolve(port, child, column[ordinal])
            for broadcast in broadcasts:
                item = self._items.get((broadcast.source, child[: broadcast.source_len]), _PENDING)
                if item is not _PENDING and (broadcast.output, child) not in self._items:
                    self._resolve(broadcast.output, child, broadcast_item(item))

    def _close_expansion(self, key: tuple[str, Path], state: int) -> None:
        self._expansions[key] = state
        outcome, count = expansion_outcome(state)
        self._emit(ExpansionClosed(key[0], key[1], outcome, count))

    def _member_done(self, info: ReduceInfo, path: Path, value: Any) -> None:
        """A member of a reduce resolved: emit the parent's list once all are terminal."""
        parent = path[:-1]
        key = (info.node, parent)
        left = self._reduce_left.get(key)
        if left is None:
            return  # already suppressed by an earlier failed member
        if info.members is not None:
            self._reduce_step(info, path, key, left)
            return
        if type(value) is Absent and value.outcome is not Outcome.DROPPED:
            del self._reduce_left[key]
            self._resolve(info.output, parent, suppressed_by(value))
            return
        if left > 1:
            self._reduce_left[key] = left - 1
            return
        del self._reduce_left[key]
        items = self._items
        port = info.input
        count = self._expansions[(info.domain, parent)]
        members = [items[(port, (*parent, i))] for i in range(count)]
        self._resolve(info.output, parent, [m for m in members if type(m) is not Absent])

    def _membership_done(self, info: ReduceInfo, path: Path, value: Any) -> None:
        """The ``members=`` Item of a child of a reduce resolved."""
        key = (info.node, path[:-1])
        left = self._reduce_left.get(key)
        if left is not None:
            self._reduce_step(info, path, key, left)

    def _reduce_step(self, info: ReduceInfo, path: Path, key: tuple[int, Path], left: int) -> None:
        """``F.reduce(values, members=m)``: one of a child's two Items resolved."""
        assert info.members is not None
        parent = path[:-1]
        items = self._items
        member = items.get((info.members, path), _PENDING)
        value = items.get((info.input, path), _PENDING)
        blame = None
        if type(member) is Absent and member.outcome is not Outcome.DROPPED:
            blame = suppressed_by(member)
        elif member is not _PENDING and type(member) is not Absent and type(value) is Absent:
            blame = suppressed_by(value) if value.outcome is not Outcome.DROPPED else Absent(
                Outcome.SUPPRESSED, f"F.reduce(members=...) at {format_path(path)}: the member "
                "is Present but its value was Dropped, so the aligned lists cannot keep it")
        if blame is not None:
            del self._reduce_left[key]
            self._resolve(info.output, parent, blame)
            return
        if left > 1:
            self._reduce_left[key] = left - 1
            return
        del self._reduce_left[key]
        count = self._expansions[(info.domain, parent)]
        kept = [items[(info.input, (*parent, i))] for i in range(count)
                if type(items[(info.members, (*parent, i))]) is not Absent]
        self._resolve(info.output, parent, kept)

    def _filter(self, info: tuple[int, int, int], path: Path, value: Any) -> None:
        port, mask, output = info
        items = self._items
        if (output, path) in items:
            return
        item = items.get((port, path), _PENDING)
        flag = items.get((mask, path), _PENDING)
        for v in (item, flag):
            if type(v) is Absent and v.outcome is not Outcome.DROPPED:
                self._resolve(output, path, suppressed_by(v))
                return
        if item is _PENDING or flag is _PENDING:
            return
        if type(flag) is Absent or type(item) is Absent or not flag:
            self._resolve(output, path, _DROPPED)
        else:
            self._resolve(output, path, item)

    def _broadcast_from(self, info: BroadcastInfo, path: Path, value: Any) -> None:
        """An ancestor Item resolved: hand it to every existing descendant in the target Domain."""
        item = broadcast_item(value)
        pending = self._pending
        for child in self.tables.descendants(self._expansions, path, info.chain):
            if path[0] not in pending:
                return  # the source completed: its Items were released
            if (info.output, child) not in self._items:
                self._resolve(info.output, child, item)

    # == completion ==================================================================
    def _complete(self, source: int) -> None:
        del self._pending[source]
        if self.keep_history:
            self._completed.append(source)
        self._completed_count += 1
        self._to_pop.append(source)
        root = (source,)
        self._outputs[source] = tuple(as_item(self._items[(p, root)]) for p in self.tables.outputs)
        items = self._items
        sealed_by = self._sealed_by
        for domain, path in self.tables.entities(self._expansions, source):
            for port in self.tables.domain_ports[domain]:
                del items[(port, path)]
            for call in self.tables.domain_calls[domain]:
                sealed_by.pop((call, path), None)
        if self._total is not None and not self._run_completed:
            self._maybe_complete_run()

    def _forget(self, source: int) -> None:
        """Drop a delivered source's state; only its index stays (in ``_emitted``).

        Its Items and sealing facts went at completion; here go its Grains' phases and
        generations, its Expansions and barriers, and its ``SourceAdmitted``.
        """
        tables = self.tables
        expansions = self._expansions
        entities = tables.entities(expansions, source)
        phase, gen, barriers = self._phase, self._gen, self._barriers
        children = tables.child_domains
        for domain, path in entities:
            for call in tables.domain_calls[domain]:
                grain = (call, path)
                phase.pop(grain, None)
                if gen:  # a retried Grain suppressed while ready keeps its generation only
                    gen.pop(grain, None)
            for child in children[domain]:
                expansions.pop((child, path), None)
                if barriers:
                    for call in tables.domain_calls[child]:
                        barriers.pop((call, path), None)
        del self._sources[source]

    def _maybe_complete_run(self) -> None:
        if self._admitted == self._total and not self._pending:
            self._run_completed = True
            self._emit(RunCompleted(self._total))


__all__ = ["DROPPED_X", "FAILED_X", "Absent", "ItemPropagation", "as_item", "broadcast_item",
           "expansion_outcome", "suppressed_by"]
