"""Audit a stored run: check its lineage invariants and tell one source item's story.

The audit reads only facts and the stored plan description (no user code). It checks,
per shard, on the facts themselves: no Grain sealed twice, no accepted report with a
stale generation or under a barrier, one terminal fact per Expansion and per output,
child ordinals within ``0..count-1`` of their Expansion, a reduce's consumer dispatched
only after every member is terminal; then it folds the facts through the pure
:class:`~rayorch.core.state.Kernel`, which rejects any fact that does not fit, checks a
reduce's value is its members' values in ordinal order, and validates the final state.
A committed payload file that is missing or corrupt is a finding (the fold of that
shard is then skipped), never an abort. Each ``GrainReused`` must name a Grain its origin
run sealed with the same reuse key and outputs (:mod:`rayorch.store.reuse_audit`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.core.facts import (
    REPORT_PRESENT,
    Fact,
    GrainCommitted,
    GrainDispatched,
    GrainRetried,
    GrainReused,
    OutputEmitted,
    SourceAdmitted,
)
from rayorch.core.ids import CallId, DomainId, GrainKey, Path, format_grain, format_path
from rayorch.core.plan import Plan
from rayorch.core.run_view import (
    GrainView,
    ShardView,
    first_before,
    fold_shard,
)
from rayorch.core.vocabulary import EXPANSION_SUCCEEDED, GrainPhase
from rayorch.inspect.drops import check_claims
from rayorch.store.base import LineageStore, RunInfo, StoredFact
from rayorch.store.errors import PayloadError
from rayorch.store.layout import kept_calls
from rayorch.store.payload import is_freed
from rayorch.store.progress import declared_sources
from rayorch.store.reuse_audit import check_reuse


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
    delivery: list[str] = field(default_factory=list)  # file sink problems, when checked
    places: list[str] = field(default_factory=list)  # where each shard's facts live

    @property
    def ok(self) -> bool:
        return not self.violations and not self.delivery

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run_id, "ok": self.ok, "shards": self.shards, "facts": self.facts,
            "counts": {k: dict(v) for k, v in self.counts.items()},
            "violations": [{"shard": v.shard, "seq": v.seq, "object": v.obj,
                            "message": v.message} for v in self.violations],
            "notes": self.notes, "delivery": self.delivery, "places": self.places,
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
            if node.kind == "expand" and node.inputs[0] in producer_call:
                call, index = producer_call[node.inputs[0]]
                feeders.setdefault(call, []).append((node.domain, index))
            if node.kind == "reduce" and node.inputs[0] in producer_call:
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
    """Fact-level invariant checks of one shard, on its view (each fact checked against
    what the view shows was written before it)."""

    def __init__(self, view: ShardView, shape: PlanShape, report: AuditReport) -> None:
        self.view, self.shape, self.report = view, shape, report
        self.found: list[tuple[int, str, str]] = []  # (seq, object, message)
        self.counted: list[tuple[int, str, str]] = []  # (seq, group, key)
        # (child Domain, parent) -> [(seq, count)] of each commit of the expanded value, in
        # order (count None: not a sequence)
        self.expected: dict[tuple[DomainId, Path], list[tuple[int, int | None]]] = {}

    def bad(self, seq: int, obj: str, message: str) -> None:
        self.found.append((seq, obj, message))

    def count(self, seq: int, group: str, key: str) -> None:
        self.counted.append((seq, group, key))

    def check(self) -> None:
        """Run every check; violations go to the report in the order of their facts."""
        view = self.view
        for grain in view.grains.values():
            self._grain(grain)
        for seq, barrier in view.barriers:
            self.count(seq, "barriers", barrier.call)
        self._expansions()
        for index, admits in view.admitted.items():
            for seq, _ in admits[1:]:
                self.bad(seq, f"source {index}", "admitted twice")
        for index, emits in view.emitted.items():
            admits = view.admitted.get(index, [])
            for i, (seq, emitted) in enumerate(emits):
                if i:
                    self.bad(seq, f"source {index}", "output emitted twice")
                if first_before(admits, seq) is None:
                    self.bad(seq, f"source {index}", "output emitted but never admitted")
                self.count(seq, "outputs", emitted.outcome)
        self.found.sort(key=lambda f: f[0])  # stable: one fact's findings keep their order
        self._finish()
        counts = self.report.counts
        if view.tags:
            counts.setdefault("facts", Counter()).update(view.tags)
        for _, group, key in sorted(self.counted, key=lambda c: c[0]):  # in fact order
            counts.setdefault(group, Counter())[key] += 1
        shard = view.shard
        self.report.violations += [Violation(shard, seq, obj, msg) for seq, obj, msg in self.found]

    def _grain(self, grain: GrainView) -> None:
        """Replay the Grain's own facts (only they change its phase)."""
        name = format_grain(grain.key)
        phase, generation = GrainPhase.WAITING, 0
        sealed: int | None = None
        for seq, fact in grain.history():
            if isinstance(fact, GrainDispatched | GrainRetried):
                what = "dispatched" if isinstance(fact, GrainDispatched) else "retried"
                if sealed is not None:
                    self.bad(seq, name, f"{what} after it was sealed at fact #{sealed}")
                phase = GrainPhase.IN_FLIGHT if what == "dispatched" else GrainPhase.READY
                generation = fact.generation
                self.count(seq, "grains", what)
                if what == "dispatched":
                    self._check_ordinal_range(seq, grain)
                    for _, child_call, _, child_domain in self.shape.reducers.get(grain.call, ()):
                        self._check_reduce_ready(seq, grain, child_call, child_domain)
                continue
            if isinstance(fact, GrainCommitted):
                if phase is GrainPhase.IN_FLIGHT and generation != fact.generation:
                    self.bad(seq, name, f"accepted a stale report (generation "
                                        f"{fact.generation}, in flight as {generation})")
                elif phase not in (GrainPhase.IN_FLIGHT, GrainPhase.SEALED):
                    self.bad(seq, name, f"committed while {phase.label}, not in flight")
                self._check_ordinal_range(seq, grain)
                parent = grain.path[:-1]
                if parent and self.view.barrier_before(grain.call, parent, seq):
                    self.bad(seq, name, "committed after a GroupFailure barrier covered it")
                what, key = "committed", fact.outcome
                if fact.outcome == REPORT_PRESENT:
                    self._expect_children(seq, grain, fact.outputs)
            elif isinstance(fact, GrainReused):
                if phase is not GrainPhase.WAITING:
                    self.bad(seq, name, f"reused while {phase.label}: only a Grain never "
                                        "dispatched can be reused")
                what, key = "reused", "reused"
                self._expect_children(seq, grain, fact.outputs)
            else:
                what, key = "failed", "failed"
            if sealed is not None:
                self.bad(seq, name, f"sealed twice ({what}; first at fact #{sealed})")
            else:
                sealed = seq
            phase = GrainPhase.SEALED
            self.count(seq, "grains", key)

    def _expect_children(self, seq: int, grain: GrainView, outputs: Any) -> None:
        """A Present seal of an expanded Call: its value says how many children follow."""
        for domain, index in self.shape.expand_feeders.get(grain.call, ()):
            value = None if outputs is None else outputs[index]
            count = len(value) if isinstance(value, list | tuple) else None
            self.expected.setdefault((domain, grain.path), []).append((seq, count))

    def _expansions(self) -> None:
        for (domain, parent), closes in self.view.expansions.items():
            name = f"expansion {domain} of {format_path(parent)}"
            for i, (seq, closed) in enumerate(closes):
                self.count(seq, "expansions", closed.outcome)
                if i:
                    self.bad(seq, name, "closed twice")
                    continue
                # the expanded value as last committed before the close
                counts = [n for at, n in self.expected.get((domain, parent), []) if at < seq]
                if counts and counts[-1] is not None and closed.outcome == EXPANSION_SUCCEEDED \
                        and counts[-1] != closed.count:
                    self.bad(seq, name, f"closed with {closed.count} children but the "
                                        f"expanded value has {counts[-1]} elements")

    def _check_ordinal_range(self, seq: int, grain: GrainView) -> None:
        path = grain.path
        if len(path) < 2:
            return
        # A parent may have several child Domains (one per expand): only the Call's own.
        closed = self.view.closed_before(self.shape.call_domain.get(grain.call, ""),
                                         path[:-1], seq)
        if closed is not None and closed.outcome == EXPANSION_SUCCEEDED \
                and not 0 <= path[-1] < closed.count:
            self.bad(seq, format_grain(grain.key),
                     f"ordinal {path[-1]} outside 0..{closed.count - 1} of its expansion")

    def _check_reduce_ready(self, seq: int, grain: GrainView, child_call: CallId,
                            domain: DomainId) -> None:
        name = format_grain(grain.key)
        closed = self.view.closed_before(domain, grain.path, seq)
        if closed is None:
            self.bad(seq, name, f"dispatched before its expansion {domain} closed")
            return
        for ordinal in range(closed.count if closed.outcome == EXPANSION_SUCCEEDED else 0):
            child = self.view.grains.get((child_call, (*grain.path, ordinal)))
            if child is None or not child.seen_before(seq):
                continue
            if first_before(child.reused, seq) is not None:
                continue  # sealed Present with an earlier run's outputs
            commit = first_before(child.committed, seq)
            if commit is None:
                self.bad(seq, name, f"reduce consumed before member {format_grain(child.key)} "
                                    "was terminal")
            elif commit.outcome != REPORT_PRESENT:
                self.bad(seq, name, f"dispatched although member {format_grain(child.key)} "
                                    "failed")

    def _finish(self) -> None:
        """What a completed shard must also have: every Expansion closed, every source
        delivered (reported at the last fact, or at the last unclosed Expansion's)."""
        view = self.view
        if not view.completed:
            return
        seq = view.last_seq
        for (domain, parent), commits in sorted(self.expected.items(), key=lambda e: e[1][0]):
            if (domain, parent) not in view.expansions:
                seq = commits[-1][0]
                self.bad(seq, f"expansion {domain} of {format_path(parent)}",
                         "never closed although the run completed")
        for index in sorted(set(view.admitted) - set(view.emitted)):
            self.bad(seq, f"source {index} was never delivered",
                     f"deliver it with `rayorch resume {self.report.run_id} --out-dir DIR`")


