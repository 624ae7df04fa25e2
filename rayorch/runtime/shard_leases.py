"""The lease side of the one driver: take, renew, balance, lose shards; ride out store outages.

:class:`ShardLeases` is the component of :class:`~rayorch.runtime.shard_driver.ShardDriver`
that talks to the store about *who holds which shard* (docs/ARCHITECTURE.md, "One driver",
"Leases, holder tokens and rollback"). It owns its own state (balance times, released
shards, outage backoff, the fact seqs seen per shard) and reaches the driver only through
:class:`ShardHost`: the held shards, and rebuilding or forgetting one.
"""

from __future__ import annotations

import contextlib
import enum
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from rayorch.core.errors import RayorchError
from rayorch.core.machine import BatchFailed
from rayorch.core.pool_sizing import SizingSettings
from rayorch.runtime.replica_state import HeldShards, ReplicaStats
from rayorch.store.base import LineageStore, RunInfo

if TYPE_CHECKING:
    from rayorch.runtime.ports import Ledger
from rayorch.store.errors import (
    FencedError,
    GrainSealedError,
    LeaseHeldError,
    LeaseLostError,
    StoreRolledBackError,
    StoreUnavailableError,
)

TAKE_TRIES = 5  # rebuilds of one shard in a row while the store moves under them


class LeaseMode(enum.Enum):
    HOLD_ALL = "hold-all"  # Pipeline.run: this driver holds every shard, or stops
    SHARE = "share"  # driver replicas: balance shards with the run's other drivers


class LeaseLostStop(RayorchError):
    """This driver lost a shard's lease to another driver; it stopped and emits nothing more."""


class UnstorableValueError(RayorchError):
    """A source value or output cannot be encoded for the lineage store."""


class LineageLostError(RayorchError):
    """The lineage store no longer holds the run this driver was running."""


def log_to_stderr(line: str) -> None:
    from rayorch.core.sanitize import sanitize  # ids and causes come from the store

    print(sanitize(line), file=sys.stderr, flush=True)


@dataclass
class DriverConfig:
    """How one driver runs (see :class:`ShardDriver`)."""

    mode: LeaseMode
    lease_ttl_s: float
    micro_batch: int
    max_active_sources: int | None
    progress: bool | None = False
    log: Callable[[str], None] = log_to_stderr
    sleep: Callable[[float], None] = time.sleep  # idle waits and outage backoff
    # HOLD_ALL on a run this driver created: nobody may have held a shard before its first
    # lease (a driver stopped between creating the run and taking its leases is deposed).
    new_run: bool = False
    clock: Callable[[], float] = time.time  # the timestamps of facts (virtual in the simulator)
    keep_history: bool = False  # machines keep their kernel's fact log (tests)
    keep_finished: bool = False  # finished shards stay readable in ``ShardDriver.finished``
    # Pools that size themselves (replicas=(min, max) or "auto"): the policy's settings (None:
    # sizes stay as built) and the most this run's pools may hold (None: what is free).
    sizing: SizingSettings | None = None
    pool_budget: Mapping[str, float] | None = None
    # Where the run claims its share of the cluster (runtime/pool_ledger.py; None: alone).
    ledger: Ledger | None = None
    # A Prometheus endpoint on this port (runtime/metrics.py; 0: a free one; None: none).
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    # Threads that deliver to a file sink off the loop (runtime/delivery_writer.py; 0: on
    # the loop, deterministic: the in-process executor, the simulator).
    delivery_lanes: int = 0


class ShardHost(Protocol):
    """What :class:`ShardLeases` asks of the driver whose shards it leases."""

    shards: HeldShards

    def take(self, k: int, epoch: int, failed: Sequence[BatchFailed] = ()) -> None:
        """Rebuild shard ``k`` from the store and hold it with ``epoch``."""
        ...

    def resync(self, k: int, reason: str) -> None:
        """Rebuild shard ``k`` from the store, same lease."""
        ...

    def forget_outputs(self, k: int) -> None:
        """Shard ``k`` is lost: drop what the caller sink buffered of it."""
        ...


