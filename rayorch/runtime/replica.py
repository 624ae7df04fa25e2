"""Driver replicas: several drivers share one run, take over a dead one's shards, resume.

A :class:`ReplicaDriver` joins a run that carries a manifest (see
:mod:`rayorch.runtime.manifest`). It keeps one :class:`~rayorch.core.state.Kernel`
per shard it holds, so a shard is taken, rebuilt, released or lost on its own:

* **balance** (every quarter lease TTL): heartbeat, renew leases, then hold
  ``ceil(open shards / live drivers)`` shards: take free ones, drain and release the
  extra ones (after their in-flight batches return). A shard left free for two
  ticks (its driver died) is taken even beyond the fair share.
* **take** = acquire the lease (epoch + 1), fold the shard's facts into a fresh
  kernel, re-dispatch the Grains the store shows in flight with a new generation
  (``GrainRetried`` "driver failover"), admit the shard's remaining sources.
* **lose**: any fenced write (``LeaseLostError``/``FencedError``) drops the shard's
  state at once: a deposed driver stops touching it.
* **outputs** go to the run's :class:`OutputSink` (one file per source, written
  atomically) and then a fenced ``OutputEmitted``; a new holder never emits a source
  whose fact exists and re-writes, idempotently, one whose file was written but not
  its fact.
* **store outage**: one line, backoff, then every shard is re-taken and rebuilt from
  the store (the store is the truth; the leases are usually still ours).
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import ray

from rayorch.actors.pool import ActorPool, BatchOutcome, InFlightBatch
from rayorch.actors.worker import BatchTask
from rayorch.core.commit import CommitVerdict
from rayorch.core.facts import (
    REPORT_GROUP_FAILURE,
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
from rayorch.core.ids import CallId, GrainKey, Path
from rayorch.core.outcome import FailedResult
from rayorch.core.plan import CallSpec, Plan, Policy
from rayorch.core.state import Kernel
from rayorch.runtime.loop import item_result
from rayorch.runtime.manifest import ManifestError, OutputSink, RunManifest
from rayorch.runtime.replica_state import ReplicaStats, ShardState
from rayorch.runtime.session import build_pools, ensure_ray, new_driver_id
from rayorch.runtime.user_code import ship_user_code
from rayorch.store.base import SHARED_STORE_SCHEMES, barrier_fact, open_store
from rayorch.store.errors import (
    GrainSealedError,
    LeaseHeldError,
    LeaseLostError,
    StoreUnavailableError,
)

REPLICA_LEASE_TTL_S = 10.0
FAILOVER_CAUSE = "driver failover"
IDLE_SLEEP_S = 0.05


def with_quick_retries(url: str, retries: int = 3) -> str:
    """A Redis URL whose client gives up reconnecting after ``retries`` attempts."""
    if not url.lower().startswith(SHARED_STORE_SCHEMES) or "retries=" in url:
        return url
    return f"{url}{'&' if '?' in url else '?'}retries={retries}"


class ReplicaDriver:
    """One driver of a shared run; iterate :meth:`results` to run it until the run completes."""

    def __init__(
        self,
        store_url: str,
        run_id: str,
        *,
        driver_id: str | None = None,
        address: str | None = None,
        lease_ttl_s: float = REPLICA_LEASE_TTL_S,
        log: Callable[[str], None] | None = None,
        out_dir: str | None = None,
    ) -> None:
        self.store_url, self.run_id = store_url, run_id
        self.driver_id = driver_id or new_driver_id()
        self.lease_ttl_s = lease_ttl_s
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        # Few reconnect attempts inside redis-py: an outage surfaces here within a second,
        # is reported once, and the loop backs off and rebuilds from the store.
        self.store = open_store(with_quick_retries(store_url))
        self.info = self.store.run_info(run_id)
        blob = self.store.load_manifest(run_id)
        if blob is None:
            raise ManifestError(
                f"run {run_id} has no manifest, so no other driver can run it (its Pipeline.run "
                "could not record one and said why on stderr when it started); make runs "
                "resumable with rayorch.driver.create_run or a Pipeline.run that can be recorded"
            )
        self.manifest = RunManifest.decode(blob)
        pipeline = self.manifest.build_pipeline()
        self.plan: Plan = pipeline.compile()
        if self.plan.fingerprint() != self.info.fingerprint:
            raise ManifestError(
                f"the pipeline {self.manifest.pipeline} compiles to plan {self.plan.fingerprint()}"
                f" but run {run_id} was created with plan {self.info.fingerprint}: the code "
                "changed since; run the code version the run was created with"
            )
        sink_dir = self.manifest.out_dir or out_dir  # the run's own sink wins
        self.sink = OutputSink(sink_dir) if sink_dir else None
        self.sources = self.manifest.sources
        self.shard_sources: dict[int, list[int]] = {k: [] for k in range(self.info.shards)}
        for index in range(len(self.sources)):
            self.shard_sources[self.info.shard_of(index)].append(index)
        self.call_specs: dict[CallId, CallSpec] = {}
        for node in self.plan.calls:
            assert node.call is not None
            self.call_specs[node.call.id] = node.call
        self._call_rank = {call: -i for i, call in enumerate(self.call_specs)}
        self.shards: dict[int, ShardState] = {}
        self.stats = ReplicaStats(self.driver_id)
        self._batches: dict[Any, InFlightBatch] = {}
        self._batch_states: dict[Any, list[ShardState]] = {}
        self._batch_ids = itertools.count()
        self._last_balance = -1e9
        self._seen_free: set[int] = set()
        self._released_at: dict[int, float] = {}
        self._run_done = False
        self._closed = False
        self._outage_since: float | None = None
        self._backoff = 0.2
        self._rr = 0
        ensure_ray(address)
        ship_user_code([type(pipeline), *(m.target for m in self.plan.modules if m.target)])
        self.pools, call_module = build_pools(
            self.plan, store_url, run_id, depth=self.manifest.depth, shared=True
        )
        self._pool_of = {call: self.pools[module] for call, module in call_module.items()}

    # -- the loop ---------------------------------------------------------------------
    def results(self) -> Iterator[tuple[int, Any]]:
        """Run until every shard of the run is done; yield the outputs this driver emitted."""
        try:
            while not self._run_done:
                try:
                    self._balance()
                    if self._run_done:
                        break
                    self._admit()
                    self._dispatch()
                    yield from self._emit()
                    self._finish_shards()
                    if self._batches:
                        self._collect()
                        self._enforce_timeouts()
                    else:
                        time.sleep(IDLE_SLEEP_S if self.shards else self.lease_ttl_s / 8)
                    self._flush_all()
                    for st in list(self.shards.values()):
                        if not st.draining:
                            st.kernel.check_progress()
                    self._store_back()
                except StoreUnavailableError as exc:
                    self._store_outage(exc)
        finally:
            self.close()

    def close(self) -> None:
        """Leave the run: write what is queued, release the leases (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for k, st in list(self.shards.items()):
            with contextlib.suppress(Exception):  # a lease expires by itself anyway
                self._flush(st)
                self.store.release_lease(self.run_id, k, self.driver_id, st.epoch)
        self.shards.clear()
        with contextlib.suppress(Exception):
            self.store.heartbeat(self.run_id, self.driver_id, 0)
        for pool in self.pools.values():
            if self._run_done:
                pool.kill_shared()
            pool.shutdown()
        self.store.close()

    # -- leases and balance -----------------------------------------------------------------
    def _balance(self) -> None:
        now = time.monotonic()
        if now - self._last_balance < self.lease_ttl_s / 4:
            return
        self._last_balance = now
        store, run, me = self.store, self.run_id, self.driver_id
        store.heartbeat(run, me, self.lease_ttl_s)
        for k, st in list(self.shards.items()):
            try:
                store.renew_lease(run, k, me, st.epoch, self.lease_ttl_s)
            except LeaseLostError as exc:
                self._drop(k, str(exc))
        done = store.done_shards(run)
        open_shards = [k for k in range(self.info.shards) if k not in done]
        if not open_shards:
            if not self.shards:
                self._run_done = True
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
                and now - self._released_at.get(k, -1e9) > 2 * self.lease_ttl_s
                and store.lease_holder(run, k) is None]
        owned = len(active)
        for k in free:
            if (owned < fair or k in self._seen_free) and self._take(k):
                owned += 1
        self._seen_free = set(free) - set(self.shards)

    def _take(self, k: int) -> bool:
        started = time.monotonic()
        try:
            epoch = self.store.acquire_lease(self.run_id, k, self.driver_id, self.lease_ttl_s)
        except LeaseHeldError:
            return False
        try:
            st, folded, rerun = self._rebuild(k, epoch)
        except LeaseLostError as exc:
            self._log(f"driver {self.driver_id}: lost shard {k} while taking it over ({exc})")
            return False
        self.shards[k] = st
        took = time.monotonic() - started
        self.stats.shards_taken += 1
        self.stats.grains_rerun += rerun
        self.stats.take_seconds.append(took)
        self._log(f"driver {self.driver_id}: took shard {k} (epoch {epoch}): {folded} facts "
                  f"folded, {rerun} in-flight grains re-dispatched, in {took:.2f}s")
        return True

    def _rebuild(self, k: int, epoch: int) -> tuple[ShardState, int, int]:
        """Fold the shard's facts into a new kernel; re-dispatch what the store shows in flight."""
        kernel = Kernel(self.plan, max_active_sources=self.manifest.max_active_sources,
                        total_sources=len(self.shard_sources[k]))
        in_flight: dict[GrainKey, int] = {}
        admitted: set[int] = set()
        cursor = emitted = folded = 0
        # Announcements the fold derives that the store lacks (their writer died first).
        missing: list[Fact] = []
        for stored in self.store.iter_facts(self.run_id, k):
            cursor, fact = stored.seq, stored.fact
            derived = kernel.apply(fact)
            folded += 1
            if isinstance(fact, ExpansionClosed | RunCompleted) and fact in missing:
                missing.remove(fact)
            missing.extend(derived)
            if isinstance(fact, GrainDispatched):
                in_flight[(fact.call, fact.path)] = fact.generation
            elif isinstance(fact, GrainCommitted | GrainRetried | GrainFailed):
                in_flight.pop((fact.call, fact.path), None)
            elif isinstance(fact, SourceAdmitted):
                admitted.add(fact.index)
            elif isinstance(fact, OutputEmitted):
                emitted += 1
        pending = deque(i for i in self.shard_sources[k] if i not in admitted)
        st = ShardState(k, epoch, kernel, pending, len(self.shard_sources[k]), cursor, emitted,
                        missing)
        if not pending:
            st.unsaved.extend(kernel.close_input())
        mine = {((b.task.call.id, path), gen) for b in self._batches.values()
                for path, gen in b.task.tags}
        orphans = [(g, gen) for g, gen in in_flight.items() if (g, gen) not in mine]
        rerun = self._retry(st, orphans, FAILOVER_CAUSE)
        return st, folded, rerun

    def _drop(self, k: int, reason: str) -> None:
        """Forget a shard whose lease this driver no longer holds: never touch it again."""
        if self.shards.pop(k, None) is not None:
            self.stats.shards_lost += 1
            self._log(f"driver {self.driver_id}: lost shard {k} ({reason}); "
                      "it stops touching the shard")

    @contextlib.contextmanager
    def _guard(self, k: int) -> Iterator[None]:
        """Run a write to shard ``k``; a fenced write drops the shard."""
        try:
            yield
        except LeaseLostError as exc:
            self._drop(k, str(exc))

    def _finish_shards(self) -> None:
        for k, st in list(self.shards.items()):
            if st.in_flight:
                continue
            done = st.kernel.run_completed and st.emitted == st.total
            if not (done or st.draining):
                continue
            with self._guard(k):
                self._flush(st)
                if done:
                    self.store.mark_shard_done(self.run_id, k)
                    self.stats.shards_finished += 1
                else:
                    self.stats.shards_released += 1
                    self._released_at[k] = time.monotonic()
                self.store.release_lease(self.run_id, k, self.driver_id, st.epoch)
                del self.shards[k]
                if done:
                    self._last_balance = -1e9  # look for more work at once

    # -- store outages -------------------------------------------------------------------
    def _store_outage(self, exc: StoreUnavailableError) -> None:
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            self.stats.store_outages += 1
            self._log(f"driver {self.driver_id}: {exc}; retrying with backoff, then "
                      "rebuilding its shards from the store")
        time.sleep(self._backoff)
        self._backoff = min(self._backoff * 2, 2.0)
        self.shards.clear()  # the store is the truth: re-take (same epoch if still ours), rebuild
        self._last_balance = -1e9

    def _store_back(self) -> None:
        if self._outage_since is not None:
            down = time.monotonic() - self._outage_since
            self._log(f"driver {self.driver_id}: lineage store reachable again after {down:.1f}s")
            self._outage_since = None
            self._backoff = 0.2

    # -- facts ----------------------------------------------------------------------------
    def _fold(self, st: ShardState, fact: Fact, *, save: bool = True) -> None:
        derived = st.kernel.apply(fact)
        if save:
            st.unsaved.append(fact)
        st.unsaved.extend(derived)

    def _flush(self, st: ShardState) -> None:
        if st.unsaved:
            facts, st.unsaved = st.unsaved, []
            self.store.append(self.run_id, st.shard, st.epoch, facts)

    def _flush_all(self) -> None:
        for k, st in list(self.shards.items()):
            with self._guard(k):
                self._flush(st)

    def _retry(self, st: ShardState, grains: list[tuple[GrainKey, int]], cause: str) -> int:
        """Send in-flight Grains back to ready (gen + 1) or Failed; returns how many retried."""
        if not grains:
            return 0
        self._flush(st)
        facts = st.kernel.physical_failure(grains, cause, ts=time.time())
        while facts:
            try:
                self.store.append(self.run_id, st.shard, st.epoch, facts)
                break
            except GrainSealedError:
                # An actor committed after this driver read the shard: fold that first.
                self._catch_up(st)
                facts = st.kernel.physical_failure(grains, cause, ts=time.time())
        for fact in facts:
            self._fold(st, fact, save=False)
        return sum(isinstance(f, GrainRetried) for f in facts)

    def _catch_up(self, st: ShardState) -> None:
        """Fold the shard's commits that reached the store but not this driver."""
        for stored in self.store.iter_facts(self.run_id, st.shard, st.cursor):
            st.cursor = stored.seq
            fact = stored.fact
            if isinstance(fact, GrainCommitted) and (
                st.kernel.verdict(fact) is CommitVerdict.ACCEPTED
            ):
                self._fold_commit(st, fact)

    def _fold_commit(self, st: ShardState, report: GrainCommitted) -> None:
        self._fold(st, report, save=False)
        if report.outcome == REPORT_GROUP_FAILURE and len(report.path) > 1:
            self._fold(st, barrier_fact(report), save=False)

    # -- admission, dispatch, collection -----------------------------------------------------
    def _admit(self) -> None:
        micro = self.info.micro_batch
        now = time.time()
        for st in list(self.shards.values()):
            if st.draining or not st.to_admit:
                continue
            while st.to_admit:
                room = st.kernel.admissible()
                take = min(room, micro, len(st.to_admit))
                if take < min(micro, len(st.to_admit)):
                    break
                for _ in range(take):
                    index = st.to_admit.popleft()
                    self._fold(st, SourceAdmitted(index, tuple(self.sources[index]), ts=now))
            if not st.to_admit:
                st.unsaved.extend(st.kernel.close_input())

    def _dispatch(self) -> None:
        """Fill free actor slots with ready Grains of the held shards (batches may mix shards)."""
        states = [st for st in self.shards.values() if not st.draining]
        if not states:
            return
        self._rr += 1
        states = states[self._rr % len(states):] + states[: self._rr % len(states)]
        ready = {call for st in states for call in st.kernel.ready_calls()}
        planned: list[tuple[ActorPool, Any, CallSpec, list[tuple[ShardState, Path, int]]]] = []
        now = time.time()
        for call in sorted(ready, key=self._call_rank.__getitem__):
            pool, spec = self._pool_of[call], self.call_specs[call]
            limit = pool.module.options.batch_size
            one_parent = pool.module.options.policy is Policy.PARENT_BOUND
            while (slot := pool.reserve()) is not None:
                members: list[tuple[ShardState, Path, int]] = []
                for st in states:
                    if len(members) >= limit:
                        break
                    grains = st.kernel.take_batch(call, limit - len(members))
                    for (_, path), generation in grains:
                        self._fold(st, GrainDispatched(call, path, generation, ts=now))
                        members.append((st, path, generation))
                    if grains and one_parent:
                        break
                if not members:
                    pool.unreserve(slot)
                    break
                planned.append((pool, slot, spec, members))
        if not planned:
            return
        self._flush_all()  # the store must know the dispatches before a worker commits
        for pool, slot, spec, members in planned:
            kept = [(st, path, gen) for st, path, gen in members
                    if self.shards.get(st.shard) is st]
            if not kept:
                pool.unreserve(slot)
                continue
            tags = tuple((path, gen) for _, path, gen in kept)
            rows = tuple(st.kernel.inputs_of((spec.id, path)) for st, path, _ in kept)
            batch = pool.submit(slot, BatchTask(spec, tags, rows, next(self._batch_ids)))
            touched = list({id(st): st for st, _, _ in kept}.values())
            for st in touched:
                st.in_flight += 1
            self._batches[batch.ref] = batch
            self._batch_states[batch.ref] = touched
            self.stats.batches += 1

    def _collect(self) -> None:
        refs = list(self._batches)
        done, rest = ray.wait(refs, num_returns=1, timeout=0.5)
        if done and rest:
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            done.extend(more)
        for ref in done:
            batch = self._batches.pop(ref)
            for st in self._batch_states.pop(ref, []):
                st.in_flight -= 1
            self._settle(self._pool_of[batch.task.call.id].finish(batch))

    def _enforce_timeouts(self) -> None:
        for pool in self.pools.values():
            for batch in pool.overdue():
                pool.time_out(batch)

    def _settle(self, outcome: BatchOutcome) -> None:
        task = outcome.batch.task
        call = task.call.id
        if outcome.physical_failure is not None or outcome.result is None:
            self._physical_failure(call, task.tags, outcome.physical_failure or "batch lost")
            return
        result = outcome.result
        if result.verdicts is None:  # the in-process memory store: commit here
            verdicts = [int(v) for v in self.store.commit(self.run_id, result.reports)]
        else:
            verdicts = list(result.verdicts)
        unexplained: dict[int, list[tuple[GrainKey, int]]] = {}
        for report, code in zip(result.reports, verdicts, strict=True):
            st = self.shards.get(self.info.shard_of(report.path[0]))
            if st is None:
                continue  # not ours (any more): the store has the commit, its holder folds it
            expected = st.kernel.verdict(report) is CommitVerdict.ACCEPTED
            if code == CommitVerdict.ACCEPTED:
                if expected:
                    self._fold_commit(st, report)
            elif code != CommitVerdict.BARRED and expected:
                unexplained.setdefault(st.shard, []).append(
                    ((report.call, report.path), report.generation))
        for k, grains in unexplained.items():
            st = self.shards[k]
            with self._guard(k):
                self._catch_up(st)
                self._retry(st, grains, "the lineage store rejected the report")

    def _physical_failure(self, call: CallId, tags: tuple[tuple[Path, int], ...],
                          cause: str) -> None:
        by_shard: dict[int, list[tuple[GrainKey, int]]] = {}
        for path, gen in tags:
            by_shard.setdefault(self.info.shard_of(path[0]), []).append(((call, path), gen))
        for k, grains in by_shard.items():
            st = self.shards.get(k)
            if st is not None:
                with self._guard(k):
                    self._retry(st, grains, cause)

    # -- outputs --------------------------------------------------------------------------
    def _emit(self) -> Iterator[tuple[int, Any]]:
        for k, st in list(self.shards.items()):
            completed = st.kernel.pop_completed()
            if not completed:
                continue
            now = time.time()
            results = []
            emitted: list[tuple[int, Any]] = []
            with self._guard(k):
                for index, items in completed:
                    value = item_result(index, items, self.plan.output_names)
                    if self.sink is not None:
                        self.sink.write(index, value)  # idempotent: same file, same bytes
                    outcome = value.outcome.value if isinstance(value, FailedResult) else "present"
                    self._fold(st, OutputEmitted(index, outcome, ts=now))
                    results.append((index, value))
                self._flush(st)  # fenced: a deposed driver's OutputEmitted never lands
                st.emitted += len(results)
                self.stats.outputs_emitted += len(results)
                emitted = results
            yield from emitted


__all__ = ["FAILOVER_CAUSE", "ReplicaDriver"]
