"""Audit a stored run: check its lineage invariants and tell one source item's story.

The audit reads only facts and the stored plan description (no user code). It checks,
per shard, on the facts themselves: no Grain sealed twice, no accepted report with a
stale generation or under a barrier, one terminal fact per Expansion and per output,
child ordinals within ``0..count-1`` of their Expansion, a reduce's consumer dispatched
only after every member is terminal; then it folds the facts through the pure
:class:`~rayorch.core.state.Kernel`, which rejects any fact that does not fit, checks a
reduce's value is its members' values in ordinal order, and validates the final state.
A committed payload file that is missing or corrupt is a finding (the fold of that
shard is then skipped), never an abort.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.core.facts import (
    REPORT_PRESENT,
    BarrierInstalled,
    ExpansionClosed,
    Fact,
    GrainCommitted,
    GrainDispatched,
    GrainFailed,
    GrainRetried,
    OutputEmitted,
    RunCompleted,
    SourceAdmitted,
)
from rayorch.core.ids import CallId, DomainId, GrainKey, Path, format_grain, format_path
from rayorch.core.plan import Plan
from rayorch.core.vocabulary import EXPANSION_SUCCEEDED, GrainPhase
from rayorch.store.base import LineageStore, StoredFact
from rayorch.store.errors import PayloadError


@dataclass(frozen=True)
class Violation:
    """One broken invariant, naming the object and the fact where it showed."""

    shard: int
    seq: int
    obj: str
    message: str

    def __str__(self) -> str:
        return f"shard {self.shard} fact #{self.seq}: {self.obj}: {self.message}"


@dataclass
class AuditReport:
    run_id: str
    shards: int
    facts: int = 0
    counts: dict[str, Counter[str]] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run_id, "ok": self.ok, "shards": self.shards, "facts": self.facts,
            "counts": {k: dict(v) for k, v in self.counts.items()},
            "violations": [{"shard": v.shard, "seq": v.seq, "object": v.obj,
                            "message": v.message} for v in self.violations],
            "notes": self.notes,
        }


@dataclass(frozen=True)
class PlanShape:
    """The parts of a plan the fact-level checks need."""

    expand_feeders: dict[CallId, list[tuple[DomainId, int]]]  # call -> (child domain, output)
    reducers: dict[CallId, list[tuple[int, CallId, int, DomainId]]]  # consumer -> reduce inputs
    call_domain: dict[CallId, DomainId]  # the Domain whose Entities a Call's Grains are

    @classmethod
    def of(cls, plan: Plan) -> PlanShape:
        producer_call: dict[int, tuple[CallId, int]] = {}
        for port in plan.ports:
            node = plan.nodes[port.producer]
            if node.call is not None:
                producer_call[port.id] = (node.call.id, port.index)
        feeders: dict[CallId, list[tuple[DomainId, int]]] = {}
        reducers: dict[CallId, list[tuple[int, CallId, int, DomainId]]] = {}
        for node in plan.nodes:
            if node.kind.value == "expand" and node.inputs[0] in producer_call:
                call, index = producer_call[node.inputs[0]]
                feeders.setdefault(call, []).append((node.domain, index))
            if node.kind.value == "reduce" and node.inputs[0] in producer_call:
                child_call, index = producer_call[node.inputs[0]]
                for consumer in plan.consumers[node.outputs[0]]:
                    cnode = plan.nodes[consumer]
                    if cnode.call is None:
                        continue
                    arg = cnode.inputs.index(node.outputs[0])
                    reducers.setdefault(cnode.call.id, []).append(
                        (arg, child_call, index, node.source_domain or ""))
        call_domain = {node.call.id: node.domain for node in plan.nodes if node.call is not None}
        return cls(feeders, reducers, call_domain)


class ShardAudit:
    """Fact-level invariant checks of one shard, fed fact by fact in order."""

    def __init__(self, shard: int, shape: PlanShape, report: AuditReport) -> None:
        self.shard, self.shape, self.report = shard, shape, report
        self.grain_state: dict[GrainKey, tuple[GrainPhase, int]] = {}
        self.sealed: dict[GrainKey, int] = {}
        self.committed: dict[GrainKey, GrainCommitted] = {}
        self.barriers: set[tuple[CallId, Path]] = set()
        self.expansions: dict[tuple[DomainId, Path], ExpansionClosed] = {}
        self.closed_under: dict[Path, list[ExpansionClosed]] = {}
        self.expected: dict[tuple[DomainId, Path], tuple[int, int | None]] = {}  # seq, count
        self.admitted: set[int] = set()
        self.emitted: set[int] = set()
        self.completed = False
        self.seq = 0

    def bad(self, obj: str, message: str) -> None:
        self.report.violations.append(Violation(self.shard, self.seq, obj, message))

    def count(self, group: str, key: str) -> None:
        self.report.counts.setdefault(group, Counter())[key] += 1

    def feed(self, stored: StoredFact) -> None:
        self.seq, fact = stored.seq, stored.fact
        self.count("facts", fact.tag)
        if isinstance(fact, GrainDispatched):
            self._dispatched(fact)
        elif isinstance(fact, GrainRetried):
            self._not_sealed(fact.call, fact.path, "retried")
            self.grain_state[(fact.call, fact.path)] = (GrainPhase.READY, fact.generation)
            self.count("grains", "retried")
        elif isinstance(fact, GrainFailed):
            self._seal(fact.call, fact.path, "failed")
            self.count("grains", "failed")
        elif isinstance(fact, GrainCommitted):
            self._committed(fact)
        elif isinstance(fact, BarrierInstalled):
            self.barriers.add((fact.call, fact.parent))
            self.count("barriers", fact.call)
        elif isinstance(fact, ExpansionClosed):
            self._expansion(fact)
        elif isinstance(fact, SourceAdmitted):
            if fact.index in self.admitted:
                self.bad(f"source {fact.index}", "admitted twice")
            self.admitted.add(fact.index)
        elif isinstance(fact, OutputEmitted):
            if fact.index in self.emitted:
                self.bad(f"source {fact.index}", "output emitted twice")
            if fact.index not in self.admitted:
                self.bad(f"source {fact.index}", "output emitted but never admitted")
            self.emitted.add(fact.index)
            self.count("outputs", fact.outcome)
        elif isinstance(fact, RunCompleted):
            self.completed = True

    def _not_sealed(self, call: CallId, path: Path, what: str) -> None:
        if (call, path) in self.sealed:
            self.bad(format_grain((call, path)),
                     f"{what} after it was sealed at fact #{self.sealed[(call, path)]}")

    def _seal(self, call: CallId, path: Path, what: str) -> None:
        grain = (call, path)
        if grain in self.sealed:
            self.bad(format_grain(grain), f"sealed twice ({what}; first at fact "
                                          f"#{self.sealed[grain]})")
        else:
            self.sealed[grain] = self.seq
        self.grain_state[grain] = (GrainPhase.SEALED,
                                   self.grain_state.get(grain, (GrainPhase.WAITING, 0))[1])

    def _dispatched(self, fact: GrainDispatched) -> None:
        grain = (fact.call, fact.path)
        self._not_sealed(fact.call, fact.path, "dispatched")
        self.grain_state[grain] = (GrainPhase.IN_FLIGHT, fact.generation)
        self.count("grains", "dispatched")
        self._check_ordinal_range(fact.call, fact.path)
        for _, child_call, _, child_domain in self.shape.reducers.get(fact.call, ()):
            self._check_reduce_ready(grain, child_call, child_domain)

    def _committed(self, fact: GrainCommitted) -> None:
        grain = (fact.call, fact.path)
        state, generation = self.grain_state.get(grain, (GrainPhase.WAITING, 0))
        if state is GrainPhase.IN_FLIGHT and generation != fact.generation:
            self.bad(format_grain(grain), f"accepted a stale report (generation "
                                          f"{fact.generation}, in flight as {generation})")
        elif state not in (GrainPhase.IN_FLIGHT, GrainPhase.SEALED):
            self.bad(format_grain(grain), f"committed while {state.label}, not in flight")
        parent = fact.path[:-1]
        self._check_ordinal_range(fact.call, fact.path)
        if parent and (fact.call, parent) in self.barriers:
            self.bad(format_grain(grain), "committed after a GroupFailure barrier covered it")
        self._seal(fact.call, fact.path, "committed")
        self.committed.setdefault(grain, fact)
        self.count("grains", fact.outcome)
        if fact.outcome == REPORT_PRESENT:
            for domain, index in self.shape.expand_feeders.get(fact.call, ()):
                value = None if fact.outputs is None else fact.outputs[index]
                count = len(value) if isinstance(value, list | tuple) else None
                self.expected[(domain, fact.path)] = (self.seq, count)

    def _expansion(self, fact: ExpansionClosed) -> None:
        key = (fact.domain, fact.parent)
        name = f"expansion {fact.domain} of {format_path(fact.parent)}"
        self.count("expansions", fact.outcome)
        if key in self.expansions:
            self.bad(name, "closed twice")
            return
        self.expansions[key] = fact
        self.closed_under.setdefault(fact.parent, []).append(fact)
        expected = self.expected.get(key)
        if expected is not None and expected[1] is not None \
                and fact.outcome == EXPANSION_SUCCEEDED and expected[1] != fact.count:
            self.bad(name, f"closed with {fact.count} children but the expanded value "
                           f"has {expected[1]} elements")

    def _check_ordinal_range(self, call: CallId, path: Path) -> None:
        if len(path) < 2:
            return
        domain = self.shape.call_domain.get(call)
        for closed in self.closed_under.get(path[:-1], ()):
            # A parent may have several child Domains (one per expand): only the Call's own.
            if closed.domain == domain and \
                    closed.outcome == EXPANSION_SUCCEEDED and not 0 <= path[-1] < closed.count:
                self.bad(format_grain((call, path)),
                         f"ordinal {path[-1]} outside 0..{closed.count - 1} of its expansion")

    def _check_reduce_ready(self, grain: GrainKey, child_call: CallId, domain: DomainId) -> None:
        closed = self.expansions.get((domain, grain[1]))
        if closed is None:
            self.bad(format_grain(grain), f"dispatched before its expansion {domain} closed")
            return
        for ordinal in range(closed.count if closed.outcome == EXPANSION_SUCCEEDED else 0):
            child = (child_call, (*grain[1], ordinal))
            commit = self.committed.get(child)
            if child in self.grain_state and commit is None:
                self.bad(format_grain(grain),
                         f"reduce consumed before member {format_grain(child)} was terminal")
            elif commit is not None and commit.outcome != REPORT_PRESENT:
                self.bad(format_grain(grain),
                         f"dispatched although member {format_grain(child)} failed")

    def finish(self) -> None:
        if not self.completed:
            return
        for key, (seq, _) in self.expected.items():
            if key not in self.expansions:
                self.seq = seq
                self.bad(f"expansion {key[0]} of {format_path(key[1])}",
                         "never closed although the run completed")
        for index in sorted(self.admitted - self.emitted):
            self.bad(f"source {index} was never delivered",
                     f"deliver it with `rayorch resume {self.report.run_id} --out-dir DIR`")


def _fold_through_kernel(plan: Plan, shard: int, facts: list[StoredFact], shape: PlanShape,
                         report: AuditReport, committed: dict[GrainKey, GrainCommitted]) -> None:
    try:
        from rayorch.core.state import Kernel
    except ImportError:  # the kernel ships with rayorch; tolerate partial checkouts
        report.notes.append("kernel not available: fold checks skipped")
        return
    kernel = Kernel(plan)
    seq = 0
    try:
        for stored in facts:
            seq, fact = stored.seq, stored.fact
            if isinstance(fact, GrainDispatched):
                _check_reduce_order(kernel, fact, shape, committed, report, shard, seq)
            kernel.apply(fact)
        kernel.validate()
    except RayorchError as exc:
        report.violations.append(Violation(shard, seq, "kernel", str(exc)))


def _check_reduce_order(kernel: Any, fact: GrainDispatched, shape: PlanShape,
                        committed: dict[GrainKey, GrainCommitted], report: AuditReport,
                        shard: int, seq: int) -> None:
    """The value a reduce hands its consumer is the members' values in ordinal order."""
    specs = shape.reducers.get(fact.call)
    if not specs or fact.generation:
        return
    try:
        inputs = kernel.inputs_of((fact.call, fact.path))
    except (KeyError, IndexError):
        return  # not ready in the kernel: the fold itself reports the bad transition
    for arg, child_call, index, _ in specs:
        value = inputs[arg]
        if not isinstance(value, list | tuple):
            continue
        members = sorted(
            (c.path[-1], None if c.outputs is None else c.outputs[index])
            for (call, path), c in committed.items()
            if call == child_call and path[:-1] == fact.path and c.outcome == REPORT_PRESENT
        )
        expected = [v for _, v in members]
        if list(value) != expected:
            report.violations.append(Violation(
                shard, seq, format_grain((fact.call, fact.path)),
                "reduce input is not its members' values in ordinal order"))


