"""One view of a stored run: the one fold of a shard's facts that the readers share.

:func:`fold_shard` reads a shard's facts once, in their order, and files each under the
object it is about: a Grain's dispatches, retries, failure and commits; the barriers; the
Expansions; the sources admitted and the outputs delivered; the lease acquisitions. Every
entry keeps the fact's sequence number, so a reader can ask what had happened *before* a
given fact (the audit's ordering checks, the barrier effects) without folding again.
The audit, ``rayorch status``, ``rayorch show``, the timeline, the barrier effects and a
driver's rebuild of a shard all read this view.

Pure: no store, no clock. Example::

    view = fold_shard(0, ((s.seq, s.fact) for s in store.iter_facts(run_id, 0)))
    view.grains[("ocr", (3, 1))].in_flight      # the generation in flight, or None
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
from rayorch.core.ids import CallId, DomainId, GrainKey, Path
from rayorch.core.vocabulary import FAILOVER_CAUSE, REPORT_PRESENT

F = TypeVar("F", bound=Fact)
Seq = int  # a fact's place in its shard's total order
Entry = tuple[Seq, F]  # (seq, fact)


def first_before(entries: list[tuple[Seq, F]], seq: Seq) -> F | None:
    """The first fact of ``entries`` written before ``seq`` (entries are in seq order)."""
    if entries and entries[0][0] < seq:
        return entries[0][1]
    return None


@dataclass(slots=True)
class GrainView:
    """Every fact about one Grain, by kind, each with its seq (in seq order)."""

    call: CallId
    path: Path
    dispatched: list[tuple[Seq, GrainDispatched]] = field(default_factory=list)
    retried: list[tuple[Seq, GrainRetried]] = field(default_factory=list)
    failed: list[tuple[Seq, GrainFailed]] = field(default_factory=list)
    committed: list[tuple[Seq, GrainCommitted]] = field(default_factory=list)
    reused: list[tuple[Seq, GrainReused]] = field(default_factory=list)
    last: Seq = 0  # the seq of its latest fact
    last_dispatch: Seq = 0  # the seq of its latest dispatch (0: never dispatched)

    @property
    def key(self) -> GrainKey:
        return (self.call, self.path)

    @property
    def commit(self) -> GrainCommitted | None:
        """The first accepted report (the one that sealed it), if any."""
        return self.committed[0][1] if self.committed else None

    @property
    def reuse(self) -> GrainReused | None:
        """The ``GrainReused`` that sealed it with an earlier run's outputs, if any."""
        return self.reused[0][1] if self.reused else None

    @property
    def reusable(self) -> tuple[str, GrainCommitted | GrainReused] | None:
        """``(reuse key, sealing fact)`` when a later run may reuse it: sealed Present by a
        commit whose dispatch recorded a reuse key, or sealed by a ``GrainReused``."""
        if self.reused:
            fact = self.reused[0][1]
            return fact.reuse_key, fact
        commit = self.commit
        if commit is None or commit.outcome != REPORT_PRESENT:
            return None
        key = next((d.reuse_key for _, d in reversed(self.dispatched)
                    if d.generation == commit.generation), "")
        return (key, commit) if key else None

    @property
    def first_dispatch(self) -> Seq | None:
        return self.dispatched[0][0] if self.dispatched else None

    @property
    def sealed_at(self) -> Seq | None:
        """The seq of its first commit or failure (None: not sealed)."""
        seals = [e[0] for e in (*self.committed[:1], *self.failed[:1], *self.reused[:1])]
        return min(seals) if seals else None

    @property
    def in_flight(self) -> int | None:
        """The generation of its last dispatch when nothing came after it (else None)."""
        if self.dispatched and self.last == self.last_dispatch:
            return self.dispatched[-1][1].generation
        return None

    @property
    def attempt_open(self) -> bool:
        """Dispatched, and neither committed nor failed since its last dispatch."""
        if not self.dispatched:
            return False
        ends = [e[0] for e in self.committed[-1:]] + [e[0] for e in self.failed[-1:]]
        return self.last_dispatch > max(ends, default=0)

    def seen_before(self, seq: Seq) -> bool:
        """Whether any of its facts was written before ``seq``."""
        return any(lst and lst[0][0] < seq
                   for lst in (self.dispatched, self.retried, self.failed, self.committed,
                               self.reused))

    def history(self) -> list[tuple[Seq, Fact]]:
        """All its facts in seq order."""
        merged: list[tuple[Seq, Fact]] = [*self.dispatched, *self.retried, *self.failed,
                                          *self.committed, *self.reused]
        return sorted(merged, key=lambda e: e[0])


