"""How the Grain lifecycle facts change the kernel, and the commit gate.

:class:`GrainLifecycle` is the middle layer of :class:`~rayorch.core.state.Kernel`: it
folds ``GrainDispatched`` (READY -> IN_FLIGHT), ``GrainCommitted`` (IN_FLIGHT -> SEALED,
outputs resolved), ``GrainReused`` (READY -> SEALED with an earlier run's outputs),
``GrainRetried`` (back to READY on the recovery queue, generation + 1),
``GrainFailed`` and ``BarrierInstalled`` (siblings suppressed; an in-flight one BARRED),
and answers ``verdict`` (docs/ARCHITECTURE.md, "Semantics" 4) and ``physical_failure``
for the caller. Facts that are already history raise :class:`AlreadyApplied` (a no-op
that is not logged again).
"""

from __future__ import annotations

from rayorch.core.commit import commit_verdict
from rayorch.core.crash_split import retry_decision, uncharged_budget
from rayorch.core.facts import (
    REPORT_GROUP_FAILURE,
    REPORT_PRESENT,
    REPORT_RECORD_FAILURE,
    BarrierInstalled,
    Fact,
    GrainCommitted,
    GrainDispatched,
    GrainFailed,
    GrainRetried,
    GrainReused,
)
from rayorch.core.ids import GrainKey, Path, format_grain, format_path
from rayorch.core.outcome import Outcome
from rayorch.core.plan_tables import CallInfo
from rayorch.core.propagation import Absent, ItemPropagation
from rayorch.core.vocabulary import (
    BARRED,
    IN_FLIGHT,
    READY,
    SEALED,
    CommitVerdict,
    GrainPhase,
    phase_text,
)


class AlreadyApplied(Exception):
    """The fact was applied before (identical): a no-op that is not logged again."""