Outputs = tuple[Any, ...] | None  # a Present seal's output values


def _fold_through_kernel(plan: Plan, shard: int, facts: list[StoredFact], shape: PlanShape,
                         report: AuditReport, committed: dict[GrainKey, Outputs]) -> None:
    try:
        from rayorch.core.state import Kernel
    except ImportError:  # the kernel ships with rayorch; tolerate partial checkouts
        report.notes.append("kernel not available: fold checks skipped")
        return
    kernel = Kernel(plan)
    members: dict[tuple[CallId, Path], list[tuple[int, Outputs]]] = {}  # by (call, parent)
    for (call, path), outputs in committed.items():
        members.setdefault((call, path[:-1]), []).append((path[-1], outputs))
    seq = 0
    try:
        for stored in facts:
            seq, fact = stored.seq, stored.fact
            if isinstance(fact, GrainDispatched):
                _check_reduce_order(kernel, fact, shape, members, report, shard, seq)
            kernel.apply(fact)
        kernel.validate()
    except RayorchError as exc:
        report.violations.append(Violation(shard, seq, "kernel", str(exc)))


def _check_reduce_order(kernel: Any, fact: GrainDispatched, shape: PlanShape,
                        members: dict[tuple[CallId, Path], list[tuple[int, Outputs]]],
                        report: AuditReport, shard: int, seq: int) -> None:
    """The value a reduce hands its consumer is the members' values in ordinal order
    (``members``: each committed Grain's ordinal and outputs, by its Call and parent)."""
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
        ordered = sorted((ordinal, None if outputs is None else outputs[index])
                         for ordinal, outputs in members.get((child_call, fact.path), ()))
        expected = [v for _, v in ordered]
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
    report.places = [place.describe() for place in store.fact_places(run_id)]
    expected = _sources_per_shard(store, info)
    done = store.done_shards(run_id)
    views: dict[int, ShardView] = {}
    for shard in range(info.shards):
        facts, unresolved = _read_shard(store, run_id, shard, report)
        report.facts += len(facts)
        view = views[shard] = fold_shard(shard, ((s.seq, s.fact) for s in facts))
        ShardAudit(view, shape, report).check()
        report.counts.setdefault("sources", Counter())["admitted"] += len(view.admitted)
        report.counts["sources"]["completed shards"] += int(bool(view.completed))
        if unresolved:
            report.notes.append(f"shard {shard}: kernel fold skipped ({unresolved} committed "
                                "outputs cannot be read)")
        else:
            committed = {g.key: seal.outputs for g in view.grains.values()
                         if (seal := g.reuse or g.commit) is not None
                         and getattr(seal, "outcome", REPORT_PRESENT) == REPORT_PRESENT}
            _fold_through_kernel(plan, shard, facts, shape, report, committed)
    _check_every_shard_held(run_id, views, expected, done, report)
    report.violations += [Violation(*finding) for finding in check_reuse(store, views)]
    report.violations += [Violation(*finding) for finding in check_claims(store, run_id, views)]
    return report