@dataclass(slots=True)
class CallTally:
    """One Call's counts in a shard, kept as its facts are filed (no pass over the Grains).

    ``counts``: ``dispatched``, ``retried``, ``failed``, ``reused`` and one key per commit
    outcome (``present``, ``record_failure``, ``group_failure``), each fact once.
    ``first_ts``/``last_ts``: its first dispatch or reuse and its latest seal or failure
    (writer times > 0); ``busy_s`` sums the attempts' dispatch-to-commit seconds, and
    ``batch_busy_s`` the batches' (each once);
    ``commit_ts``/``reused_ts``: the writer time of each commit and reuse (the timeline's
    throughput bins, a live chart); ``dispatch_span``: the earliest and latest dispatch time.
    """

    counts: Counter[str] = field(default_factory=Counter)
    first_ts: float | None = None
    last_ts: float | None = None
    busy_s: float = 0.0
    commit_ts: list[float] = field(default_factory=list)
    reused_ts: list[float] = field(default_factory=list)
    dispatch_span: tuple[float, float] | None = None
    failovers: int = 0  # retries a driver's take-over wrote (``FAILOVER_CAUSE``)
    batch_busy_s: float = 0.0  # ``busy_s`` counted once per batch (same dispatch, same commit)
    last_batch: tuple[float, float] | None = None  # the latest commit's (dispatch, commit) time

    def started(self, ts: float) -> None:
        if ts > 0 and (self.first_ts is None or ts < self.first_ts):
            self.first_ts = ts

    def ended(self, ts: float) -> None:
        if ts > 0 and (self.last_ts is None or ts > self.last_ts):
            self.last_ts = ts


@dataclass
class ShardView:
    """One shard's facts, filed by the object each is about."""

    shard: int
    facts: int = 0
    last_seq: Seq = 0
    tags: Counter[str] = field(default_factory=Counter)  # facts per fact type
    grains: dict[GrainKey, GrainView] = field(default_factory=dict)  # in first-fact order
    barriers: list[tuple[Seq, BarrierInstalled]] = field(default_factory=list)
    expansions: dict[tuple[DomainId, Path], list[tuple[Seq, ExpansionClosed]]] = field(
        default_factory=dict)
    admitted: dict[int, list[tuple[Seq, SourceAdmitted]]] = field(default_factory=dict)
    emitted: dict[int, list[tuple[Seq, OutputEmitted]]] = field(default_factory=dict)
    leases: list[tuple[Seq, LeaseAcquired]] = field(default_factory=list)
    completed: list[tuple[Seq, RunCompleted]] = field(default_factory=list)
    first_ts: float | None = None  # the earliest and latest writer timestamps (ts > 0)
    last_ts: float | None = None
    calls: dict[CallId, CallTally] = field(default_factory=dict)
    domains: dict[DomainId, Counter[str]] = field(default_factory=dict)
    """Per child Domain: Expansions closed by outcome, and ``children`` (of succeeded ones)."""
    failures: list[GrainKey] = field(default_factory=list)
    """Grains sealed by a failure (``GrainFailed``, a RecordFailure or GroupFailure commit)."""
    by_source: dict[int, list[GrainKey]] = field(default_factory=dict)
    """Each source's Grains (its own and its descendants'), in first-fact order."""
    expansions_of: dict[int, list[tuple[DomainId, Path]]] = field(default_factory=dict)
    """Each source's Expansions (``expansions`` keys), in first-close order."""
    admissions: int = 0  # SourceAdmitted facts (a source admitted twice counts twice)
    open: dict[GrainKey, None] = field(default_factory=dict)
    """Grains with an attempt open (``GrainView.attempt_open``), in dispatch order."""
    physical: list[tuple[Seq, GrainRetried | GrainFailed]] = field(default_factory=list)
    """Every ``GrainRetried`` and ``GrainFailed``, in seq order."""
    outputs: Counter[str] = field(default_factory=Counter)  # OutputEmitted facts by outcome

    def grain(self, call: CallId, path: Path) -> GrainView:
        key = (call, path)
        view = self.grains.get(key)
        if view is None:
            view = self.grains[key] = GrainView(call, path)
            self.by_source.setdefault(path[0], []).append(key)
        return view

    def tally(self, call: CallId) -> CallTally:
        tally = self.calls.get(call)
        if tally is None:
            tally = self.calls[call] = CallTally()
        return tally

    def closed_before(self, domain: DomainId, parent: Path, seq: Seq) -> ExpansionClosed | None:
        """The Expansion's first close written before ``seq``."""
        return first_before(self.expansions.get((domain, parent), []), seq)

    def barrier_before(self, call: CallId, parent: Path, seq: Seq) -> bool:
        return any(s < seq and b.call == call and b.parent == parent for s, b in self.barriers)

    def extend(self, facts: Iterable[tuple[Seq, Fact]]) -> ShardView:
        """File more ``(seq, fact)`` pairs, each after every fact already filed.

        A live reader (``rayorch ui``) reads only the facts after :attr:`last_seq` and
        files them here, instead of folding the shard again: ``fold_shard(k, a + b)`` and
        ``fold_shard(k, a).extend(b)`` are equal views (``tests/unit/test_run_view.py``).
        """
        tags = self.tags
        first, last = self.first_ts, self.last_ts
        for seq, fact in facts:
            self.facts += 1
            self.last_seq = seq
            tags[fact.tag] += 1
            ts = fact.ts
            if ts > 0:
                if first is None or ts < first:
                    first = ts
                if last is None or ts > last:
                    last = ts
            _FILE[type(fact)](self, seq, fact)
        self.first_ts, self.last_ts = first, last
        return self


