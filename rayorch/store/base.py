"""The lineage store interface: runs, shard leases, fenced driver appends, commits, reads.

A run's facts are split into shards (``shard_of``): a root Entity and all its
descendants live in one shard, so a commit or barrier check never crosses shards.
Each shard has one total order of facts, numbered by a per-shard sequence number
starting at 1; a reader's cursor is the last sequence number it has seen.

Example::

    store = open_store("memory://")
    store.open_run("run-1", plan, shards=2, micro_batch=8)
    epoch = store.acquire_lease("run-1", 0, "driver-a", ttl_s=10)
    store.append("run-1", 0, epoch, [SourceAdmitted(0, ("a.pdf",))], driver="driver-a")
    store.read("run-1", 0, after=0)        # [StoredFact(seq=1, domain="root", fact=...)]
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from rayorch.core.commit import CommitVerdict, GrainPhase
from rayorch.core.errors import MissingExtraError
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
from rayorch.core.ids import ROOT, CallId, DomainId, Path, domain_depth, format_grain
from rayorch.core.plan import Plan
from rayorch.store.errors import (
    FactNotAllowedError,
    InvalidRunIdError,
    RunMismatchError,
    RunShapeError,
    StoreURLError,
    UnknownRunPartError,
)
from rayorch.store.keys import barrier_member, grain_field, valid_run_id

DEFAULT_READ_LIMIT = 10_000
REPORT_OUTCOMES = frozenset({REPORT_PRESENT, REPORT_RECORD_FAILURE, REPORT_GROUP_FAILURE})

# How a driver fact changes the Grain table (same codes as append-fenced-6.lua).
KIND_OTHER, KIND_DISPATCHED, KIND_RETRIED, KIND_FAILED = 0, 1, 2, 3


# Stores that several processes share (a run on them can be resumed, joined and audited).
SHARED_STORE_SCHEMES = ("redis://", "rediss://", "redis+cluster://", "rediss+cluster://")


def redact_url(url: str) -> str:
    """The URL without its password (for messages and logs); also with several hosts."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    if not at or not colon:
        return url
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hosts}"))


def with_quick_retries(url: str, retries: int = 3) -> str:
    """A Redis URL whose client gives up reconnecting after ``retries`` attempts.

    A driver's store outage then surfaces within about a second, is reported once, and
    the driver backs off and rebuilds from the store (docs/ARCHITECTURE.md, "Store outages").
    """
    if not url.lower().startswith(SHARED_STORE_SCHEMES) or "retries=" in url:
        return url
    return f"{url}{'&' if '?' in url else '?'}retries={retries}"


