"""How the kernel holds a run's Items and propagates a terminal Item through the plan.

:class:`ItemPropagation` is the bottom layer of :class:`~rayorch.core.state.Kernel`: the
fold state itself and ``_resolve`` (an Item becomes terminal, its consumers react: a Call
Grain becomes ready or is decided without running; a primitive's node (an Expansion, a
reduce, a filter, a broadcast) reacts by its own rule, in its module of
:mod:`rayorch.core.primitives`), then source completion. The Grain lifecycle facts are
folded one layer up (:mod:`rayorch.core.grain_lifecycle`), the public API on top
(:mod:`rayorch.core.state`).

Internal representation (kept flat for speed, see ``bench/kernel.py``):

* ``_items[(port, path)]``: the terminal Item of a Port for an Entity; a Present value is
  stored as is, any other outcome as an :class:`Absent`. A missing key means pending.
* ``_phase[grain]``: READY / IN_FLIGHT / SEALED / BARRED (in flight when a barrier
  suppressed it). Waiting Grains and Grains decided without running (inputs Dropped,
  Failed or Suppressed, or suppressed before dispatch) have no phase entry.
* ``_gen[grain]``: the generation, stored only when > 0.
* ``_uncharged[grain]``: how many of its retries were not charged against ``max_attempts``
  (crash splits, core/crash_split.py), stored only when > 0.
* ``_expansions[(child_domain, parent_path)]``: child count, or DROPPED_X / FAILED_X.
* ``_reduce_left[(node, parent)]``: a primitive node's countdown of the Items it still
  waits for under ``parent`` (a reduce's members; see ``KernelNode.countdown``).
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
from rayorch.core.items import (
    DROPPED_ITEM,
    DROPPED_X,
    FAILED_X,
    PENDING,
    Absent,
    as_item,
    expansion_outcome,
    suppressed_by,
)
from rayorch.core.kernel_audit import story_of
from rayorch.core.outcome import Item, Outcome
from rayorch.core.plan import Plan
from rayorch.core.plan_tables import CallInfo, PlanTables
from rayorch.core.scheduler import CallQueue
from rayorch.core.vocabulary import READY


class ItemPropagation:
    """The fold state of one run (or one shard) and the propagation of terminal Items."""

    def __init__(self, plan: Plan, total_sources: int | None, keep_history: bool = True) -> None:
        self.plan = plan
        self.keep_history = keep_history
        self.tables = tables = PlanTables(plan)
        self._items: dict[tuple[int, Path], Any] = {}
        self._phase: dict[GrainKey, int] = {}
        self._gen: dict[GrainKey, int] = {}
        self._uncharged: dict[GrainKey, int] = {}  # crash retries not charged (core/crash_split)
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
        tables.bind(self, self._try_ready, self.queues)
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
                item = items.get((port, path), PENDING)
                if item is PENDING:
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
            result = DROPPED_ITEM
        else:
            result = suppressed_by(cause)
            self._suppressed[info.id] += 1
        for port in info.outputs:
            self._resolve(port, path, result)

    def _close_expansion(self, key: tuple[str, Path], state: int) -> None:
        self._expansions[key] = state
        outcome, count = expansion_outcome(state)
        self._emit(ExpansionClosed(key[0], key[1], outcome, count))

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
                    self._uncharged.pop(grain, None)
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


__all__ = ["DROPPED_X", "FAILED_X", "Absent", "ItemPropagation", "as_item",
           "expansion_outcome", "suppressed_by"]