def _on_dispatched(view: ShardView, seq: Seq, fact: GrainDispatched) -> None:
    grain = view.grain(fact.call, fact.path)
    grain.dispatched.append((seq, fact))
    grain.last = grain.last_dispatch = seq
    view.open[grain.key] = None
    tally = view.tally(fact.call)
    tally.counts["dispatched"] += 1
    tally.started(fact.ts)
    span = tally.dispatch_span
    ts = fact.ts
    tally.dispatch_span = (ts, ts) if span is None else (min(span[0], ts), max(span[1], ts))


def _on_retried(view: ShardView, seq: Seq, fact: GrainRetried) -> None:
    grain = view.grain(fact.call, fact.path)
    grain.retried.append((seq, fact))
    grain.last = seq
    view.physical.append((seq, fact))
    tally = view.tally(fact.call)
    tally.counts["retried"] += 1
    tally.failovers += fact.cause == FAILOVER_CAUSE


def _on_failed(view: ShardView, seq: Seq, fact: GrainFailed) -> None:
    grain = view.grain(fact.call, fact.path)
    grain.failed.append((seq, fact))
    grain.last = seq
    view.open.pop(grain.key, None)
    view.physical.append((seq, fact))
    view.failures.append(grain.key)
    tally = view.tally(fact.call)
    tally.counts["failed"] += 1
    tally.ended(fact.ts)


def _on_committed(view: ShardView, seq: Seq, fact: GrainCommitted) -> None:
    grain = view.grain(fact.call, fact.path)
    grain.committed.append((seq, fact))
    grain.last = seq
    view.open.pop(grain.key, None)
    tally = view.tally(fact.call)
    tally.counts[fact.outcome] += 1
    tally.commit_ts.append(fact.ts)
    tally.ended(fact.ts)
    for _, sent in reversed(grain.dispatched):
        if sent.generation == fact.generation:
            if sent.ts > 0 and fact.ts >= sent.ts:
                tally.busy_s += fact.ts - sent.ts
                # A batch's dispatches share one time, and so do its reports.
                if tally.last_batch != (sent.ts, fact.ts):
                    tally.last_batch = (sent.ts, fact.ts)
                    tally.batch_busy_s += fact.ts - sent.ts
            break
    if fact.outcome != REPORT_PRESENT:
        view.failures.append(grain.key)


def _on_reused(view: ShardView, seq: Seq, fact: GrainReused) -> None:
    grain = view.grain(fact.call, fact.path)
    grain.reused.append((seq, fact))
    grain.last = seq
    tally = view.tally(fact.call)
    tally.counts["reused"] += 1
    tally.reused_ts.append(fact.ts)
    tally.started(fact.ts)
    tally.ended(fact.ts)


def _on_barrier(view: ShardView, seq: Seq, fact: BarrierInstalled) -> None:
    view.barriers.append((seq, fact))


def _on_expansion(view: ShardView, seq: Seq, fact: ExpansionClosed) -> None:
    key = (fact.domain, fact.parent)
    closes = view.expansions.get(key)
    if closes is None:
        closes = view.expansions[key] = []
        view.expansions_of.setdefault(fact.parent[0], []).append(key)
    closes.append((seq, fact))
    counts = view.domains.get(fact.domain)
    if counts is None:
        counts = view.domains[fact.domain] = Counter(children=0)
    counts[fact.outcome] += 1
    counts["children"] += fact.count


def _on_admitted(view: ShardView, seq: Seq, fact: SourceAdmitted) -> None:
    view.admitted.setdefault(fact.index, []).append((seq, fact))
    view.admissions += 1