def audit_run(store: LineageStore, run_id: str) -> AuditReport:
    """Check every invariant of a stored run; see the module docstring."""
    info = store.run_info(run_id)
    plan = Plan.from_description(info.plan)
    shape = PlanShape.of(plan)
    report = AuditReport(run_id, info.shards)
    for shard in range(info.shards):
        facts, unresolved = _read_shard(store, run_id, shard, report)
        report.facts += len(facts)
        checks = ShardAudit(shard, shape, report)
        for stored in facts:
            checks.feed(stored)
        checks.finish()
        report.counts.setdefault("sources", Counter())["admitted"] += len(checks.admitted)
        report.counts["sources"]["completed shards"] += int(checks.completed)
        if unresolved:
            report.notes.append(f"shard {shard}: kernel fold skipped ({unresolved} committed "
                                "outputs cannot be read)")
        else:
            _fold_through_kernel(plan, shard, facts, shape, report, checks.committed)
    return report


def _read_shard(store: LineageStore, run_id: str, shard: int, report: AuditReport
                ) -> tuple[list[StoredFact], int]:
    """The shard's facts with payloads loaded; a payload that does not resolve is a finding."""
    facts: list[StoredFact] = []
    unresolved = 0
    for stored in store.iter_facts(run_id, shard, payloads=False):
        fact = stored.fact
        if isinstance(fact, GrainCommitted) and fact.payload_ref is not None \
                and fact.outputs is None:
            try:
                stored = stored._replace(fact=store.resolve_payload(fact))
            except PayloadError as exc:
                unresolved += 1
                report.violations.append(Violation(
                    shard, stored.seq, f"run {run_id} {format_grain((fact.call, fact.path))}",
                    f"committed payload file {fact.payload_ref!r} does not resolve "
                    f"({exc.detail})"))
        facts.append(stored)
    return facts, unresolved


def entity_story(store: LineageStore, run_id: str, path: Path) -> list[StoredFact]:
    """The facts of one Entity and its descendants (and their barriers), in order."""
    info = store.run_info(run_id)
    shard = info.shard_of(path[0])
    n = len(path)

    def touches(fact: Fact) -> bool:
        own = getattr(fact, "path", None)
        if own is None:
            own = getattr(fact, "parent", None)
        if own is None and isinstance(fact, SourceAdmitted | OutputEmitted):
            own = (fact.index,)
        return own is not None and tuple(own[:n]) == path

    return [s for s in store.iter_facts(run_id, shard) if touches(s.fact)]
