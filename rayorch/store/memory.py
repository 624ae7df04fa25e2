"""The in-process lineage store: the embedded default (one driver, no Redis needed).

It implements the same interface and the same commit rule as the Redis store
(:func:`rayorch.core.commit.commit_verdict`), under one lock. ``memory://NAME``
names a store shared by everything in this process; ``memory://`` makes a fresh one.

A store opened by URL lives while someone has it open: every :meth:`MemoryStore.open`
counts a user, every :meth:`close` ends one, and the last close drops the store from the
process's registry and its lineage with it (docs/ARCHITECTURE.md, "Bounded driver
memory"). To read a run after its driver closed, keep the store open meanwhile.
"""

from __future__ import annotations

import threading
import time
import uuid
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rayorch.core.commit import commit_verdict
from rayorch.core.facts import Fact, GrainCommitted, LeaseAcquired
from rayorch.core.ids import ROOT, CallId, DomainId, Path, parse_path
from rayorch.core.machine import barrier_fact
from rayorch.core.vocabulary import PHASE_AFTER, CommitVerdict, FactKind, GrainPhase
from rayorch.store.base import (
    DEFAULT_READ_LIMIT,
    LeaseHolder,
    LineageStore,
    RunInfo,
    RunLayout,
    StoredFact,
    check_reopen,
    check_run_id,
    prepare_driver_facts,
    prepare_reports,
)
from rayorch.store.errors import (
    FencedError,
    GrainSealedError,
    LeaseHeldError,
    LeaseLostError,
    LeaseRolledBackError,
    RunNotFoundError,
    StoreClosedError,
    StoreURLError,
)
from rayorch.store.keys import grain_field


@dataclass
class _Lease:
    driver: str
    epoch: int
    deadline: float


@dataclass
class _Shard:
    facts: list[StoredFact] = field(default_factory=list)
    by_domain: dict[DomainId, list[int]] = field(default_factory=dict)  # domain -> seqs
    grains: dict[str, tuple[GrainPhase, int]] = field(default_factory=dict)
    barriers: set[str] = field(default_factory=set)
    lease: _Lease | None = None  # the live lease
    last: _Lease | None = None  # the last acquisition (who continued the shard)
    epoch: int = 0

    def add(self, domain: DomainId, fact: Fact) -> int:
        seq = len(self.facts) + 1
        self.facts.append(StoredFact(seq, domain, fact))
        self.by_domain.setdefault(domain, []).append(seq)
        return seq


@dataclass
class _Run:
    layout: RunLayout
    shards: list[_Shard]
    manifest: bytes | None = None
    drivers: dict[str, float] = field(default_factory=dict)  # driver -> deadline
    done: set[int] = field(default_factory=set)