def _sources_per_shard(store: LineageStore, info: RunInfo) -> dict[int, int] | None:
    """How many sources the run declares for each shard (None: it declares no count)."""
    total = declared_sources(store, info)
    if total is None:
        return None
    counts = Counter(info.shard_of(index) for index in range(total))
    return {shard: counts.get(shard, 0) for shard in range(info.shards)}


def audit_with_delivery(store: LineageStore, run_id: str, out_dir: str | None = None
                        ) -> AuditReport:
    """:func:`audit_run`, and the file sink evidence of every ``OutputEmitted``
    (``report.delivery``): what ``rayorch audit`` and the web view's audit show."""
    report = audit_run(store, run_id)
    report.delivery = delivery_problems(store, run_id, out_dir)
    return report


def delivery_problems(store: LineageStore, run_id: str, out_dir: str | None) -> list[str]:
    """File sink evidence of every ``OutputEmitted`` (docs/topics/FILE-SINKS.md)."""
    from rayorch.runtime.sink_audit import check_delivery
    from rayorch.store.records.manifest import ManifestError, RunManifest

    if out_dir is None:
        blob = store.load_manifest(run_id)
        if blob is not None:
            try:
                out_dir = RunManifest.decode(blob).out_dir
            except ManifestError as exc:
                return [f"the run's manifest cannot be read to find its output directory "
                        f"({exc}); pass --out-dir"]
        sink = store.run_info(run_id).sink  # recorded by the driver that wrote it
        out_dir = out_dir or (sink[0] if sink else None)
    views = store.read_view(run_id).shards  # outputs not needed
    complete = all(view.completed for view in views.values())
    emitted = [fact for view in views.values()
               for _, fact in sorted(e for emits in view.emitted.values() for e in emits)]
    held = {k: view.last_seq for k, view in views.items()}
    return check_delivery(out_dir, emitted, complete=complete, held=held)


