"""The in-process lineage store: the embedded default (one driver, no Redis needed).

It implements the same interfaces as the Redis store, with the rules of
:mod:`rayorch.store.gate` (the lease fence, the commit gate) applied under one lock. ``memory://NAME``
names a store shared by everything in this process; ``memory://`` makes a fresh one.

A store opened by URL lives while someone has it open: every :meth:`MemoryStore.open`
counts a user, every :meth:`close` ends one, and the last close drops the store from the
process's registry and its lineage with it (docs/ARCHITECTURE.md, "Bounded driver
memory"). To read a run after its driver closed, keep the store open meanwhile.

It keeps what a Redis store keeps in Redis, in the driver's heap: a delivered source's
values go (by the run's ``keep``: ``memory://NAME?keep=all`` keeps every value, for a run to
be reused whole; the default is ``none``), its Grains leave the Grain table, and facts move
into compressed segments (:mod:`rayorch.store.memory_log`), so the driver's memory follows
the sources in flight, not the run.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar
from urllib.parse import parse_qsl

from rayorch.core.facts import Fact, GrainCommitted, LeaseAcquired
from rayorch.core.ids import ROOT, CallId, DomainId, Path
from rayorch.core.vocabulary import CommitVerdict
from rayorch.store.archive import FactPlaces
from rayorch.store.base import (
    DEFAULT_READ_LIMIT,
    POOL_LOG_MAX,
    LeaseHolder,
    LineageStore,
    StoredFact,
)
from rayorch.store.claims import MemoryClaims
from rayorch.store.errors import RunNotFoundError, StoreClosedError, StoreURLError
from rayorch.store.gate import (
    GrainEntry,
    ShardLease,
    basis_check,
    judge_reports,
    seal_check,
    split_field,
)
from rayorch.store.keys import grain_field
from rayorch.store.layout import (
    KEEP_MODES,
    AppendBasis,
    RunInfo,
    RunLayout,
    check_reopen,
    check_run_id,
    kept_calls,
    prepare_driver_facts,
    prepare_reports,
)
from rayorch.store.memory_log import ShardLog

DEFAULT_KEEP = "none"  # the values are the driver's heap (rayorch.store.layout.KEEP_MODES)


@dataclass
class _Shard:
    log: ShardLog  # its facts and Grain table
    lease: ShardLease = field(default_factory=ShardLease)
    last_append_first: int = 0  # the first seq of the latest driver append

    def add(self, domain: DomainId, fact: Fact) -> int:
        return self.log.add(domain, fact)


@dataclass
class _Run:
    layout: RunLayout
    shards: list[_Shard]
    manifest: bytes | None = None
    drivers: dict[str, float] = field(default_factory=dict)  # driver -> deadline
    done: set[int] = field(default_factory=set)
    pools: list[bytes] = field(default_factory=list)  # the pool log


class MemoryStore(MemoryClaims, LineageStore):
    """Lineage facts in this process's memory; thread-safe."""

    _registry: ClassVar[dict[str, MemoryStore]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()
    _users = 0  # opens minus closes of a store from the registry
    _dropped = False  # its last user closed it: its lineage is gone

    def __init__(self, url: str = "memory://", *, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        # a backend built on this class may have a scheme of its own
        self.url, self.keep = _parse_url(url) if url.startswith("memory://") else (
            url, DEFAULT_KEEP)
        self._clock = clock
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._runs: dict[str, _Run] = {}
        MemoryClaims.__init__(self)

    @classmethod
    def open(cls, url: str) -> MemoryStore:
        """``memory://NAME`` returns the process's store of that name; ``memory://`` a new one."""
        plain, keep = _parse_url(url)
        name = plain[len("memory://"):] or uuid.uuid4().hex
        with cls._registry_lock:
            store = cls._registry.get(name)
            if store is None:
                store = cls._registry[name] = cls(f"memory://{name}")
            if "keep=" in url:
                store.keep = keep  # for the runs it opens from now on (each records its own)
            store._users += 1
            return store

    def close(self) -> None:
        """End one user of a store opened by URL; the last one drops it and its lineage.

        A store made with ``MemoryStore()`` is not in the registry: it lives as long as
        the object (closing it changes nothing).
        """
        with self._registry_lock:
            if self._users <= 0:
                return
            self._users -= 1
            if self._users:
                return
            name = self.url[len("memory://"):]
            if self._registry.get(name) is self:
                del self._registry[name]
        with self._lock:
            self._dropped = True
            self._runs = {}

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Another process re-opens by name: its own memory, not this one (use Redis to share).
        return (MemoryStore.open, (self.url,))

    # -- runs --------------------------------------------------------------------
    def _open_run(self, run_id: str, desc: dict[str, Any], fingerprint: str, shards: int,
                  micro_batch: int, config: dict[str, Any]) -> RunInfo:
        with self._lock:
            self._check_open()
            run = self._runs.get(run_id)
            if run is not None:
                check_reopen(run.layout.info, fingerprint, shards, micro_batch)
                return run.layout.info
            info = RunInfo(run_id, fingerprint, desc, shards, micro_batch, config, time.time(),
                           keep=self.keep)
            calls = kept_calls(info.keep, desc)

            def kept(call: CallId) -> bool:
                return calls is None or call in calls

            self._runs[run_id] = _Run(RunLayout(info), [_Shard(ShardLog(run_id, k, kept))
                                                        for k in range(shards)])
            return info

    def _run(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is None:
            self._check_open()
            raise RunNotFoundError(run_id, self.url)
        return run

    def _check_open(self) -> None:
        if self._dropped:
            raise StoreClosedError(
                f"the memory store {self.url} was closed by its last user, and its lineage "
                "dropped with it; keep it open (open_store(url)) while you need its runs, or "
                "use a redis:// store")

    def _shard(self, run_id: str, shard: int) -> tuple[_Run, _Shard]:
        run = self._run(run_id)
        run.layout.check_shard(shard)
        return run, run.shards[shard]

    def run_info(self, run_id: str) -> RunInfo:
        with self._lock:
            return self._run(run_id).layout.info

    def list_runs(self) -> list[RunInfo]:
        with self._lock:
            self._check_open()
            infos = [r.layout.info for r in self._runs.values()]
        return sorted(infos, key=lambda i: (i.created_ts, i.run_id))

    def delete_run(self, run_id: str) -> None:
        check_run_id(run_id)
        with self._lock:
            self._runs.pop(run_id, None)

    # -- leases ------------------------------------------------------------------
    def acquire_lease(self, run_id: str, shard: int, driver: str, ttl_s: float, *,
                      after_epoch: int | None = None) -> int:
        with self._changed:
            _, state = self._shard(run_id, shard)
            epoch, new = state.lease.acquire(run_id, shard, driver, ttl_s, self._clock(),
                                             after_epoch=after_epoch)
            if new:
                state.add(ROOT, LeaseAcquired(shard, driver, epoch, ts=time.time()))
                self._changed.notify_all()
            return epoch

    def renew_lease(self, run_id: str, shard: int, driver: str, epoch: int, ttl_s: float) -> None:
        with self._lock:
            _, state = self._shard(run_id, shard)
            now = self._clock()
            state.lease.fence(run_id, shard, epoch, driver, now).deadline = now + ttl_s

    def release_lease(self, run_id: str, shard: int, driver: str, epoch: int) -> None:
        with self._lock:
            _, state = self._shard(run_id, shard)
            state.lease.release(epoch, driver, self._clock())

    def lease_holder(self, run_id: str, shard: int) -> LeaseHolder | None:
        with self._lock:
            _, state = self._shard(run_id, shard)
            lease = state.lease.current(self._clock())
            return None if lease is None else LeaseHolder(lease.driver, lease.epoch)

    # -- facts -------------------------------------------------------------------
    def append(self, run_id: str, shard: int, epoch: int, facts: Sequence[Fact], *,
               driver: str, basis: AppendBasis | None = None) -> list[int]:
        with self._changed:
            run, state = self._shard(run_id, shard)
            prepared = prepare_driver_facts(run.layout, shard, facts)
            state.lease.fence(run_id, shard, epoch, driver, self._clock())
            grains = state.log.grains
            basis_check(run_id, shard, basis, state.log.last_seq, state.last_append_first,
                        grains.get)
            state.log.note_grains(seal_check(run_id, shard, prepared, grains.get))
            seqs = [state.add(item.domain, item.fact) for item in prepared]
            if seqs:
                state.last_append_first = seqs[0]
            self._changed.notify_all()
            return seqs

    def commit(self, run_id: str, reports: Sequence[GrainCommitted], *,
               token: str | None = None) -> list[CommitVerdict]:
        # ``token`` matters where a reply can be lost; an in-process call cannot lose one.
        verdicts = [CommitVerdict.NOT_DISPATCHED] * len(reports)
        with self._changed:
            run = self._run(run_id)
            for shard, prepared in prepare_reports(run.layout, reports).items():
                state = run.shards[shard]
                judge_reports(prepared, state.log.grains, state.log.barriers, verdicts,
                              state.add)
            self._changed.notify_all()
        return verdicts

    # -- driver replicas -----------------------------------------------------------
    def save_manifest(self, run_id: str, manifest: bytes) -> bytes:
        with self._lock:
            run = self._run(run_id)
            if run.manifest is None:
                run.manifest = bytes(manifest)
            return run.manifest

    def record_sink(self, run_id: str, out_dir: str, out_format: str) -> tuple[str, str]:
        with self._lock:
            layout = self._run(run_id).layout
            if layout.info.sink is None:
                layout.info = replace(layout.info, sink=(str(out_dir), str(out_format)))
            assert layout.info.sink is not None
            return layout.info.sink

    def load_manifest(self, run_id: str) -> bytes | None:
        with self._lock:
            return self._run(run_id).manifest

    def record_pool_sizes(self, run_id: str, records: Sequence[bytes]) -> None:
        with self._lock:
            log = self._run(run_id).pools
            log.extend(bytes(r) for r in records)
            del log[:-POOL_LOG_MAX]

    def pool_sizes(self, run_id: str) -> list[bytes]:
        with self._lock:
            return list(self._run(run_id).pools)

    def heartbeat(self, run_id: str, driver: str, ttl_s: float) -> None:
        with self._lock:
            run = self._run(run_id)
            if ttl_s <= 0:
                run.drivers.pop(driver, None)
            else:
                run.drivers[driver] = self._clock() + ttl_s

    def driver_registry(self, run_id: str) -> tuple[float, dict[str, float]]:
        with self._lock:
            return self._clock(), dict(self._run(run_id).drivers)

    def mark_shard_done(self, run_id: str, shard: int) -> None:
        with self._lock:
            run = self._run(run_id)
            run.layout.check_shard(shard)
            run.done.add(shard)
            log = run.shards[shard].log
            log.compact(log.last_seq)  # a done shard is compacted whole

    def fact_places(self, run_id: str) -> list[FactPlaces]:
        """Where each shard's facts live: compressed segments, and the live tail."""
        with self._lock:
            run = self._run(run_id)
            return [FactPlaces(k, *s.log.places(), self.url) for k, s in enumerate(run.shards)]

    def done_shards(self, run_id: str) -> frozenset[int]:
        with self._lock:
            return frozenset(self._run(run_id).done)

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
        deadline = None if block_s is None else time.monotonic() + block_s
        with self._changed:
            while True:
                _, state = self._shard(run_id, shard)
                found = state.log.select(after, limit, domain)
                if found or deadline is None:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return found
                self._changed.wait(remaining)

    def grain_phase(self, run_id: str, shard: int, call: CallId, path: Path
                    ) -> GrainEntry | None:
        with self._lock:
            _, state = self._shard(run_id, shard)
            return state.log.grains.get(grain_field(call, path))

    def barriers(self, run_id: str, shard: int) -> frozenset[tuple[CallId, Path]]:
        with self._lock:
            _, state = self._shard(run_id, shard)
            members = list(state.log.barriers)
        return frozenset(split_field(member) for member in members)


def _parse_url(url: str) -> tuple[str, str]:
    """``(memory://NAME, keep)`` of a memory store URL (``memory://[NAME][?keep=MODE]``)."""
    if not url.startswith("memory://"):
        raise StoreURLError(url, "a memory store URL starts with memory://")
    name, _, query = url[len("memory://"):].partition("?")
    if "/" in name or "?" in query:
        raise StoreURLError(url, "a memory store URL is memory:// or memory://NAME")
    options = dict(parse_qsl(query, keep_blank_values=True))
    keep = options.pop("keep", DEFAULT_KEEP)
    if options:
        raise StoreURLError(url, f"a memory store takes only keep=, not {sorted(options)[0][:20]}=")
    if keep not in KEEP_MODES:
        raise StoreURLError(url, f"keep= takes {' or '.join(KEEP_MODES)}, not {keep[:20]!r}")
    return f"memory://{name}", keep


__all__ = ["MemoryStore"]
