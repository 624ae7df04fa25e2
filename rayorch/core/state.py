"""The lineage kernel: a pure, deterministic fold of facts into run state.

``Kernel.apply(fact)`` folds one fact and returns the announcements it newly derives
(``ExpansionClosed``, ``RunCompleted``). Everything else the kernel knows (Items,
suppression, Dropped, reduce results, completion) is derived from the primary facts in
their order, so a new Kernel folding the same facts reaches the identical state.

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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rayorch.core.commit import CommitVerdict, GrainPhase, commit_verdict
from rayorch.core.errors import InvalidTransition, NoProgressError
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
    LeaseAcquired,
    OutputEmitted,
    RunCompleted,
    SourceAdmitted,
)
from rayorch.core.ids import CallId, GrainKey, Path, format_grain, format_path
from rayorch.core.outcome import Item, Outcome
from rayorch.core.plan import Plan
from rayorch.core.scheduler import (
    DROPPED_X,
    FAILED_X,
    Absent,
    BroadcastInfo,
    CallInfo,
    CallQueue,
    ExpandInfo,
    PlanTables,
    ReduceInfo,
    as_item,
    broadcast_item,
    describe_stuck,
    expansion_outcome,
    snapshot_kernel,
    story_filter,
    suppressed_by,
    validate_kernel,
)
from rayorch.core.udf import expansion_elements

READY, IN_FLIGHT, SEALED, BARRED = 1, 2, 3, 4
PHASE_NAMES = {None: "waiting or decided without running", READY: "ready",
               IN_FLIGHT: "in flight", SEALED: "sealed", BARRED: "barred (in flight, suppressed)"}
_PENDING: Any = object()
_DROPPED = Absent(Outcome.DROPPED, None)
UNBOUNDED = 1 << 40


class _AlreadyApplied(Exception):
    """The fact was applied before (identical): a no-op that is not logged again."""


class Kernel:
    """The lineage state of one run (or one shard) and its scheduler.

    See docs/ARCHITECTURE.md ("Kernel") for the API and its rules.
    """

    def __init__(
        self,
        plan: Plan,
        max_active_sources: int | None = None,
        total_sources: int | None = None,
    ) -> None:
        self.plan = plan
        self.max_active_sources = max_active_sources
        self.tables = tables = PlanTables(plan)
        self._items: dict[tuple[int, Path], Any] = {}
        self._phase: dict[GrainKey, int] = {}
        self._gen: dict[GrainKey, int] = {}
        self._sealed_by: dict[GrainKey, Fact] = {}
        self._barriers: dict[tuple[CallId, Path], str] = {}
        self._expansions: dict[tuple[str, Path], int] = {}
        self._reduce_left: dict[tuple[int, Path], int] = {}
        self._pending: dict[int, int] = {}
        self._sources: dict[int, SourceAdmitted] = {}
        self._completed: list[int] = []
        self._outputs: dict[int, tuple[Item, ...]] = {}
        self._emitted: set[int] = set()
        self._ready: dict[CallId, int] = {c: 0 for c in tables.calls}
        self._in_flight = 0
        self._total = total_sources
        self._run_completed = False
        self._pop_cursor = 0
        self.log: list[Fact] = []
        self._announce: list[Fact] = []
        self.queues: dict[CallId, CallQueue] = {
            c: CallQueue(c, info.policy, self._phase, self._gen) for c, info in tables.calls.items()
        }
        tables.bind(
            {"call": self._try_ready, "expand": self._expand, "reduce": self._member_done,
             "filter": self._filter, "broadcast": self._broadcast_from},
            self.queues,
        )
        self._handlers: dict[type, Callable[[Any], None]] = {
            SourceAdmitted: self._on_admitted,
            GrainDispatched: self._on_dispatched,
            GrainCommitted: self._on_committed,
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
        self._calls = tables.calls
        self._consumers = tables.consumers

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
        log = self.log
        log.append(fact)
        try:
            handler(fact)
        except _AlreadyApplied:
            log.pop()
            return []
        except InvalidTransition:
            log.pop()
            self._announce = []
            raise
        derived = self._announce
        if not derived:
            return []
        self._announce = []
        return derived

    def _emit(self, fact: Fact) -> None:
        self.log.append(fact)
        self._announce.append(fact)

    def _reject(self, message: str, obj: Any) -> InvalidTransition:
        return InvalidTransition(message, tuple(self.story(obj)))

    # -- sources ------------------------------------------------------------------
    def _on_admitted(self, fact: SourceAdmitted) -> None:
        index = fact.index
        known = self._sources.get(index)
        if known is not None:
            if known == fact:
                raise _AlreadyApplied
            raise self._reject(f"source {index} was already admitted with other values", (index,))
        if len(fact.values) != self.tables.num_inputs:
            raise self._reject(
                f"source {index} has {len(fact.values)} values but forward takes "
                f"{self.tables.num_inputs} inputs; admit one value per forward argument", (index,))
        if self._run_completed or (self._total is not None and len(self._sources) >= self._total):
            raise self._reject(f"source {index} admitted after the input was closed", (index,))
        self._sources[index] = fact
        self._pending[index] = self.tables.root_ports
        path = (index,)
        for arg_index, port in self.tables.inputs:
            self._resolve(port, path, fact.values[arg_index])

    # -- grains -------------------------------------------------------------------
    def _on_dispatched(self, fact: GrainDispatched) -> None:
        grain = (fact.call, fact.path)
        phase = self._phase.get(grain)
        generation = self._gen.get(grain, 0)
        if phase == READY and generation == fact.generation:
            self._phase[grain] = IN_FLIGHT
            self._ready[fact.call] -= 1
            self._in_flight += 1
            return
        if (phase in (IN_FLIGHT, SEALED, BARRED) and fact.generation <= generation) or (
            phase == READY and fact.generation < generation
        ):
            raise _AlreadyApplied  # this dispatch is already history
        if phase is None and self._barred(grain):
            return  # a barrier suppressed it before this dispatch landed: changes nothing
        raise self._reject(
            f"GrainDispatched {format_grain(grain)} generation {fact.generation}: the grain is "
            f"{PHASE_NAMES.get(phase)} at generation {generation}", grain)

    def _on_committed(self, fact: GrainCommitted) -> None:
        grain = (fact.call, fact.path)
        phase_of = self._phase
        if phase_of.get(grain) != IN_FLIGHT or self._gen.get(grain, 0) != fact.generation:
            if phase_of.get(grain) == SEALED and self._sealed_by.get(grain) == fact:
                raise _AlreadyApplied  # an identical commit again
            verdict = self.verdict(fact)
            raise self._reject(
                f"GrainCommitted {format_grain(grain)} generation {fact.generation} does not pass "
                f"the commit gate ({verdict.name}); only reports accepted by verdict() may be "
                "applied", grain)
        info = self._calls[fact.call]
        outcome = fact.outcome
        path = fact.path
        if outcome == REPORT_PRESENT:
            outputs = fact.outputs
            if outputs is None or len(outputs) != info.num_outputs:
                got = "a payload reference" if outputs is None else f"{len(outputs)}"
                raise self._reject(
                    f"GrainCommitted {format_grain(grain)}: expected {info.num_outputs} inline "
                    f"output value(s), got {got}; resolve payload_ref to values before applying",
                    grain)
            phase_of[grain] = SEALED
            self._sealed_by[grain] = fact
            self._in_flight -= 1
            if info.num_outputs == 1:
                self._resolve(info.outputs[0], path, outputs[0])
            else:
                for port, value in zip(info.outputs, outputs):
                    self._resolve(port, path, value)
            return
        if outcome != REPORT_RECORD_FAILURE and outcome != REPORT_GROUP_FAILURE:
            raise self._reject(f"GrainCommitted {format_grain(grain)}: unknown outcome {outcome!r}",
                               grain)
        phase_of[grain] = SEALED
        self._sealed_by[grain] = fact
        self._in_flight -= 1
        failure = Absent(Outcome.FAILED, fact.cause or outcome, format_grain(grain))
        for port in info.outputs:
            self._resolve(port, path, failure)
        if outcome == REPORT_GROUP_FAILURE and len(path) > 1:
            key = (info.id, path[:-1])
            if key not in self._barriers:
                self._install_barrier(info, path[:-1], f"GroupFailure at {format_grain(grain)}: "
                                      f"{fact.cause or 'group failure'}")

    def _on_barrier(self, fact: BarrierInstalled) -> None:
        info = self.tables.calls.get(fact.call)
        if info is None or info.root:
            raise self._reject(f"BarrierInstalled for {fact.call!r} under {fact.parent}: no such "
                               "Call in a child Domain", fact.parent)
        if (fact.call, fact.parent) in self._barriers:
            return  # installed with its GroupFailure commit
        if self._expansions.get((info.domain, fact.parent), -1) < 0:
            raise self._reject(f"BarrierInstalled under {format_path(fact.parent)}: that parent "
                               f"has no children in {info.domain}", fact.parent)
        self._install_barrier(info, fact.parent, fact.cause or "group failure")

    def _install_barrier(self, info: CallInfo, parent: Path, cause: str) -> None:
        """Suppress every not-yet-sealed sibling of ``info`` under ``parent``."""
        self._barriers[(info.id, parent)] = cause
        if parent[0] not in self._pending:
            return  # the source is already complete: nothing left to suppress
        suppressed = Absent(Outcome.SUPPRESSED, cause)
        phase_of = self._phase
        items = self._items
        out0 = info.outputs[0]
        pending = self._pending
        source = parent[0]
        for ordinal in range(self._expansions[(info.domain, parent)]):
            if source not in pending:
                return  # the source completed: its Items were released
            path = (*parent, ordinal)
            grain = (info.id, path)
            phase = phase_of.get(grain)
            if phase == READY:
                del phase_of[grain]
                self._ready[info.id] -= 1
            elif phase == IN_FLIGHT:
                phase_of[grain] = BARRED
                self._in_flight -= 1
            elif phase is not None or (out0, path) in items:
                continue  # sealed, barred, or decided by its inputs
            for port in info.outputs:
                self._resolve(port, path, suppressed)

    def _barred(self, grain: GrainKey) -> bool:
        return len(grain[1]) > 1 and (grain[0], grain[1][:-1]) in self._barriers

    def _on_retried(self, fact: GrainRetried) -> None:
        grain = (fact.call, fact.path)
        phase = self._phase.get(grain)
        generation = self._gen.get(grain, 0)
        info = self.tables.calls.get(fact.call)
        if info is not None and phase == IN_FLIGHT and fact.generation == generation + 1:
            if fact.generation >= info.max_attempts:
                raise self._reject(
                    f"GrainRetried {format_grain(grain)} to generation {fact.generation}, but "
                    f"max_attempts is {info.max_attempts}: write GrainFailed instead", grain)
            self._phase[grain] = READY
            self._gen[grain] = fact.generation
            self._in_flight -= 1
            self._ready[fact.call] += 1
            self.queues[fact.call].push_recovery(grain, fact.generation)
            return
        if phase == BARRED:
            return  # a barrier already suppressed the grain: changes nothing
        if phase == READY and generation == fact.generation:
            raise _AlreadyApplied  # the same retry again
        raise self._reject(
            f"GrainRetried {format_grain(grain)} to generation {fact.generation}: the grain is "
            f"{PHASE_NAMES.get(phase)} at generation {generation}", grain)

    def _on_failed(self, fact: GrainFailed) -> None:
        grain = (fact.call, fact.path)
        phase = self._phase.get(grain)
        if phase == IN_FLIGHT and self._gen.get(grain, 0) == fact.generation:
            self._phase[grain] = SEALED
            self._sealed_by[grain] = fact
            self._in_flight -= 1
            failure = Absent(Outcome.FAILED, fact.cause, format_grain(grain))
            for port in self.tables.calls[fact.call].outputs:
                self._resolve(port, fact.path, failure)
            return
        if phase == BARRED:
            return  # a barrier already suppressed the grain: changes nothing
        if phase == SEALED and self._sealed_by.get(grain) == fact:
            raise _AlreadyApplied
        raise self._reject(
            f"GrainFailed {format_grain(grain)} generation {fact.generation}: the grain is "
            f"{PHASE_NAMES.get(phase)} at generation {self._gen.get(grain, 0)}", grain)

    # -- announcements ------------------------------------------------------------
    def _on_expansion_closed(self, fact: ExpansionClosed) -> None:
        key = (fact.domain, fact.parent)
        state = self._expansions.get(key)
        derived = None if state is None else expansion_outcome(state)
        if derived != (fact.outcome, fact.count):
            raise self._reject(
                f"ExpansionClosed {fact.domain}[{format_path(fact.parent)}] "
                f"{fact.outcome}/{fact.count} disagrees with the facts before it "
                f"(derived: {derived})", key)

    def _on_run_completed(self, fact: RunCompleted) -> None:
        if self._run_completed and fact.sources == len(self._sources):
            return
        if self.finished and fact.sources == len(self._sources) and (
            self._total is None or self._total == fact.sources
        ):
            self._total = fact.sources
            self._run_completed = True
            self.log.append(fact)
            return
        raise InvalidTransition(
            f"RunCompleted({fact.sources}) disagrees with the state: {len(self._sources)} "
            f"admitted, {len(self._completed)} complete")

    def _on_output_emitted(self, fact: OutputEmitted) -> None:
        if fact.index not in self._outputs and fact.index not in self._emitted:
            raise self._reject(f"OutputEmitted for source {fact.index}, which is not complete",
                               (fact.index,))
        self._emitted.add(fact.index)
        self._outputs.pop(fact.index, None)

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
            for port in info.outputs:
                self._resolve(port, path, suppressed)
            return
        self._phase[grain] = READY
        self._ready[info.id] += 1
        info.queue_push(grain)

    def _decide_without_running(self, info: CallInfo, path: Path, cause: Absent) -> None:
        result = _DROPPED if cause.outcome is Outcome.DROPPED else suppressed_by(cause)
        for port in info.outputs:
            self._resolve(port, path, result)

    def _expand(self, info: ExpandInfo, path: Path, value: Any) -> None:
        """The expanded Item of ``path`` resolved: close the Expansion, create the children."""
        key = (info.domain, path)
        if type(value) is Absent:
            dropped = value.outcome is Outcome.DROPPED
            self._close_expansion(key, DROPPED_X if dropped else FAILED_X)
            result = _DROPPED if dropped else suppressed_by(value)
            for reduce in info.reduces:
                self._resolve(reduce.output, path, result)
            return
        elements = expansion_elements(value)
        if elements is None:
            self._close_expansion(key, FAILED_X)
            failure = Absent(Outcome.SUPPRESSED, f"F.expand into {info.domain} at "
                             f"{format_path(path)}: the value is a {type(value).__name__}, not "
                             "a sequence; the expanded module must return a list per record")
            for reduce in info.reduces:
                self._resolve(reduce.output, path, failure)
            return
        count = len(elements)
        self._close_expansion(key, count)
        if count == 0:
            for reduce in info.reduces:
                self._resolve(reduce.output, path, [])
            return
        for reduce in info.reduces:
            self._reduce_left[(reduce.node, path)] = count
        self._pending[path[0]] += count * info.ports_per_child
        port = info.output
        broadcasts = info.broadcasts
        for ordinal, element in enumerate(elements):
            child = (*path, ordinal)
            self._resolve(port, child, element)
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
        self._completed.append(source)
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

    def _maybe_complete_run(self) -> None:
        if len(self._sources) == self._total and not self._pending:
            self._run_completed = True
            self._emit(RunCompleted(self._total))

    def close_input(self) -> list[Fact]:
        """No more sources will be admitted: returns ``[RunCompleted]`` if all are done."""
        if self._total is None:
            self._total = len(self._sources)
        if not self._run_completed:
            self._maybe_complete_run()
        derived = self._announce
        self._announce = []
        return derived

    # == scheduling =================================================================
    def admissible(self) -> int:
        """How many more sources may be admitted now (``max_active_sources`` bound)."""
        if self._total is not None:
            room = self._total - len(self._sources)
        else:
            room = UNBOUNDED
        if self.max_active_sources is None:
            return room
        return max(0, min(room, self.max_active_sources - len(self._pending)))

    def take_batch(self, call_id: CallId, limit: int) -> list[tuple[GrainKey, int]]:
        """Pop up to ``limit`` ready Grains of ``call_id`` per its policy, with generations.

        The caller must then apply ``GrainDispatched`` for each (or drop this kernel).
        """
        gen = self._gen
        return [(g, gen.get(g, 0)) for g in self.queues[call_id].take(limit)]

    def inputs_of(self, grain: GrainKey) -> tuple[Any, ...]:
        """The input values of a ready or in-flight Grain, in Call argument order."""
        path = grain[1]
        items = self._items
        return tuple(items[(port, path)] for port in self.tables.calls[grain[0]].inputs)

    def physical_failure(
        self, batch: list[tuple[GrainKey, int]], cause: str, ts: float = 0.0
    ) -> list[Fact]:
        """Facts for a failed attempt: GrainRetried (gen + 1) or GrainFailed after max_attempts.

        Only Grains still in flight with that generation are affected (not barred, not sealed).
        The caller writes and applies the returned facts.
        """
        facts: list[Fact] = []
        for grain, generation in batch:
            if self._phase.get(grain) != IN_FLIGHT or self._gen.get(grain, 0) != generation:
                continue
            call, path = grain
            if generation + 1 >= self.tables.calls[call].max_attempts:
                facts.append(GrainFailed(call, path, generation, cause, ts=ts))
            else:
                facts.append(GrainRetried(call, path, generation + 1, cause, ts=ts))
        return facts

    def verdict(self, report: GrainCommitted) -> CommitVerdict:
        """The commit gate (DESIGN 4.4) for one report; changes nothing."""
        grain = (report.call, report.path)
        phase = self._phase.get(grain)
        barred = phase == BARRED
        gate_phase = None if phase is None else GrainPhase(IN_FLIGHT if barred else phase)
        return commit_verdict(gate_phase, self._gen.get(grain, 0), report.generation, barred)

    def pop_completed(self) -> list[tuple[int, tuple[Item, ...]]]:
        """Finished sources not yet emitted, with their output Items, in completion order."""
        done = []
        while self._pop_cursor < len(self._completed):
            index = self._completed[self._pop_cursor]
            self._pop_cursor += 1
            if index not in self._emitted:
                done.append((index, self._outputs[index]))
        return done

    def ready_calls(self) -> list[CallId]:
        """Calls with at least one ready Grain, in plan order."""
        return [call for call, count in self._ready.items() if count]

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
    def admitted(self) -> int:
        return len(self._sources)

    def check_progress(self) -> None:
        """Raise :class:`NoProgressError` if unfinished work can never progress."""
        if self.finished or self._in_flight or any(self._ready.values()):
            return
        raise NoProgressError(describe_stuck(self))

    # == introspection ===============================================================
    def story(self, obj: Any) -> list[Fact]:
        """All facts touching one Entity (path or source index), Grain or Expansion, in order."""
        keep = story_filter(self.tables, obj)
        return [fact for fact in self.log if keep(fact)]

    def validate(self) -> None:
        """Check the kernel's invariants; raise KernelError naming the first one broken."""
        validate_kernel(self)

    def snapshot(self) -> dict[str, Any]:
        """The complete fold state, for comparing a rebuilt kernel with the original."""
        return snapshot_kernel(self)


__all__ = ["BARRED", "IN_FLIGHT", "READY", "SEALED", "Kernel"]