class MemoryStore(LineageStore):
    """Lineage facts in this process's memory; thread-safe."""

    _registry: ClassVar[dict[str, MemoryStore]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()
    _users = 0  # opens minus closes of a store from the registry
    _dropped = False  # its last user closed it: its lineage is gone

    def __init__(self, url: str = "memory://", *, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.url = url
        self._clock = clock
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._runs: dict[str, _Run] = {}

    @classmethod
    def open(cls, url: str) -> MemoryStore:
        """``memory://NAME`` returns the process's store of that name; ``memory://`` a new one."""
        if not url.startswith("memory://"):
            raise StoreURLError(url, "a memory store URL starts with memory://")
        name = url[len("memory://"):]
        if "/" in name or "?" in name:
            raise StoreURLError(url, "a memory store URL is memory:// or memory://NAME")
        if not name:
            name = uuid.uuid4().hex
        with cls._registry_lock:
            store = cls._registry.get(name)
            if store is None:
                store = cls._registry[name] = cls(f"memory://{name}")
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
            info = RunInfo(run_id, fingerprint, desc, shards, micro_batch, config, time.time())
            self._runs[run_id] = _Run(RunLayout(info), [_Shard() for _ in range(shards)])
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
    def _live_lease(self, shard: _Shard) -> _Lease | None:
        lease = shard.lease
        if lease is not None and lease.deadline <= self._clock():
            shard.lease = lease = None
        return lease

    def acquire_lease(self, run_id: str, shard: int, driver: str, ttl_s: float, *,
                      after_epoch: int | None = None) -> int:
        with self._changed:
            _, state = self._shard(run_id, shard)
            lease = self._live_lease(state)
            if after_epoch is not None:
                try:
                    lease = self._fence(run_id, shard, state, after_epoch, driver)
                except LeaseLostError as exc:
                    if type(exc) is not LeaseLostError:
                        raise  # deposed; plain LeaseLostError: nobody held it since
            elif lease is not None and lease.driver != driver:
                raise LeaseHeldError(run_id, shard, lease.driver, lease.epoch)
            deadline = self._clock() + ttl_s
            if lease is not None:
                lease.deadline = deadline
                return lease.epoch
            state.epoch = max(state.epoch, state.last.epoch if state.last else 0) + 1
            state.lease = state.last = _Lease(driver, state.epoch, deadline)
            state.add(ROOT, LeaseAcquired(shard, driver, state.epoch, ts=time.time()))
            self._changed.notify_all()
            return state.epoch

    def _fence(self, run_id: str, shard: int, state: _Shard, epoch: int, driver: str
               ) -> _Lease:
        """The live lease if ``driver`` holds it with ``epoch``; else raise why not.

        The same rule as ``lua/includes/lease.lua``: :class:`LeaseLostError` when the
        lease lapsed and nobody held the shard since, :class:`FencedError` naming who
        continued it, :class:`LeaseRolledBackError` for an epoch the store never handed out.
        """
        lease = self._live_lease(state)
        if lease is not None and lease.epoch == epoch and lease.driver == driver:
            return lease
        last = lease or state.last
        last_epoch, last_driver = (last.epoch, last.driver) if last else (state.epoch, "")
        mine = last_epoch == epoch and (last is None or last.driver == driver)
        state.epoch = max(state.epoch, epoch)
        if lease is None and mine:
            raise LeaseLostError(run_id, shard, epoch)
        if last_epoch < epoch:
            raise LeaseRolledBackError(run_id, shard, epoch, last_epoch, last_driver)
        raise FencedError(run_id, shard, epoch, last_epoch, last_driver)

    def renew_lease(self, run_id: str, shard: int, driver: str, epoch: int, ttl_s: float) -> None:
        with self._lock:
            _, state = self._shard(run_id, shard)
            lease = self._fence(run_id, shard, state, epoch, driver)
            lease.deadline = self._clock() + ttl_s

    def release_lease(self, run_id: str, shard: int, driver: str, epoch: int) -> None:
        with self._lock:
            _, state = self._shard(run_id, shard)
            lease = self._live_lease(state)
            if lease is not None and lease.epoch == epoch and lease.driver == driver:
                state.lease = None

    def lease_holder(self, run_id: str, shard: int) -> LeaseHolder | None:
        with self._lock:
            _, state = self._shard(run_id, shard)
            lease = self._live_lease(state)
            return None if lease is None else LeaseHolder(lease.driver, lease.epoch)

    # -- facts -------------------------------------------------------------------
    def append(self, run_id: str, shard: int, epoch: int, facts: Sequence[Fact], *,
               driver: str) -> list[int]:
        with self._changed:
            run, state = self._shard(run_id, shard)
            prepared = prepare_driver_facts(run.layout, shard, facts)
            self._fence(run_id, shard, state, epoch, driver)
            overlay: dict[str, tuple[GrainPhase, int]] = {}
            conflicts: list[tuple[CallId, Path]] = []
            for item in prepared:
                if item.kind == FactKind.OTHER:
                    continue
                phase, _ = overlay.get(item.grain) or state.grains.get(item.grain) or (None, 0)
                if phase is GrainPhase.SEALED:
                    call, _, path = item.grain.rpartition("|")
                    conflicts.append((call, parse_path(path)))
                else:
                    overlay[item.grain] = (PHASE_AFTER[FactKind(item.kind)], item.generation)
            if conflicts:
                raise GrainSealedError(run_id, shard, conflicts)
            state.grains.update(overlay)
            seqs = [state.add(item.domain, item.fact) for item in prepared]
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
                for item in prepared:
                    phase, generation = state.grains.get(item.grain) or (None, 0)
                    barred = bool(item.barrier) and item.barrier in state.barriers
                    verdict = commit_verdict(phase, generation, item.generation, barred)
                    verdicts[item.position] = verdict
                    if not verdict.accepted:
                        continue
                    state.grains[item.grain] = (GrainPhase.SEALED, item.generation)
                    state.add(item.domain, item.report)
                    if item.installs_barrier:
                        state.barriers.add(item.barrier)
                        state.add(item.domain, barrier_fact(item.report))
            self._changed.notify_all()
        return verdicts

    # -- driver replicas -----------------------------------------------------------
    def save_manifest(self, run_id: str, manifest: bytes) -> bytes:
        with self._lock:
            run = self._run(run_id)
            if run.manifest is None:
                run.manifest = bytes(manifest)
            return run.manifest

    def load_manifest(self, run_id: str) -> bytes | None:
        with self._lock:
            return self._run(run_id).manifest

    def heartbeat(self, run_id: str, driver: str, ttl_s: float) -> None:
        with self._lock:
            run = self._run(run_id)
            if ttl_s <= 0:
                run.drivers.pop(driver, None)
            else:
                run.drivers[driver] = self._clock() + ttl_s

    def live_drivers(self, run_id: str) -> list[str]:
        with self._lock:
            now = self._clock()
            return sorted(d for d, deadline in self._run(run_id).drivers.items() if deadline > now)

    def driver_registry(self, run_id: str) -> tuple[float, dict[str, float]]:
        with self._lock:
            return self._clock(), dict(self._run(run_id).drivers)

    def mark_shard_done(self, run_id: str, shard: int) -> None:
        with self._lock:
            run = self._run(run_id)
            run.layout.check_shard(shard)
            run.done.add(shard)

    def done_shards(self, run_id: str) -> frozenset[int]:
        with self._lock:
            return frozenset(self._run(run_id).done)

    def _select(self, state: _Shard, after: int, limit: int, domain: DomainId | None
                ) -> list[StoredFact]:
        if domain is None:
            return state.facts[after:after + limit]
        seqs = state.by_domain.get(domain, [])
        start = bisect_right(seqs, after)
        return [state.facts[s - 1] for s in seqs[start:start + limit]]

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
                found = self._select(state, after, limit, domain)
                if found or deadline is None:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return found
                self._changed.wait(remaining)

    def grain_phase(self, run_id: str, shard: int, call: CallId, path: Path
                    ) -> tuple[GrainPhase, int] | None:
        with self._lock:
            _, state = self._shard(run_id, shard)
            return state.grains.get(grain_field(call, path))

    def barriers(self, run_id: str, shard: int) -> frozenset[tuple[CallId, Path]]:
        with self._lock:
            _, state = self._shard(run_id, shard)
            members = list(state.barriers)
        return frozenset(
            (call, parse_path(path)) for call, _, path in (m.rpartition("|") for m in members)
        )


__all__ = ["MemoryStore"]