class ShardLeases:
    """Who holds which shard, for one driver: take, renew, balance and lose shards, ride out
    store outages (see the module docstring). The driver's held shards are ``host.shards``
    (:class:`HeldShards`, shared with the driver's loop); what is rebuilt, and how, is the
    host's."""

    def __init__(self, host: ShardHost, *, store: LineageStore, run_id: str, info: RunInfo,
                 driver_id: str, config: DriverConfig, counters: ReplicaStats) -> None:
        self.host, self.store, self.run_id, self.info = host, store, run_id, info
        self.driver_id, self.config, self.counters = driver_id, config, counters
        self._log = config.log
        self.run_done = False  # every shard of the run is done (or, holding all, finished)
        self._last_balance = -1e9
        self._seen_free: set[int] = set()
        self._released_at: dict[int, float] = {}
        self._outage_since: float | None = None
        self._backoff = 0.2

    @property
    def shards(self) -> HeldShards:
        return self.host.shards

    def take_settled(self, k: int, epoch: int, failed: Sequence[BatchFailed] = ()) -> None:
        """``host.take``, again while the store moves under the rebuild: a late commit lands
        between its read and its first append (a Grain it re-dispatches is sealed meanwhile),
        or the store goes back in between. Each try reads the shard afresh."""
        for _ in range(TAKE_TRIES - 1):
            try:
                self.host.take(k, epoch, failed)
                return
            except (GrainSealedError, StoreRolledBackError):
                self.shards.pop(k, None)
                failed = ()  # applied to the machine that was dropped; the store decides
        self.host.take(k, epoch, failed)

    def released(self, k: int) -> None:
        """Shard ``k`` was drained and released: nobody takes it back for two TTLs."""
        self._released_at[k] = time.monotonic()

    def look_again(self) -> None:
        """Renew and balance at the next turn, not a quarter TTL from the last time."""
        self._last_balance = -1e9

    # == leases =============================================================================
    def take_all(self) -> None:
        for k in range(self.info.shards):
            after: int | None = 0 if self.config.new_run else None
            while k not in self.shards:
                try:
                    epoch = self.store.acquire_lease(self.run_id, k, self.driver_id,
                                                     self.config.lease_ttl_s,
                                                     after_epoch=after)
                    self.take_settled(k, epoch)
                except LeaseHeldError as exc:
                    raise LeaseLostStop(
                        f"run {self.run_id} shard {k} is driven by another driver ({exc}); "
                        "start a fresh run, or join this one with `rayorch driver`") from None
                except FencedError as exc:
                    if after is not None and exc.holder == self.driver_id:
                        after = None  # granted to this driver by a call whose reply was lost
                        continue
                    raise LeaseLostStop(
                        f"lease lost: run {self.run_id} shard {k}: {exc}; this driver "
                        "stopped and emits nothing (another driver continues the run)"
                    ) from None
                except StoreUnavailableError as exc:
                    # Shards taken so far are re-taken; a lease granted by a call whose
                    # reply was lost is this driver's: the same driver id re-acquires it.
                    self.outage(exc)

    def tick(self) -> None:
        """Renew the held leases (every quarter TTL); share shards when replicas do."""
        if self.config.mode is LeaseMode.HOLD_ALL and not self.shards:
            self.run_done = True  # every shard finished
            return
        now = time.monotonic()
        if now - self._last_balance < self.config.lease_ttl_s / 4:
            return
        self._last_balance = now
        if self.config.mode is LeaseMode.HOLD_ALL:
            for k in list(self.shards):
                self.renew(k)
            return
        self._balance(now)

    def renew(self, k: int) -> None:
        st = self.shards[k]
        try:
            self.store.renew_lease(self.run_id, k, self.driver_id, st.epoch,
                                   self.config.lease_ttl_s)
        except FencedError as exc:
            self._lost(k, str(exc))
            return
        except LeaseLostError:
            # It lapsed (the caller was slow to ask for the next item): take it again only
            # if nobody held it since; a new epoch fences anything written before.
            self._check_run_kept()  # or the store forgot the lease with the whole run
            try:
                st.epoch = self.store.acquire_lease(self.run_id, k, self.driver_id,
                                                    self.config.lease_ttl_s,
                                                    after_epoch=st.epoch)
            except (LeaseLostError, LeaseHeldError, FencedError) as exc:
                self._lost(k, str(exc))
                return
        st.renewed = time.monotonic()

    def still_held(self, k: int) -> bool:
        """Renew shard ``k``'s lease unless renewed within a third of its TTL; whether this
        driver still holds it. A driver resumed after a pause (its caller stopped asking
        for items) learns here that the shard moved on, before it touches the shard's
        files (its first delivery to a shard removes the shard's leftover temp files: a
        deposed driver doing so would remove its successor's part in the making)."""
        st = self.shards.get(k)
        if st is not None and time.monotonic() - st.renewed > self.config.lease_ttl_s / 3:
            self.renew(k)
        return k in self.shards

    def ensure_fresh(self, k: int) -> None:
        """:meth:`still_held`, or stop: a driver that was asleep past its TTL stops here
        instead of emitting."""
        if not self.still_held(k):
            raise LeaseLostStop(f"lease lost: run {self.run_id} shard {k}")

    def _check_run_kept(self) -> None:
        """Stop with one clear line when the store has no record of the run any more."""
        # Not run_info: a client may keep the run's layout cached. Only on a lease loss.
        if not any(info.run_id == self.run_id for info in self.store.list_runs()):
            raise LineageLostError(
                f"the lineage store lost run {self.run_id} while this driver ran it: it holds "
                "no record of the run (restarted without its data, or its keys were evicted "
                "or deleted), so nothing more can be delivered safely. Start the run again; "
                "run Redis with appendonly yes to keep runs across restarts")

    def seen(self, k: int, last_seq: int) -> None:
        """Shard ``k``'s facts reach ``last_seq``; a store holding fewer lost some (checked)."""
        known = self.shards.read(k, last_seq)
        if last_seq < known:
            self._check_run_kept()
            self._log(f"driver {self.driver_id}: the lineage store went back on shard {k} "
                      f"(it holds facts up to {last_seq}, this driver saw {known}: a "
                      "rollback); rebuilt from what it holds, outputs already written adopted")

    def _lost(self, k: int, reason: str) -> None:
        """This driver no longer holds shard ``k``: stop touching it (or stop, holding all)."""
        self._check_run_kept()  # a lease "lost" with the whole run is the run lost
        st = self.shards.pop(k, None)
        if st is None:
            return
        self.counters.shards_lost += 1
        self.host.forget_outputs(k)
        if self.config.mode is LeaseMode.HOLD_ALL:
            raise LeaseLostStop(f"lease lost: run {self.run_id} shard {k}: {reason}; this "
                                "driver stopped and emits nothing more (another driver "
                                "continues the run)")
        self._log(f"driver {self.driver_id}: lost shard {k} ({reason}); it stops touching "
                  "the shard")

    @contextlib.contextmanager
    def guard(self, k: int) -> Iterator[None]:
        """Run a write to shard ``k``; a fenced write drops the shard, an append refused
        by a store that went back rebuilds it from what the store holds."""
        try:
            yield
        except (LeaseLostError, FencedError) as exc:
            self._lost(k, str(exc))
        except StoreRolledBackError as exc:
            self._check_run_kept()  # or it lost the whole run
            self.counters.rollbacks += 1
            self._log(f"driver {self.driver_id}: the lineage store went back on shard {k}: "
                      f"{exc.detail} (a rollback); rebuilt from what it holds, outputs "
                      "already written adopted")
            self.shards.forget_seq(k)  # said once
            self.host.forget_outputs(k)  # the rebuilt shard offers again what the store lacks
            self.host.resync(k, str(exc))

    def _balance(self, now: float) -> None:
        store, run, me, ttl = self.store, self.run_id, self.driver_id, self.config.lease_ttl_s
        store.heartbeat(run, me, ttl)
        for k in list(self.shards):
            self.renew(k)
        done = store.done_shards(run)
        open_shards = [k for k in range(self.info.shards) if k not in done]
        if not open_shards:
            if not self.shards:
                self.run_done = True
            return
        live = store.live_drivers(run)
        if me not in live:
            live = sorted([*live, me])
        fair = -(-len(open_shards) // len(live))
        active = [k for k, st in self.shards.items() if not st.draining]
        if len(active) > fair:
            for k in sorted(active, reverse=True)[: len(active) - fair]:
                self.shards[k].draining = True
                self._log(f"driver {me}: releasing shard {k} to rebalance "
                          f"({len(live)} drivers, {fair} shards each)")
            return
        start = (live.index(me) * fair) % len(open_shards)
        order = open_shards[start:] + open_shards[:start]
        free = [k for k in order if k not in self.shards
                and now - self._released_at.get(k, -1e9) > 2 * ttl
                and self._free_for_me(k)]
        owned = len(active)
        for k in free:
            if (owned < fair or k in self._seen_free) and self._acquire_and_take(k):
                owned += 1
        self._seen_free = set(free) - set(self.shards)

    def _free_for_me(self, k: int) -> bool:
        """Nobody holds shard ``k``, or this driver does (it forgot it in a store outage)."""
        holder = self.store.lease_holder(self.run_id, k)
        return holder is None or holder.driver == self.driver_id

    def _acquire_and_take(self, k: int) -> bool:
        try:
            epoch = self.store.acquire_lease(self.run_id, k, self.driver_id,
                                             self.config.lease_ttl_s)
        except LeaseHeldError:
            return False
        try:
            self.take_settled(k, epoch)
        except (LeaseLostError, FencedError, StoreRolledBackError, GrainSealedError) as exc:
            self._log(f"driver {self.driver_id}: lost shard {k} while taking it over ({exc})")
            self.shards.pop(k, None)
            return False
        return True

    # == store outages ==========================================================================
    def outage(self, exc: StoreUnavailableError) -> None:
        """Back off until the store answers and the held shards are rebuilt from it."""
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            self.counters.store_outages += 1
            self._log(f"driver {self.driver_id}: {exc}; retrying with backoff, then "
                      "rebuilding its shards from the store")
        while True:
            self.config.sleep(self._backoff)
            self._backoff = min(self._backoff * 2, 2.0)
            try:
                self._retake_after_outage()
                return
            except StoreUnavailableError:
                continue  # still down (an outage longer than the client's quick retries)

    def _retake_after_outage(self) -> None:
        lost = self.shards.release_all()
        self.look_again()
        if self.config.mode is LeaseMode.SHARE:
            return  # the next balance tick takes shards again
        # Re-take what this driver held: the same epoch while its lease lives, a new one
        # if it lapsed and nobody held it since; otherwise it stops.
        for k, st in sorted(lost.items()):
            try:
                st.epoch = self.store.acquire_lease(self.run_id, k, self.driver_id,
                                                    self.config.lease_ttl_s,
                                                    after_epoch=st.epoch)
                self.take_settled(k, st.epoch)
            except (LeaseLostError, LeaseHeldError, FencedError) as lost_exc:
                self.shards[k] = st
                self._lost(k, str(lost_exc))
                return
            except StoreUnavailableError:
                # Keep every shard not rebuilt yet (with its newest epoch) for the next try.
                self.shards.update({j: lost[j] for j in lost if j >= k})
                raise

    def store_back(self) -> None:
        if self._outage_since is not None:
            down = time.monotonic() - self._outage_since
            self._log(f"driver {self.driver_id}: lineage store reachable again after {down:.1f}s")
            self._outage_since = None
            self._backoff = 0.2