def shard_of(index: int, micro_batch: int, shards: int) -> int:
    """The shard of source item ``index``: ``(index // micro_batch) % shards``."""
    return (index // micro_batch) % shards


class StoredFact(NamedTuple):
    """One fact as read back: its place in the shard's total order and its Domain stream."""

    seq: int
    domain: DomainId
    fact: Fact


class LeaseHolder(NamedTuple):
    driver: str
    epoch: int


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

    def shard_of(self, index: int) -> int:
        return shard_of(index, self.micro_batch, self.shards)

    @property
    def domains(self) -> tuple[DomainId, ...]:
        return tuple(d[0] for d in self.plan["domains"])


class RunLayout:
    """Where each fact of a run goes: its shard and its Domain stream."""

    def __init__(self, info: RunInfo) -> None:
        self.info = info
        self.domains: tuple[DomainId, ...] = info.domains or (ROOT,)
        self.call_domain: dict[CallId, DomainId] = {
            n["call"]["id"]: n["domain"] for n in info.plan["nodes"] if n.get("call")
        }

    def _call(self, call: CallId) -> DomainId:
        try:
            return self.call_domain[call]
        except KeyError:
            raise UnknownRunPartError(
                self.info.run_id, f"Call {call!r} is not in the run's plan"
            ) from None

    def domain_of(self, fact: Fact) -> DomainId:
        """The Domain stream a fact is written to."""
        if isinstance(fact, GrainDispatched | GrainCommitted | GrainRetried | GrainFailed):
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
        if isinstance(fact, GrainDispatched | GrainCommitted | GrainRetried | GrainFailed):
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


class PreparedDriverFact(NamedTuple):
    """A driver fact with what the append check needs (kind, Grain field, generation)."""

    kind: int
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
        if isinstance(fact, GrainDispatched):
            out.append(PreparedDriverFact(KIND_DISPATCHED, grain_field(fact.call, fact.path),
                                          fact.generation, domain, fact))
        elif isinstance(fact, GrainRetried):
            out.append(PreparedDriverFact(KIND_RETRIED, grain_field(fact.call, fact.path),
                                          fact.generation, domain, fact))
        elif isinstance(fact, GrainFailed):
            out.append(PreparedDriverFact(KIND_FAILED, grain_field(fact.call, fact.path),
                                          fact.generation, domain, fact))
        else:
            out.append(PreparedDriverFact(KIND_OTHER, "", 0, domain, fact))
    return out


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


class LineageStore(ABC):
    """Append-only lineage facts of runs, with fenced driver writes and a commit gate.

    Implementations: :class:`~rayorch.store.memory.MemoryStore` (``memory://``) and
    :class:`~rayorch.store.redis_store.RedisStore` (``redis://``, ``rediss://``).
    Stores pickle as their URL, so a Ray actor re-opens the same store.
    """

    url: str

    # -- runs --------------------------------------------------------------------
    def open_run(
        self,
        run_id: str,
        plan: Plan | Mapping[str, Any],
        *,
        shards: int = 1,
        micro_batch: int = 1,
        config: Mapping[str, Any] | None = None,
    ) -> RunInfo:
        """Create the run, or reopen it if it exists with the same plan fingerprint and shards.

        Raises :class:`RunMismatchError` when the fingerprint, shards or micro-batch differ.
        """
        check_run_id(run_id)
        desc, fingerprint = plan_description(plan)
        if shards < 1 or micro_batch < 1:
            raise RunShapeError(shards, micro_batch)
        return self._open_run(run_id, desc, fingerprint, shards, micro_batch, dict(config or {}))

    @abstractmethod
    def _open_run(self, run_id: str, desc: dict[str, Any], fingerprint: str, shards: int,
                  micro_batch: int, config: dict[str, Any]) -> RunInfo:
        """Store-specific part of :meth:`open_run` (arguments already checked)."""

    def check(self) -> None:  # noqa: B027 - optional hook
        """Raise a ``StoreError`` unless the store is reachable and takes writes.

        Called before anything else of a run starts (Ray, actors), so a wrong URL fails
        at once with its cause. An in-process store is always usable.
        """

    @abstractmethod
    def run_info(self, run_id: str) -> RunInfo:
        """The stored run; raises :class:`RunNotFoundError`."""

    @abstractmethod
    def list_runs(self) -> list[RunInfo]:
        """All runs, oldest first."""

    @abstractmethod
    def delete_run(self, run_id: str) -> None:
        """Remove a run and all its facts (no-op when absent)."""

    # -- leases ------------------------------------------------------------------
    @abstractmethod
    def acquire_lease(self, run_id: str, shard: int, driver: str, ttl_s: float, *,
                      after_epoch: int | None = None) -> int:
        """Take the shard's lease; returns the epoch (fencing token).

        A new holder gets an epoch above every epoch the shard has handed out and a
        ``LeaseAcquired`` fact is appended; the current holder re-acquiring keeps its
        epoch (and renews). Raises :class:`LeaseHeldError` while another driver holds it.

        With ``after_epoch`` (the caller's own last epoch of this shard), the caller takes
        the lease back only if nobody held the shard since: otherwise it raises
        :class:`FencedError` ("lease lost: ... continued by driver X (epoch N)") or
        :class:`LeaseRolledBackError` (the store forgot that epoch), never LeaseHeldError.
        """

    @abstractmethod
    def renew_lease(self, run_id: str, shard: int, driver: str, epoch: int, ttl_s: float) -> None:
        """Extend the lease; raises :class:`LeaseLostError` (expired, nobody took it since) or
        :class:`FencedError` / :class:`LeaseRolledBackError` (deposed: stop)."""

    @abstractmethod
    def release_lease(self, run_id: str, shard: int, driver: str, epoch: int) -> None:
        """Give the lease up (no-op when not held by ``driver`` with this epoch)."""

    @abstractmethod
    def lease_holder(self, run_id: str, shard: int) -> LeaseHolder | None:
        """The current holder, or None when the lease is free."""

    # -- facts -------------------------------------------------------------------
    @abstractmethod
    def append(self, run_id: str, shard: int, epoch: int, facts: Sequence[Fact], *,
               driver: str) -> list[int]:
        """Append driver facts atomically if ``driver`` holds the shard's lease with ``epoch``.

        Returns their sequence numbers. Checks every fact first and writes nothing on
        error: :class:`LeaseLostError`/:class:`FencedError`/:class:`LeaseRolledBackError`
        when the caller is not the live holder (the Redis store also checks the token of
        the acquisition this client made), :class:`GrainSealedError` for a
        dispatch/retry/failure of a sealed Grain.
        """

    @abstractmethod
    def commit(self, run_id: str, reports: Sequence[GrainCommitted], *,
               token: str | None = None) -> list[CommitVerdict]:
        """Apply the commit gate to worker reports (any shards); one verdict per report.

        Accepted reports seal their Grain and are appended; a ``group_failure`` of a
        child Grain also installs its barrier and appends ``BarrierInstalled``.
        ``token`` (optional, unique per batch of reports): a call repeated with the same
        token and reports after a lost reply answers as the first call did (ACCEPTED
        for what it committed) instead of SEALED.
        """

    @abstractmethod
    def read(
        self,
        run_id: str,
        shard: int,
        after: int = 0,
        *,
        limit: int = DEFAULT_READ_LIMIT,
        block_s: float | None = None,
        domain: DomainId | None = None,
        payloads: bool = True,
    ) -> list[StoredFact]:
        """Facts of the shard with ``seq > after``, in order (only ``domain``'s if given).

        With ``block_s``, waits up to that long for at least one fact. With
        ``payloads`` (default), large outputs stored as payload files are loaded back.
        """

    @abstractmethod
    def grain_phase(self, run_id: str, shard: int, call: CallId, path: Path
                    ) -> tuple[GrainPhase, int] | None:
        """The commit gate's view of a Grain: ``(phase, generation)``, None if unknown."""

    @abstractmethod
    def barriers(self, run_id: str, shard: int) -> frozenset[tuple[CallId, Path]]:
        """The installed GroupFailure barriers ``(call, parent)`` of a shard."""

    # -- driver replicas -----------------------------------------------------------
    @abstractmethod
    def save_manifest(self, run_id: str, manifest: bytes) -> bytes:
        """Keep what a driver needs to run the run without its creator (first write wins).

        Returns the stored manifest (the existing one when the run already had one).
        """

    @abstractmethod
    def load_manifest(self, run_id: str) -> bytes | None:
        """The run's manifest, or None when the run was started by a lone ``run()``."""

    @abstractmethod
    def heartbeat(self, run_id: str, driver: str, ttl_s: float) -> None:
        """Register ``driver`` as alive on the run for ``ttl_s`` seconds (``0``: it left)."""

    @abstractmethod
    def live_drivers(self, run_id: str) -> list[str]:
        """The drivers whose last heartbeat has not expired, sorted."""

    def driver_registry(self, run_id: str) -> tuple[float, dict[str, float]]:
        """``(now, {driver: heartbeat deadline})`` in the store's clock, expired entries too.

        Shared pool actors read it to tell "no driver yet" from "every driver died"
        (:mod:`rayorch.actors.orphan_watch`).
        """
        raise NotImplementedError(f"{type(self).__name__} keeps no driver registry")

    @abstractmethod
    def mark_shard_done(self, run_id: str, shard: int) -> None:
        """Record that every source of ``shard`` is complete and emitted (idempotent)."""

    @abstractmethod
    def done_shards(self, run_id: str) -> frozenset[int]:
        """The shards marked done."""

    def resolve_payload(self, fact: GrainCommitted) -> GrainCommitted:
        """The fact with outputs stored in a payload file loaded back.

        Raises :class:`~rayorch.store.errors.PayloadError` when the file is missing or
        corrupt. Stores without payload files return the fact as it is.
        """
        return fact

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections (the store can still be re-opened from its URL)."""

    # -- conveniences --------------------------------------------------------------
    def iter_facts(
        self, run_id: str, shard: int, after: int = 0, *, domain: DomainId | None = None,
        payloads: bool = True,
    ) -> Iterator[StoredFact]:
        """Every fact of the shard after ``after``, in order (no blocking)."""
        cursor = after
        while True:
            batch = self.read(run_id, shard, cursor, domain=domain, payloads=payloads)
            if not batch:
                return
            yield from batch
            cursor = batch[-1].seq

    def read_run(self, run_id: str, *, payloads: bool = True) -> dict[int, list[StoredFact]]:
        """All facts of a run, per shard."""
        info = self.run_info(run_id)
        return {k: list(self.iter_facts(run_id, k, payloads=payloads))
                for k in range(info.shards)}

    def __enter__(self) -> LineageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


def open_store(url: str = "memory://") -> LineageStore:
    """Open a lineage store by URL: ``memory://[name]``, ``redis://...``, ``rediss://...``,
    or a Redis Cluster: ``redis+cluster://host:port[,host:port...]`` (``rediss+cluster://``).

    ``redis://user:password@host:6379/0?payload_dir=/data/payloads&payload_threshold=65536``
    """
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "memory":
        from rayorch.store.memory import MemoryStore

        return MemoryStore.open(url)
    if scheme in ("redis", "rediss", "redis+cluster", "rediss+cluster"):
        try:
            import redis  # noqa: F401 - the optional client: a clear error when missing
        except ModuleNotFoundError as exc:
            raise MissingExtraError(f"a {scheme}:// lineage store", "the redis client",
                                    "redis") from exc
    if scheme in ("redis", "rediss"):
        from rayorch.store.redis_store import RedisStore

        return RedisStore(url)
    if scheme in ("redis+cluster", "rediss+cluster"):
        from rayorch.store.redis_cluster import RedisClusterStore

        return RedisClusterStore(url)
    raise StoreURLError(url, f"unknown scheme {scheme or '(none)'!r}")