def _check_every_shard_held(run_id: str, views: dict[int, ShardView],
                            expected: dict[int, int] | None, done: frozenset[int],
                            report: AuditReport) -> None:
    """Each shard the run declares must still hold its lineage: a shard marked done (or
    whose facts say it completed) holds every source the run declares for it, and no shard
    is empty while another one was driven (a lost Redis Cluster master, evicted keys)."""
    driven = [k for k, v in views.items() if v.facts]
    for shard, view in sorted(views.items()):
        want = None if expected is None else expected.get(shard, 0)
        where = f"run {run_id} shard {shard}"
        if not view.facts and (driven or shard in done) and want != 0:
            report.violations.append(Violation(shard, 0, where, (
                "its facts are missing: the store holds none for it"
                + (", yet it is marked done" if shard in done else
                   f", while shard {driven[0]} was driven")
                + " (keys evicted or deleted, or a lost Redis Cluster master); this run "
                "cannot be continued from the store")))
            continue
        if (shard in done or view.completed) and want is not None \
                and len(view.admitted) != want:
            report.violations.append(Violation(shard, view.last_seq, where, (
                f"it is {'marked done' if shard in done else 'completed'} but its facts admit "
                f"{len(view.admitted)} of the {want} sources the run declares for it: facts "
                "are missing")))
        elif shard in done and not view.completed:
            report.violations.append(Violation(shard, view.last_seq, where, (
                "it is marked done but its facts hold no RunCompleted: facts are missing")))


def _read_shard(store: LineageStore, run_id: str, shard: int, report: AuditReport
                ) -> tuple[list[StoredFact], int]:
    """The shard's facts with payloads loaded; a payload that does not resolve is a finding,
    and so is one freed before its source was delivered, or a delivered value freed."""
    facts: list[StoredFact] = []
    freed: list[StoredFact] = []
    unresolved = 0
    for stored in store.iter_facts(run_id, shard, payloads=False):
        fact = stored.fact
        if isinstance(fact, GrainCommitted | GrainReused) and fact.payload_ref is not None \
                and fact.outputs is None:
            try:
                stored = stored._replace(fact=store.resolve_payload(fact))
            except PayloadError as exc:
                unresolved += 1
                report.violations.append(Violation(
                    shard, stored.seq, f"run {run_id} {format_grain((fact.call, fact.path))}",
                    f"committed payload {fact.payload_ref!r} does not resolve ({exc.detail})"))
            else:
                if is_freed(stored.fact):
                    freed.append(stored)
        elif isinstance(fact, GrainCommitted) and is_freed(fact):
            freed.append(stored)  # a memory store's value, freed in place
        facts.append(stored)
    if freed:
        delivered = {s.fact.index for s in facts if isinstance(s.fact, OutputEmitted)}
        info = store.run_info(run_id)
        kept = kept_calls(info.keep, info.plan)
        report.counts.setdefault("payloads", Counter())["freed"] += len(freed)
        for stored in freed:
            fact = stored.fact
            assert isinstance(fact, GrainCommitted | GrainReused)
            why = ("the run keeps every value (keep=all)" if kept is None else
                   None if fact.call not in kept else
                   "its value is delivered, so it is kept" if info.keep == "outputs" else
                   "its module keeps its values (keep_values)")
            if why is None and fact.path[0] not in delivered:
                why = f"source {fact.path[0]} is not delivered, so it may still be needed"
            if why is not None:
                unresolved += 1
                what = (f"committed payload {fact.payload_ref!r} does not resolve" if
                        fact.payload_ref is not None else "its committed value is gone")
                report.violations.append(Violation(
                    shard, stored.seq, f"run {run_id} {format_grain((fact.call, fact.path))}",
                    f"{what}: it was freed, but {why}"))
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
