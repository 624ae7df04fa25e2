"""The lineage kernel: a pure, deterministic fold of facts into run state.

``Kernel.apply(fact)`` folds one fact and returns the announcements it newly derives
(``ExpansionClosed``, ``RunCompleted``). Everything else the kernel knows (Items,
suppression, Dropped, reduce results, completion) is derived from the primary facts in
their order, so a new Kernel folding the same facts reaches the identical state.

The Kernel is built in layers, one module each:

* :mod:`rayorch.core.propagation` (``ItemPropagation``): the fold state and how a
  terminal Item propagates (Calls, Expansions, reduces, filters, broadcasts, completion);
* :mod:`rayorch.core.grain_lifecycle` (``GrainLifecycle``): the Grain lifecycle facts,
  barriers, the commit gate and physical failures;
* this module (``Kernel``): ``apply``, sources, announcements, outputs, scheduling and
  queries (stories, snapshots and invariants live in :mod:`rayorch.core.kernel_audit`).

Per-Call queues are in :mod:`rayorch.core.scheduler`, the Plan's routing tables in
:mod:`rayorch.core.plan_tables`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rayorch.core.errors import InvalidTransition, KernelError, NoProgressError
from rayorch.core.facts import (
    BarrierInstalled,
    ExpansionClosed,
    Fact,
    GrainCommitted,
    GrainDispatched,
    GrainFailed,
    GrainRetried,
    GrainReused,
    LeaseAcquired,
    OutputEmitted,
    RunCompleted,
    SourceAdmitted,
)
from rayorch.core.grain_lifecycle import AlreadyApplied, GrainLifecycle
from rayorch.core.ids import CallId, GrainKey, Path, format_path
from rayorch.core.kernel_audit import describe_stuck, snapshot_kernel, story_of, validate_kernel
from rayorch.core.outcome import Item
from rayorch.core.plan import Plan
from rayorch.core.propagation import expansion_outcome
from rayorch.core.vocabulary import READY

UNBOUNDED = 1 << 40


class Kernel(GrainLifecycle):
    """The lineage state of one run (or one shard) and its scheduler.

    See docs/ARCHITECTURE.md ("Kernel") for the API and its rules.
    """

    def __init__(
        self,
        plan: Plan,
        max_active_sources: int | None = None,
        total_sources: int | None = None,
        *,
        keep_history: bool = True,
    ) -> None:
        super().__init__(plan, total_sources, keep_history)
        self.max_active_sources = max_active_sources
        self._handlers: dict[type, Callable[[Any], None]] = {
            SourceAdmitted: self._on_admitted,
            GrainDispatched: self._on_dispatched,
            GrainCommitted: self._on_committed,
            GrainReused: self._on_reused,
            BarrierInstalled: self._on_barrier,
            GrainRetried: self._on_retried,
            GrainFailed: self._on_failed,
            OutputEmitted: self._on_output_emitted,
            LeaseAcquired: lambda fact: None,
        }
        self._checks: dict[type, Callable[[Any], None]] = {
            ExpansionClosed: self._on_expansion_closed,
            RunCompleted: self._on_run_completed,
        }

    # == folding ====================================================================
    def apply(self, fact: Fact) -> list[Fact]:
        """Fold one fact; return the announcements it newly derives (already logged)."""
        handler = self._handlers.get(type(fact))
        if handler is None:
            check = self._checks.get(type(fact))
            if check is None:
                raise InvalidTransition(
                    f"the kernel does not know the fact type {type(fact).__name__}")
            check(fact)  # an announcement: checked against what was derived, logged then
            return []
        if self.keep_history:
            log = self.log
            log.append(fact)
            try:
                handler(fact)
            except AlreadyApplied:
                log.pop()
                return []
            except InvalidTransition:
                log.pop()
                self._announce = []
                raise
        else:
            try:
                handler(fact)
            except AlreadyApplied:
                return []
            except InvalidTransition:
                self._announce = []
                raise
        derived = self._announce
        if not derived:
            return []
        self._announce = []
        return derived

    # -- sources ------------------------------------------------------------------
    def _on_admitted(self, fact: SourceAdmitted) -> None:
        index = fact.index
        known = self._sources.get(index)
        if known is not None:
            if known == fact:
                raise AlreadyApplied
            raise self._reject(f"source {index} was already admitted with other values", (index,))
        if len(fact.values) != self.tables.num_inputs:
            raise self._reject(
                f"source {index} has {len(fact.values)} values but forward takes "
                f"{self.tables.num_inputs} inputs; admit one value per forward argument", (index,))
        if not self.keep_history and index in self._emitted:
            raise AlreadyApplied  # delivered and forgotten: its values are not kept
        if self._run_completed or (self._total is not None and self._admitted >= self._total):
            raise self._reject(f"source {index} admitted after the input was closed", (index,))
        self._sources[index] = fact
        self._admitted += 1
        self._pending[index] = self.tables.root_ports
        path = (index,)
        for arg_index, port in self.tables.inputs:
            self._resolve(port, path, fact.values[arg_index])

    # -- announcements ------------------------------------------------------------
    def _on_expansion_closed(self, fact: ExpansionClosed) -> None:
        key = (fact.domain, fact.parent)
        state = self._expansions.get(key)
        if state is None and fact.parent and self._forgotten(fact.parent[0]):
            return  # its source was delivered and forgotten: nothing to check against
        derived = None if state is None else expansion_outcome(state)
        if derived != (fact.outcome, fact.count):
            raise self._reject(
                f"ExpansionClosed {fact.domain}[{format_path(fact.parent)}] "
                f"{fact.outcome}/{fact.count} disagrees with the facts before it "
                f"(derived: {derived})", key)

    def _on_run_completed(self, fact: RunCompleted) -> None:
        if self._run_completed and fact.sources == self._admitted:
            return
        if self.finished and fact.sources == self._admitted and (
            self._total is None or self._total == fact.sources
        ):
            self._total = fact.sources
            self._run_completed = True
            if self.keep_history:
                self.log.append(fact)
            return
        raise InvalidTransition(
            f"RunCompleted({fact.sources}) disagrees with the state: {self._admitted} "
            f"admitted, {self._completed_count} complete")

    def _on_output_emitted(self, fact: OutputEmitted) -> None:
        index = fact.index
        if index in self._outputs:
            del self._outputs[index]
            self._emitted.add(index)
            if not self.keep_history:
                self._forget(index)
            return
        if index not in self._emitted:
            raise self._reject(f"OutputEmitted for source {index}, which is not complete",
                               (index,))

    def close_input(self) -> list[Fact]:
        """No more sources will be admitted: returns ``[RunCompleted]`` if all are done."""
        if self._total is None:
            self._total = self._admitted
        if not self._run_completed:
            self._maybe_complete_run()
        derived = self._announce
        self._announce = []
        return derived

    # == scheduling =================================================================
    def admissible(self) -> int:
        """How many more sources may be admitted now (``max_active_sources`` bound)."""
        if self._total is not None:
            room = self._total - self._admitted
        else:
            room = UNBOUNDED
        if self.max_active_sources is None:
            return room
        return max(0, min(room, self.max_active_sources - len(self._pending)))

    def take_batch(self, call_id: CallId, limit: int) -> list[tuple[GrainKey, int]]:
        """Pop up to ``limit`` ready Grains of ``call_id`` per its policy, with generations.

        The caller must then apply ``GrainDispatched`` for each (or drop this kernel).
        """
        return self.take_for(call_id, limit)[0]

    def take_for(self, call_id: CallId, limit: int, idle: bool = True
                 ) -> tuple[list[tuple[GrainKey, int]], bool]:
        """:meth:`take_batch` for an actor that is ``idle`` or not; and whether the batch
        must have its actor to itself (a crash retry, taken only for an idle actor)."""
        gen = self._gen
        grains, alone = self.queues[call_id].take(limit, idle)
        return [(g, gen.get(g, 0)) for g in grains], alone

    def fresh_ready(self, grain: GrainKey) -> bool:
        """``grain`` is ready and was never dispatched (generation 0): it may be reused."""
        return self._phase.get(grain) == READY and grain not in self._gen

    def source_identity(self, path: Path) -> str | None:
        """The ``SourceAdmitted.identity`` of the active source ``path`` descends from."""
        fact = self._sources.get(path[0])
        return None if fact is None else fact.identity

    def inputs_of(self, grain: GrainKey) -> tuple[Any, ...]:
        """The input values of a ready or in-flight Grain, in Call argument order."""
        path = grain[1]
        items = self._items
        return tuple(items[(port, path)] for port in self.tables.calls[grain[0]].inputs)

    def pop_completed(self) -> list[tuple[int, tuple[Item, ...]]]:
        """Finished sources not yet emitted, with their output Items, in completion order."""
        done = []
        to_pop, outputs = self._to_pop, self._outputs
        while to_pop:
            index = to_pop.popleft()
            if index in outputs:  # else emitted meanwhile (a rebuild folds OutputEmitted)
                done.append((index, outputs[index]))
        return done

    def ready_calls(self) -> list[CallId]:
        """Calls with at least one ready Grain, in plan order."""
        return [call for call, count in self._ready.items() if count]

    def ready_count(self, call_id: CallId) -> int:
        """How many Grains of ``call_id`` are ready now (queued, not dispatched); O(1)."""
        count = self._ready.get(call_id)
        if count is None:
            raise self._unknown_call(call_id)
        return count

    def suppressed_count(self, call_id: CallId) -> int:
        """How many Grains of ``call_id`` ended Suppressed so far (never run, or barred); O(1).

        Counts the Grains decided without running because an input was Failed or Suppressed,
        those suppressed by a GroupFailure barrier before dispatch, and in-flight ones barred.
        """
        count = self._suppressed.get(call_id)
        if count is None:
            raise self._unknown_call(call_id)
        return count

    def _unknown_call(self, call_id: CallId) -> KernelError:
        known = ", ".join(self.tables.calls) or "none"
        return KernelError(f"the plan has no Call {call_id!r} (its Calls: {known}); pass a Call "
                           "id from the plan, e.g. one of Kernel.ready_calls()")

    @property
    def in_flight(self) -> int:
        """Grains dispatched and not yet committed, retried, failed or suppressed."""
        return self._in_flight

    @property
    def finished(self) -> bool:
        """Every admitted source is complete (nothing left to run until more are admitted)."""
        return not self._pending

    @property
    def run_completed(self) -> bool:
        """The input is closed and every source is complete (RunCompleted was derived)."""
        return self._run_completed

    @property
    def outputs_held(self) -> int:
        """Complete sources whose outputs are kept until their ``OutputEmitted``."""
        return len(self._outputs)

    @property
    def admitted(self) -> int:
        return self._admitted

    def admitted_sources(self) -> set[int]:
        """The index of every source folded here, delivered and forgotten ones included."""
        indexes = set(self._sources)
        indexes.update(self._emitted)
        return indexes

    def check_progress(self) -> None:
        """Raise :class:`NoProgressError` if unfinished work can never progress."""
        if self.finished or self._in_flight or any(self._ready.values()):
            return
        raise NoProgressError(describe_stuck(self))

    # == introspection ===============================================================
    def story(self, obj: Any) -> list[Fact]:
        """All facts touching one Entity (path or source index), Grain or Expansion, in order."""
        if not self.keep_history:
            raise KernelError(
                "story() needs the fact log, and this kernel keeps none (keep_history=False, "
                "as in the driver); rebuild one from the store: Kernel(plan) folding "
                "store.iter_facts(run, shard), or read it with `rayorch show RUN`")
        return story_of(self.log, self.tables, obj)

    def validate(self) -> None:
        """Check the kernel's invariants; raise KernelError naming the first one broken."""
        validate_kernel(self)

    def snapshot(self) -> dict[str, Any]:
        """The complete fold state, for comparing a rebuilt kernel with the original."""
        return snapshot_kernel(self)


def rebuild(plan: Plan, log: Sequence[Fact], **kernel_args: Any) -> Kernel:
    """A new Kernel folding ``log`` in order (what a restarted driver does)."""
    kernel = Kernel(plan, **kernel_args)
    for fact in log:
        kernel.apply(fact)
    return kernel


__all__ = ["UNBOUNDED", "Kernel", "rebuild"]