class GrainLifecycle(ItemPropagation):
    """Folds the facts of a Grain's lifecycle; see the module docstring."""

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
            raise AlreadyApplied  # this dispatch is already history
        if phase is None and self._barred(grain):
            return  # a barrier suppressed it before this dispatch landed: changes nothing
        if phase is None and self._forgotten(fact.path[0]):
            raise AlreadyApplied
        raise self._reject(
            f"GrainDispatched {format_grain(grain)} generation {fact.generation}: the grain is "
            f"{phase_text(phase)} at generation {generation}", grain)

    def _on_committed(self, fact: GrainCommitted) -> None:
        grain = (fact.call, fact.path)
        phase_of = self._phase
        if phase_of.get(grain) != IN_FLIGHT or self._gen.get(grain, 0) != fact.generation:
            if phase_of.get(grain) == SEALED and self._sealed_with(grain, fact):
                raise AlreadyApplied  # an identical commit again
            if self._forgotten(fact.path[0]):
                raise AlreadyApplied
            verdict = self.verdict(fact)
            raise self._reject(
                f"GrainCommitted {format_grain(grain)} generation {fact.generation} does not pass "
                f"the commit gate ({verdict.name}); only reports accepted by verdict() may be "
                "applied", grain)
        info = self._calls[fact.call]
        outcome = fact.outcome
        path = fact.path
        if outcome == REPORT_PRESENT:
            outputs = self._inline_outputs(fact, info)
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

    def _inline_outputs(self, fact: GrainCommitted | GrainReused,
                        info: CallInfo) -> tuple[object, ...]:
        """The fact's output values; rejected unless inline and one per Call output."""
        outputs = fact.outputs
        if outputs is None or len(outputs) != info.num_outputs:
            got = "a payload reference" if outputs is None else f"{len(outputs)}"
            raise self._reject(
                f"{type(fact).__name__} {format_grain((fact.call, fact.path))}: expected "
                f"{info.num_outputs} inline output value(s), got {got}; resolve payload_ref "
                "to values before applying", (fact.call, fact.path))
        return outputs

    def _on_reused(self, fact: GrainReused) -> None:
        """An earlier run's outputs seal a ready Grain that was never dispatched."""
        grain = (fact.call, fact.path)
        phase = self._phase.get(grain)
        if phase == READY and grain not in self._gen and fact.generation == 0:
            info = self._calls[fact.call]
            outputs = self._inline_outputs(fact, info)
            self._phase[grain] = SEALED
            self._sealed_by[grain] = fact
            self._ready[fact.call] -= 1
            for port, value in zip(info.outputs, outputs):
                self._resolve(port, fact.path, value)
            return
        if phase == SEALED and self._sealed_with(grain, fact):
            raise AlreadyApplied
        if phase is None and self._forgotten(fact.path[0]):
            raise AlreadyApplied
        raise self._reject(
            f"GrainReused {format_grain(grain)}: the grain is {phase_text(phase)} at generation "
            f"{self._gen.get(grain, 0)}; only a ready Grain never dispatched can be reused",
            grain)

    def _on_barrier(self, fact: BarrierInstalled) -> None:
        info = self.tables.calls.get(fact.call)
        if info is None or info.root:
            raise self._reject(f"BarrierInstalled for {fact.call!r} under {fact.parent}: no such "
                               "Call in a child Domain", fact.parent)
        if (fact.call, fact.parent) in self._barriers:
            return  # installed with its GroupFailure commit
        if self._expansions.get((info.domain, fact.parent), -1) < 0:
            if fact.parent and self._forgotten(fact.parent[0]):
                raise AlreadyApplied
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
            self._suppressed[info.id] += 1
            for port in info.outputs:
                self._resolve(port, path, suppressed)

    def _sealed_with(self, grain: GrainKey, fact: Fact) -> bool:
        """``fact`` (being applied, last in the log) is the one that sealed ``grain`` before.

        Once the Grain's source completes, its sealing fact is released from ``_sealed_by``;
        an identical re-applied fact is then found in the log (a rare path, not the hot one).
        Without a log, a fact sealing the same generation is taken for the same seal: the
        commit gate admits one seal per Grain, so another one cannot have been applied.
        """
        sealed = self._sealed_by.get(grain)
        if sealed is not None:
            return sealed == fact
        if grain[1][0] in self._pending:
            return False
        if not self.keep_history:
            return self._gen.get(grain, 0) == getattr(fact, "generation", -1)
        log = self.log
        return log.index(fact) != len(log) - 1

    def _barred(self, grain: GrainKey) -> bool:
        return len(grain[1]) > 1 and (grain[0], grain[1][:-1]) in self._barriers

    def _on_retried(self, fact: GrainRetried) -> None:
        grain = (fact.call, fact.path)
        phase = self._phase.get(grain)
        generation = self._gen.get(grain, 0)
        info = self.tables.calls.get(fact.call)
        if info is not None and phase == IN_FLIGHT and fact.generation == generation + 1:
            uncharged = self._uncharged.get(grain, 0)
            if fact.charged and generation - uncharged + 1 >= info.max_attempts:
                raise self._reject(
                    f"GrainRetried {format_grain(grain)} to generation {fact.generation}, but "
                    f"max_attempts is {info.max_attempts}: write GrainFailed instead", grain)
            if not fact.charged:
                if uncharged >= uncharged_budget(info.batch_size):
                    raise self._reject(
                        f"GrainRetried {format_grain(grain)} to generation {fact.generation} "
                        f"uncharged, but it had its {uncharged} uncharged crash retries: "
                        "charge it", grain)
                self._uncharged[grain] = uncharged + 1
            self._phase[grain] = READY
            self._gen[grain] = fact.generation
            self._in_flight -= 1
            self._ready[fact.call] += 1
            self.queues[fact.call].push_recovery(grain, fact.generation, fact.limit, fact.alone)
            return
        if phase == BARRED:
            return  # a barrier already suppressed the grain: changes nothing
        if phase == READY and generation == fact.generation:
            raise AlreadyApplied  # the same retry again
        if phase is None and self._forgotten(fact.path[0]):
            raise AlreadyApplied
        raise self._reject(
            f"GrainRetried {format_grain(grain)} to generation {fact.generation}: the grain is "
            f"{phase_text(phase)} at generation {generation}", grain)

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
        if phase == SEALED and self._sealed_with(grain, fact):
            raise AlreadyApplied
        if phase is None and self._forgotten(fact.path[0]):
            raise AlreadyApplied
        raise self._reject(
            f"GrainFailed {format_grain(grain)} generation {fact.generation}: the grain is "
            f"{phase_text(phase)} at generation {self._gen.get(grain, 0)}", grain)


    def physical_failure(
        self, batch: list[tuple[GrainKey, int]], cause: str, ts: float = 0.0, *,
        crashed: bool = False, alone: bool = False,
    ) -> list[Fact]:
        """Facts for a failed attempt: GrainRetried (gen + 1) or GrainFailed (core/crash_split).

        ``crashed``: the actor died under the attempt; ``alone``: the attempt had its actor
        to itself. Only Grains still in flight with that generation are affected (not
        barred, not sealed). The caller writes and applies the returned facts.
        """
        live = [(grain, generation) for grain, generation in batch
                if self._phase.get(grain) == IN_FLIGHT
                and self._gen.get(grain, 0) == generation]
        facts: list[Fact] = []
        for grain, generation in live:
            call, path = grain
            info = self.tables.calls[call]
            uncharged = self._uncharged.get(grain, 0)
            decision = retry_decision(
                crashed=crashed, alone=alone, size=len(live), uncharged=uncharged,
                charged=generation - uncharged, max_attempts=info.max_attempts,
                batch_size=info.batch_size)
            if decision.fail:
                facts.append(GrainFailed(call, path, generation, cause, ts=ts))
            else:
                facts.append(GrainRetried(call, path, generation + 1, cause, decision.limit,
                                          decision.charged, decision.alone, ts=ts))
        return facts

    def in_flight_grains(self) -> list[tuple[GrainKey, int]]:
        """Every Grain in flight, with the generation it was dispatched at."""
        gen = self._gen
        return [(grain, gen.get(grain, 0)) for grain, phase in self._phase.items()
                if phase == IN_FLIGHT]

    def verdict(self, report: GrainCommitted) -> CommitVerdict:
        """The commit gate (docs/ARCHITECTURE.md, "Semantics" 4) for one report; changes nothing."""
        grain = (report.call, report.path)
        phase = self._phase.get(grain)
        if phase is None and self._forgotten(report.path[0]):
            return CommitVerdict.SEALED  # its source was delivered and forgotten
        barred = phase == BARRED
        gate_phase = None if phase is None else GrainPhase(IN_FLIGHT if barred else phase)
        return commit_verdict(gate_phase, self._gen.get(grain, 0), report.generation, barred)


__all__ = ["AlreadyApplied", "GrainLifecycle"]