def _on_emitted(view: ShardView, seq: Seq, fact: OutputEmitted) -> None:
    view.emitted.setdefault(fact.index, []).append((seq, fact))
    view.outputs[fact.outcome] += 1


def _on_lease(view: ShardView, seq: Seq, fact: LeaseAcquired) -> None:
    view.leases.append((seq, fact))


def _on_completed(view: ShardView, seq: Seq, fact: RunCompleted) -> None:
    view.completed.append((seq, fact))


_FILE: dict[type[Fact], Callable[[ShardView, Seq, Any], None]] = {
    GrainDispatched: _on_dispatched,
    GrainRetried: _on_retried,
    GrainFailed: _on_failed,
    GrainCommitted: _on_committed,
    GrainReused: _on_reused,
    BarrierInstalled: _on_barrier,
    ExpansionClosed: _on_expansion,
    SourceAdmitted: _on_admitted,
    OutputEmitted: _on_emitted,
    LeaseAcquired: _on_lease,
    RunCompleted: _on_completed,
}


def fold_shard(shard: int, facts: Iterable[tuple[Seq, Fact]]) -> ShardView:
    """The view of one shard from its ``(seq, fact)`` pairs, in seq order."""
    view = ShardView(shard)
    view.extend(facts)
    return view


def numbered(facts: Iterable[Fact]) -> Iterable[tuple[Seq, Fact]]:
    """Facts without sequence numbers (one shard's, in order), numbered from 1."""
    return enumerate(facts, start=1)


@dataclass
class RunView:
    """A run's shards, each folded once (``rayorch.store.base.LineageStore.read_view``)."""

    run_id: str
    plan: dict[str, Any]  # the stored plan description
    shards: dict[int, ShardView]

    @property
    def call_domain(self) -> dict[CallId, DomainId]:
        return call_domains(self.plan)

    @property
    def call_order(self) -> list[CallId]:
        """The Call ids in plan order."""
        return list(call_domains(self.plan))

    @property
    def facts(self) -> int:
        return sum(view.facts for view in self.shards.values())

    def extend(self, facts: Mapping[int, Iterable[tuple[Seq, Fact]]]) -> RunView:
        """File each shard's newer ``(seq, fact)`` pairs (:meth:`ShardView.extend`)."""
        for shard, more in facts.items():
            view = self.shards.get(shard)
            if view is None:
                view = self.shards[shard] = ShardView(shard)
            view.extend(more)
        return self


def call_domains(plan: Mapping[str, Any]) -> dict[CallId, DomainId]:
    """``{call: its Domain}`` of a stored plan description, in plan order."""
    return {n["call"]["id"]: n["domain"] for n in plan.get("nodes", ()) if n.get("call")}


def is_complete(shards_finished: Sequence[bool], emitted: int, total: int | None) -> bool:
    """The one rule: a run is complete when it has shards, each marked done or holding its
    ``RunCompleted``, and (when it declares how many) every source's output is emitted."""
    return bool(shards_finished) and all(shards_finished) and (total is None or emitted == total)


def kept_value_calls(plan: Mapping[str, Any]) -> frozenset[CallId]:
    """The Calls of a stored plan description whose modules declare ``keep_values``."""
    keep = {m["name"] for m in plan.get("modules", ()) if m.get("options", {}).get("keep_values")}
    return frozenset(n["call"]["id"] for n in plan.get("nodes", ())
                     if n.get("call") and n["call"].get("module") in keep)


def delivered_calls(plan: Mapping[str, Any]) -> frozenset[CallId]:
    """The Calls of a stored plan description whose values a run keeps: those reaching an
    output through the structural primitives only (a reduce delivers its members'), and
    those of modules declared ``keep_values`` (a data-quality stage's verdicts)."""
    kept = kept_value_calls(plan)
    ports = {p[0]: p for p in plan.get("ports", ())}
    nodes = {n["id"]: n for n in plan.get("nodes", ())}
    found: set[CallId] = set()
    todo = [ports[p][3] for p in plan.get("outputs", ()) if p in ports]
    seen: set[int] = set()
    while todo:
        node = nodes.get(todo.pop())
        if node is None or node["id"] in seen:
            continue
        seen.add(node["id"])
        if node.get("call"):
            found.add(node["call"]["id"])
        else:
            todo.extend(ports[p][3] for p in node.get("inputs", ()) if p in ports)
    return frozenset(found | kept)


__all__ = ["CallTally", "GrainView", "RunView", "ShardView", "call_domains", "delivered_calls",
           "first_before", "is_complete", "fold_shard", "kept_value_calls", "numbered"]
