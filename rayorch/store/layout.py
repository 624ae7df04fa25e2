"""Where a run's facts go and what the store checks before writing them (no I/O).

A run's facts are split into shards (:func:`shard_of`): a root Entity and all its
descendants live in one shard, so a commit or barrier check never crosses shards.
:class:`RunLayout` places each fact in its shard and Domain stream; ``prepare_*``
check driver facts and worker reports against the run's plan and classify them for
the store's rules (:mod:`rayorch.store.gate`, and the Lua scripts of the Redis store).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

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
from rayorch.core.ids import ROOT, CallId, DomainId, domain_depth, format_grain
from rayorch.core.plan import Plan
from rayorch.core.run_view import call_domains, delivered_calls, kept_value_calls
from rayorch.core.vocabulary import (
    PHASE_AFTER,
    REPORT_GROUP_FAILURE,
    REPORT_OUTCOMES,
    FactKind,
    GrainPhase,
)
from rayorch.store.errors import (
    FactNotAllowedError,
    InvalidRunIdError,
    RunMismatchError,
    UnknownRunPartError,
)
from rayorch.store.keys import barrier_member, grain_field, valid_run_id

# How each driver fact changes the Grain table (the fenced append checks it), as plain ints.
_OTHER = int(FactKind.OTHER)
_KIND_OF: dict[type[Fact], int] = {
    GrainDispatched: int(FactKind.DISPATCHED),
    GrainRetried: int(FactKind.RETRIED),
    GrainFailed: int(FactKind.FAILED),
    GrainReused: int(FactKind.REUSED),
}


def shard_of(index: int, micro_batch: int, shards: int) -> int:
    """The shard of source item ``index``: ``(index // micro_batch) % shards``."""
    return (index // micro_batch) % shards




KEEP_MODES = ("outputs", "all", "none")
"""Which values of a source outlive its delivery, recorded with each run (``RunInfo.keep``,
first writer wins; runs recorded before it keep ``all``); ``keep=`` on a store URL
(docs/topics/PAYLOADS.md, "Freeing values"). Every mode keeps the values of modules declared
``keep_values`` (a data-quality stage's verdicts: why a document is gone is lineage), and:

* ``outputs``: the values of the Calls the run delivers (``delivered_calls``: a resume after
  a store rollback may deliver them again); the Redis store's default;
* ``all``: every value, for a run to be reused whole;
* ``none``: nothing more: the memory store's default (its values are the driver's heap, and
  a store in the driver's process cannot roll back, so nothing delivers them again).
"""


def kept_calls(keep: str, plan: Mapping[str, Any]) -> frozenset[CallId] | None:
    """The Calls whose values outlive their source's delivery under ``keep`` in a run of
    ``plan`` (a stored plan description); None: every Call's."""
    if keep == "all":
        return None
    return delivered_calls(plan) if keep == "outputs" else kept_value_calls(plan)


@dataclass(frozen=True)
class RunInfo:
    """What a store keeps about a run besides its facts."""

    run_id: str
    fingerprint: str
    plan: dict[str, Any] = field(repr=False)
    shards: int
    micro_batch: int
    config: dict[str, Any] = field(default_factory=dict)
    created_ts: float = 0.0
    sink: tuple[str, str] | None = None  # (directory, format) a driver recorded, if any
    keep: str = "all"  # which values outlive their source's delivery (KEEP_MODES)
    payloads: str = ""  # the payload root its values go to, recorded once ("": this store's)

    def shard_of(self, index: int) -> int:
        return shard_of(index, self.micro_batch, self.shards)

    @property
    def domains(self) -> tuple[DomainId, ...]:
        return tuple(d[0] for d in self.plan["domains"])


def encode_sink(out_dir: str, out_format: str) -> bytes:
    """How a backend keeps a recorded sink (``RunInfo.sink``): ``["dir", "format"]``."""
    return orjson.dumps([str(out_dir), str(out_format)])


def decode_sink(raw: bytes | str | None) -> tuple[str, str] | None:
    """A recorded ``[directory, format]``; None when absent or not of that shape."""
    try:
        value = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return None
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return value[0], value[1]
    return None


class RunLayout:
    """Where each fact of a run goes: its shard and its Domain stream."""

    def __init__(self, info: RunInfo) -> None:
        self.info = info
        self.domains: tuple[DomainId, ...] = info.domains or (ROOT,)
        self.call_domain: dict[CallId, DomainId] = call_domains(info.plan)

    def _call(self, call: CallId) -> DomainId:
        try:
            return self.call_domain[call]
        except KeyError:
            raise UnknownRunPartError(
                self.info.run_id, f"Call {call!r} is not in the run's plan"
            ) from None

    def domain_of(self, fact: Fact) -> DomainId:
        """The Domain stream a fact is written to."""
        if isinstance(fact, GrainDispatched | GrainCommitted | GrainRetried | GrainFailed
                      | GrainReused):
            domain = self._call(fact.call)
            if domain_depth(domain) != len(fact.path) - 1:
                raise UnknownRunPartError(
                    self.info.run_id,
                    f"{format_grain((fact.call, fact.path))}: path depth does not match "
                    f"the Call's Domain {domain!r}",
                )
            return domain
        if isinstance(fact, BarrierInstalled):
            return self._call(fact.call)
        if isinstance(fact, ExpansionClosed):
            if fact.domain not in self.domains:
                raise UnknownRunPartError(
                    self.info.run_id, f"Domain {fact.domain!r} is not in the run's plan"
                )
            return fact.domain
        return ROOT

    def shard_of_fact(self, fact: Fact) -> int | None:
        """The shard a fact belongs to (None: any shard, e.g. RunCompleted)."""
        index: int | None = None
        if isinstance(fact, GrainDispatched | GrainCommitted | GrainRetried | GrainFailed
                      | GrainReused):
            index = fact.path[0]
        elif isinstance(fact, SourceAdmitted | OutputEmitted):
            index = fact.index
        elif isinstance(fact, ExpansionClosed | BarrierInstalled):
            index = fact.parent[0]
        elif isinstance(fact, LeaseAcquired):
            return fact.shard
        elif isinstance(fact, RunCompleted):
            return None
        return None if index is None else self.info.shard_of(index)

    def check_shard(self, shard: int) -> None:
        if not 0 <= shard < self.info.shards:
            raise UnknownRunPartError(
                self.info.run_id, f"shard {shard} does not exist (the run has {self.info.shards})"
            )


@dataclass(frozen=True)
class AppendBasis:
    """What an appending driver's state of a shard is built on; the append checks the store
    still holds it (``LineageStore.append``), so a store that went back refuses facts
    computed from facts it forgot (:class:`~rayorch.store.errors.StoreRolledBackError`).

    A rollback loses a suffix of the shard's log. The driver's state rests on the facts it
    read when it rebuilt the shard (up to ``read_seq``), its own appends since (the latest
    one starting at ``appended_first``; each earlier fact it knows has a lower seq), and
    the commits it folded after that append (``sealed``: call, path, generation), whose
    seqs it does not know.
    """

    read_seq: int = 0
    appended_first: int = 0  # 0: no append since the rebuild
    sealed: tuple[tuple[CallId, tuple[int, ...], int], ...] = ()

    def sealed_fields(self) -> list[tuple[str, int]]:
        """``(grain field, generation)`` of each commit in ``sealed``."""
        return [(grain_field(call, path), gen) for call, path, gen in self.sealed]


class PreparedDriverFact(NamedTuple):
    """A driver fact with what the append check needs (kind, Grain field, generation)."""

    kind: int  # a FactKind value
    grain: str
    generation: int
    domain: DomainId
    fact: Fact


class PreparedReport(NamedTuple):
    """A worker report with what the commit rule needs (Grain field, barrier member)."""

    position: int
    grain: str
    generation: int
    barrier: str  # "" for a root Grain (no parent, no barrier)
    installs_barrier: bool
    domain: DomainId
    report: GrainCommitted


def prepare_driver_facts(
    layout: RunLayout, shard: int, facts: Sequence[Fact]
) -> list[PreparedDriverFact]:
    """Check driver facts belong to the shard and may be appended; classify them."""
    layout.check_shard(shard)
    out: list[PreparedDriverFact] = []
    for fact in facts:
        if isinstance(fact, GrainCommitted | BarrierInstalled):
            raise FactNotAllowedError(
                fact.tag, "commits and barriers are written only by commit() (the commit gate)"
            )
        if isinstance(fact, LeaseAcquired):
            raise FactNotAllowedError(fact.tag, "acquire_lease() writes it")
        fact_shard = layout.shard_of_fact(fact)
        if fact_shard is not None and fact_shard != shard:
            raise UnknownRunPartError(
                layout.info.run_id, f"{fact!r} belongs to shard {fact_shard}, not shard {shard}"
            )
        domain = layout.domain_of(fact)
        kind = _KIND_OF.get(type(fact))
        if kind is None:
            out.append(PreparedDriverFact(_OTHER, "", 0, domain, fact))
        else:
            grain: GrainDispatched = fact  # type: ignore[assignment] # or Retried/Failed: same fields
            out.append(PreparedDriverFact(kind, grain_field(grain.call, grain.path),
                                          grain.generation, domain, fact))
    return out


def grain_entry_after(fact: Fact) -> tuple[str, str] | None:
    """The Grain table entry ``(field, "phase:generation")`` a fact leaves behind (None: the
    fact changes no Grain): what the table holds after the fact, for a store catching up on
    facts it holds only in the archive (``lua/restore-archived-2.lua``)."""
    kind = _KIND_OF.get(type(fact))
    if kind is not None:
        phase = PHASE_AFTER[FactKind(kind)]
    elif isinstance(fact, GrainCommitted):
        phase = GrainPhase.SEALED
    else:
        return None
    grain: GrainDispatched = fact  # type: ignore[assignment] # every Grain fact has these
    return grain_field(grain.call, grain.path), f"{int(phase)}:{grain.generation}"


def prepare_reports(
    layout: RunLayout, reports: Sequence[GrainCommitted]
) -> dict[int, list[PreparedReport]]:
    """Group worker reports by shard, keeping each report's position in the call.

    On the commit hot path: the Call's Domain and depth are looked up once per Call,
    and a child's Grain field is its barrier member plus the ordinal (the same text
    :func:`~rayorch.store.keys.grain_field` builds).
    """
    by_shard: dict[int, list[PreparedReport]] = {}
    micro_batch, shards = layout.info.micro_batch, layout.info.shards
    call_depth: dict[CallId, tuple[DomainId, int]] = {}
    for position, report in enumerate(reports):
        if not isinstance(report, GrainCommitted):
            raise FactNotAllowedError(
                getattr(report, "tag", type(report).__name__),
                "commit() takes GrainCommitted reports only",
            )
        if report.outcome not in REPORT_OUTCOMES:
            raise FactNotAllowedError(
                report.tag,
                f"outcome {report.outcome!r} is not one of {sorted(REPORT_OUTCOMES)}",
            )
        call, path = report.call, report.path
        known = call_depth.get(call)
        if known is None:
            domain = layout._call(call)
            known = call_depth[call] = (domain, domain_depth(domain))
        domain, depth = known
        if len(path) != depth + 1:
            layout.domain_of(report)  # raises: the path does not fit the Call's Domain
        if depth:
            member = barrier_member(call, path[:-1])
            grain = f"{member}.{path[-1]}"
        else:
            member = ""
            grain = f"{call}|{path[0]}"
        shard = shard_of(path[0], micro_batch, shards)
        group = by_shard.get(shard)
        if group is None:
            group = by_shard[shard] = []
        group.append(
            PreparedReport(
                position,
                grain,
                report.generation,
                member,
                bool(member) and report.outcome == REPORT_GROUP_FAILURE,
                domain,
                report,
            )
        )
    return by_shard


def plan_description(plan: Plan | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """``(description, fingerprint)`` of a Plan or of a stored description."""
    if isinstance(plan, Plan):
        return plan.describe(), plan.fingerprint()
    desc = dict(plan)
    return desc, Plan.from_description(desc).fingerprint()


def check_run_id(run_id: str) -> None:
    if not valid_run_id(run_id):
        raise InvalidRunIdError(run_id)


def check_reopen(info: RunInfo, fingerprint: str, shards: int, micro_batch: int) -> None:
    """Raise :class:`RunMismatchError` unless a reopen matches the stored run."""
    if info.fingerprint != fingerprint:
        raise RunMismatchError(info.run_id, "plan fingerprint", info.fingerprint, fingerprint)
    if info.shards != shards:
        raise RunMismatchError(info.run_id, "shards =", str(info.shards), str(shards))
    if info.micro_batch != micro_batch:
        raise RunMismatchError(info.run_id, "micro_batch =", str(info.micro_batch),
                               str(micro_batch))
