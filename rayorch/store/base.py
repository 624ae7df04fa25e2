"""The lineage store as four small interfaces, and :class:`LineageStore`, a store with all four.

* :class:`FactLog`: each shard's facts in one total order — fenced driver appends, the
  commit gate for worker reports, reads.
* :class:`Leases`: who drives a shard (epoch = fencing token).
* :class:`RunRegistry`: runs and their manifests (create, reopen, list, delete).
* :class:`DriverRegistry`: which drivers are alive on a run and which shards are done.
* :class:`~rayorch.store.claims.ContentClaims`: dedup indexes (first claim of a content key
  wins), the shared state of dedup stages.

Each shard's facts are numbered by a per-shard sequence number starting at 1; a reader's
cursor is the last sequence number it has seen. Where each fact goes and what is checked
before it is written is :mod:`rayorch.store.layout`; the rules a backend applies (the
lease fence, the commit gate) are :mod:`rayorch.store.gate`; backends are found by URL
scheme in :mod:`rayorch.store.registry`.

Example::

    store = open_store("memory://")          # rayorch.store.open_store
    store.open_run("run-1", plan, shards=2, micro_batch=8)
    epoch = store.acquire_lease("run-1", 0, "driver-a", ttl_s=10)
    store.append("run-1", 0, epoch, [SourceAdmitted(0, ("a.pdf",))], driver="driver-a")
    store.read("run-1", 0, after=0)        # [StoredFact(seq=1, domain="root", fact=...)]
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from rayorch.core.facts import Fact, GrainCommitted
from rayorch.core.ids import CallId, DomainId, Path
from rayorch.core.plan import Plan
from rayorch.core.run_view import RunView, fold_shard
from rayorch.core.vocabulary import CommitVerdict, GrainPhase
from rayorch.store.archive import FactPlaces
from rayorch.store.claims import ContentClaims
from rayorch.store.errors import RunShapeError
from rayorch.store.layout import AppendBasis as AppendBasis
from rayorch.store.layout import RunInfo as RunInfo
from rayorch.store.layout import check_run_id, plan_description
from rayorch.store.layout import shard_of as shard_of
from rayorch.store.payload import Sealing

DEFAULT_READ_LIMIT = 10_000


class StoredFact(NamedTuple):
    """One fact as read back: its place in the shard's total order and its Domain stream."""

    seq: int
    domain: DomainId
    fact: Fact


class LeaseHolder(NamedTuple):
    driver: str
    epoch: int


class FactLog(ABC):
    """Each shard's facts in one total order: fenced driver appends, the commit gate, reads."""

    @abstractmethod
    def append(self, run_id: str, shard: int, epoch: int, facts: Sequence[Fact], *,
               driver: str, basis: AppendBasis | None = None) -> list[int]:
        """Append driver facts atomically if ``driver`` holds the shard's lease with ``epoch``.

        Returns their sequence numbers. Checks every fact first and writes nothing on
        error: :class:`LeaseLostError`/:class:`FencedError`/:class:`LeaseRolledBackError`
        when the caller is not the live holder (the Redis store also checks the token of
        the acquisition this client made), :class:`StoreRolledBackError` when the store no
        longer holds what ``basis`` says the caller's state rests on (it went back),
        :class:`GrainSealedError` for a dispatch/retry/failure of a sealed Grain.
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

    def resolve_payload(self, fact: Sealing) -> Sealing:
        """The fact with outputs stored in a payload file loaded back.

        Raises :class:`~rayorch.store.errors.PayloadError` when the file is missing or
        corrupt. Stores without payload files return the fact as it is.
        """
        return fact

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


class Leases(ABC):
    """Shard leases: one live holder per shard; its epoch fences every write it makes."""

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


class RunRegistry(ABC):
    """Runs (their plan, shards and config) and their manifests; list and delete them."""

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

    @abstractmethod
    def run_info(self, run_id: str) -> RunInfo:
        """The stored run; raises :class:`RunNotFoundError`."""

    @abstractmethod
    def list_runs(self) -> list[RunInfo]:
        """All runs, oldest first."""

    @abstractmethod
    def delete_run(self, run_id: str) -> None:
        """Remove a run and all its facts (no-op when absent)."""

    @abstractmethod
    def save_manifest(self, run_id: str, manifest: bytes) -> bytes:
        """Keep what a driver needs to run the run without its creator (first write wins).

        Returns the stored manifest (the existing one when the run already had one).
        """

    @abstractmethod
    def load_manifest(self, run_id: str) -> bytes | None:
        """The run's manifest, or None when the run was started by a lone ``run()``."""


POOL_LOG_MAX = 10_000
"""Pool size changes a store keeps per run (the oldest go first)."""


class DriverRegistry(ABC):
    """The drivers alive on a run (heartbeats, in the store's clock), its finished shards, and
    where its drivers write its outputs."""

    @abstractmethod
    def heartbeat(self, run_id: str, driver: str, ttl_s: float) -> None:
        """Register ``driver`` as alive on the run for ``ttl_s`` seconds (``0``: it left)."""

    @abstractmethod
    def driver_registry(self, run_id: str) -> tuple[float, dict[str, float]]:
        """``(now, {driver: heartbeat deadline})`` in the store's clock, expired entries too.

        Shared pool actors read it to tell "no driver yet" from "every driver died"
        (:mod:`rayorch.actors.orphan_watch`).
        """

    def live_drivers(self, run_id: str) -> list[str]:
        """The drivers whose last heartbeat has not expired, sorted."""
        now, deadlines = self.driver_registry(run_id)
        return sorted(driver for driver, deadline in deadlines.items() if deadline > now)

    @abstractmethod
    def record_sink(self, run_id: str, out_dir: str, out_format: str) -> tuple[str, str]:
        """Keep where a driver writes the run's outputs (first write wins; returns the kept
        one), so that ``rayorch audit`` checks them without ``--out-dir``; ``run_info``
        reports it as ``sink``."""

    @abstractmethod
    def mark_shard_done(self, run_id: str, shard: int) -> None:
        """Record that every source of ``shard`` is complete and emitted (idempotent)."""

    @abstractmethod
    def done_shards(self, run_id: str) -> frozenset[int]:
        """The shards marked done."""


class PoolLog(ABC):
    """What the drivers of a run did to its pools: size changes, for ``rayorch status``."""

    @abstractmethod
    def record_pool_sizes(self, run_id: str, records: Sequence[bytes]) -> None:
        """Append records of pool size changes (opaque bytes, in order: the driver's msgpack,
        ``runtime/pool_sizer.py``) to the run's pool log; the newest ``POOL_LOG_MAX`` stay."""

    @abstractmethod
    def pool_sizes(self, run_id: str) -> list[bytes]:
        """The run's pool log, oldest first (``rayorch status`` shows it)."""


class LineageStore(FactLog, Leases, RunRegistry, DriverRegistry, PoolLog, ContentClaims):
    """A store of runs with all six interfaces: what drivers, workers and tools open.

    Backends: :class:`~rayorch.store.memory.MemoryStore` (``memory://``),
    :class:`~rayorch.store.redis_store.RedisStore` (``redis://``, ``rediss://``) and
    :class:`~rayorch.store.redis_cluster.RedisClusterStore` (``redis+cluster://``).
    Stores pickle as their URL, so a Ray actor re-opens the same store.
    """

    url: str

    def read_view(self, run_id: str, *, payloads: bool = False) -> RunView:
        """The run's view (:mod:`rayorch.core.run_view`): each shard's facts folded once.

        Committed outputs stored as payload files are loaded only with ``payloads``.
        """
        info = self.run_info(run_id)
        return RunView(run_id, info.plan, {
            k: fold_shard(k, ((s.seq, s.fact) for s in self.iter_facts(run_id, k,
                                                                       payloads=payloads)))
            for k in range(info.shards)})

    def read_run(self, run_id: str, *, payloads: bool = True) -> dict[int, list[StoredFact]]:
        """All facts of a run, per shard."""
        info = self.run_info(run_id)
        return {k: list(self.iter_facts(run_id, k, payloads=payloads))
                for k in range(info.shards)}

    def wait_archived(self, timeout_s: float = 60.0) -> bool:
        """Wait up to ``timeout_s`` for the archives this client queued (True: none left);
        a store without an archive has none."""
        return True

    def fact_places(self, run_id: str) -> list[FactPlaces]:
        """Where each shard's facts live, archive or store (``rayorch audit`` says it);
        empty for a store without an archive: every fact is in the store."""
        return []

    def check(self) -> None:
        """Raise a ``StoreError`` unless the store is reachable and takes writes.

        Called before anything else of a run starts (Ray, actors), so a wrong URL fails
        at once with its cause. An in-process store is always usable.
        """

    def close(self) -> None:
        """Release connections (the store can still be re-opened from its URL)."""

    def __enter__(self) -> LineageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["DEFAULT_READ_LIMIT", "POOL_LOG_MAX", "ContentClaims", "DriverRegistry", "FactLog",
           "LeaseHolder", "Leases", "LineageStore", "PoolLog", "RunInfo", "RunRegistry",
           "StoredFact", "shard_of"]
