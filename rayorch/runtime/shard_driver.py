"""The one driver: a shard-aware loop that performs the shard machines' instructions.

Every way of running a pipeline is this loop (docs/ARCHITECTURE.md, "One driver"):

* ``Pipeline.run`` — the driver holds *every* shard of its run (``LeaseMode.HOLD_ALL``)
  and its sink is the caller's iterator; losing a lease stops it with a clear error.
* ``rayorch driver`` / ``rayorch resume`` / ``join_run`` — the same driver sharing the
  shards with other drivers (``LeaseMode.SHARE``: balance, take over, drain), with a
  file sink (or the caller's iterator for ``join_run`` without one).

Each held shard is a :class:`~rayorch.core.machine.ShardMachine`. One turn of the loop:
leases → admit → dispatch → deliver → finish shards → collect batches → write facts.
Recovery has one shape: when the store and a machine disagree (a sealed Grain, a
rejected report, a store outage), the shard is rebuilt from the store.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import ray

from rayorch.actors.pool import ActorPool, BatchOutcome, InFlightBatch
from rayorch.actors.worker import BatchTask
from rayorch.core.errors import NoProgressError, RayorchError
from rayorch.core.facts import (
    GrainCommitted,
    OutputEmitted,
)
from rayorch.core.ids import CallId, Path
from rayorch.core.machine import (
    BatchCommitted,
    BatchFailed,
    FactsStored,
    InputClosed,
    Instruction,
    OutputDelivered,
    OutputReady,
    Resync,
    SendBatch,
    ShardMachine,
    SlotFree,
    SourcesArrived,
    WriteFacts,
)
from rayorch.core.plan import CallSpec, Plan, Policy
from rayorch.core.reuse import Reuse
from rayorch.core.run_view import fold_shard
from rayorch.core.vocabulary import FAILOVER_CAUSE, REPORT_PRESENT, CommitVerdict
from rayorch.progress import RunStats, make_progress
from rayorch.runtime.delivery import CallerSink, Feed
from rayorch.runtime.replica_state import ReplicaStats, ShardState
from rayorch.runtime.shard_leases import (
    DriverConfig,
    LeaseLostStop,
    LeaseMode,
    LeaseSide,
    UnstorableValueError,
    log_to_stderr,
)
from rayorch.runtime.stall_watch import StallWatch
from rayorch.store.base import LineageStore, RunInfo
from rayorch.store.errors import (
    FencedError,
    GrainSealedError,
    LeaseLostError,
    StoreUnavailableError,
)

IDLE_SLEEP_S = 0.05
COLLECT_WAIT_S = 0.5


class ShardDriver(LeaseSide):
    """Drives the shards of one run on Ray; iterate :meth:`results` to run it."""

    def __init__(self, *, store: LineageStore, run_id: str, info: RunInfo, plan: Plan,
                 driver_id: str, pools: dict[str, ActorPool], call_module: dict[CallId, str],
                 feed: Feed, sink: Any, config: DriverConfig,
                 on_close: Callable[[bool], None] | None = None,
                 wait: Callable[..., tuple[list[Any], list[Any]]] = ray.wait,
                 reuse: Reuse | None = None) -> None:
        self.store, self.run_id, self.info, self.plan = store, run_id, info, plan
        self.driver_id = driver_id
        self.pools = pools
        self._pool_of = {call: pools[module] for call, module in call_module.items()}
        self.feed, self.sink, self.config = feed, sink, config
        self._log = config.log
        self._on_close = on_close
        self._wait = wait  # ray.wait; an in-process harness passes its own
        self.reuse = reuse  # every shard's machine gets it (core/reuse.py)
        self.call_specs: dict[CallId, CallSpec] = {}
        for node in plan.calls:
            assert node.call is not None
            self.call_specs[node.call.id] = node.call
        # Downstream Calls first: finishing parents frees memory and yields results sooner.
        self._call_rank = {call: -i for i, call in enumerate(self.call_specs)}
        self.shards: dict[int, ShardState] = {}
        self.counters = ReplicaStats(driver_id)
        self.stats = RunStats(run_id, sources_total=feed.total)
        for call in self.call_specs:
            self.stats.call(call)
        self._batches: dict[Any, InFlightBatch] = {}
        self._batch_shards: dict[Any, list[ShardState]] = {}
        self._batch_ids = itertools.count()
        self._held: tuple[int, OutputReady] | None = None  # handed to the caller, not acked
        # Outputs the caller has whose OutputEmitted is not known to be written (a store
        # outage hit the write): a shard rebuilt meanwhile records them, never re-delivers.
        self._acked: dict[int, OutputDelivered] = {}
        self._last_balance = -1e9
        self._seen_free: set[int] = set()
        self._released_at: dict[int, float] = {}
        self._outage_since: float | None = None
        self._backoff = 0.2
        self._rr = 0
        self._run_done = False
        self._closed = False
        self._moved = False
        self._progress = make_progress(config.progress)
        self._stalls = StallWatch(self._log)  # a batch running far too long is said
        self._seen_seq: dict[int, int] = {}  # per shard, the last fact seq it knows of

    @property
    def disagreements(self) -> int:
        """Reports the store accepted after a barrier this driver had folded (see machine)."""
        return sum(st.machine.disagreements for st in self.shards.values())

    # == the loop ===========================================================================
    def results(self) -> Generator[tuple[int, Any], None, None]:
        """Run until the run's shards are done; yield what the caller sink delivers."""
        if self._progress is not None:
            self._progress.start()
        try:
            if self.config.mode is LeaseMode.HOLD_ALL:
                self._take_all()
            while not self._run_done:
                try:
                    self._moved = False
                    self._leases()
                    if self._run_done:
                        break
                    self._admit()
                    self._dispatch()
                    yield from self._deliver()
                    self._finish_shards()
                    if self._batches or self._actors_starting():
                        self._collect()
                        self._enforce_timeouts()
                    elif self.config.mode is LeaseMode.SHARE:
                        self.config.sleep(IDLE_SLEEP_S if self.shards
                                          else self.config.lease_ttl_s / 8)
                    elif not self._moved:
                        self._stuck()
                    self._flush_all()
                    self._store_back()
                    self._show()
                except StoreUnavailableError as exc:
                    self._store_outage(exc)
        finally:
            self._stop_progress()

    def acknowledge_held(self) -> None:
        """The caller closed the iterator normally: the output it holds is delivered."""
        if self._held is not None and not self._closed:
            with contextlib.suppress(RayorchError, StoreUnavailableError):
                self._acknowledge()

    def close(self) -> None:
        """Leave the run: write what is queued, release the leases, stop or leave the pools."""
        if self._closed:
            return
        self._closed = True
        self._stop_progress()
        for k, st in list(self.shards.items()):
            with contextlib.suppress(Exception):  # a lease expires by itself anyway
                self._flush(st)
                self.store.release_lease(self.run_id, k, self.driver_id, st.epoch)
        self.shards.clear()
        if self._on_close is not None:
            self._on_close(self._run_done)

    def _forget_outputs(self, k: int) -> None:
        if isinstance(self.sink, CallerSink):
            self.sink.drop_shard(k)

    # == take-over and rebuild ================================================================
    def _take(self, k: int, epoch: int, failed: Sequence[BatchFailed] = ()) -> None:
        """Rebuild shard ``k`` from the store and hold it with ``epoch``.

        Grains the store shows in flight that none of this driver's live batches carry
        are sent back to ready (their driver died), after ``failed`` (this driver's own
        failed batches whose facts did not land) is applied with its real cause.
        """
        started = time.monotonic()
        machine = ShardMachine(self.plan, max_active_sources=self.config.max_active_sources,
                               total_sources=self.feed.shard_total(k), keep_history=False,
                               reuse=self.reuse)
        stored = list(self.store.iter_facts(self.run_id, k))
        facts = [s.fact for s in stored]
        view = fold_shard(k, ((s.seq, s.fact) for s in stored))
        self._seen(k, view.last_seq)
        st = ShardState(k, epoch, machine, emitted=len(view.emitted))
        self.shards[k] = st
        self.feed.reset(k, set(view.admitted))
        self._perform(st, machine.handle(FactsStored(tuple(facts))))
        if self.feed.exhausted(k):
            self._perform(st, machine.handle(InputClosed()))
            st.input_closed = True
        for event in failed:
            self._perform(st, machine.handle(event))
        mine = {(b.task.call.id, path, gen) for b in self._batches.values()
                for path, gen in b.task.tags}
        orphans: dict[CallId, list[tuple[Path, int]]] = {}
        for grain in sorted(view.grains.values(), key=lambda g: g.last_dispatch):
            gen = grain.in_flight
            if gen is not None and (grain.call, grain.path, gen) not in mine:
                orphans.setdefault(grain.call, []).append((grain.path, gen))
        now = time.time()
        rerun = sum(len(tags) for tags in orphans.values())
        self._perform(st, machine.handle(*(BatchFailed(call, tuple(tags), FAILOVER_CAUSE, now)
                                           for call, tags in orphans.items())))
        self._flush(st)
        took = time.monotonic() - started
        self.counters.shards_taken += 1
        self.counters.grains_rerun += rerun
        self.counters.take_seconds.append(took)
        if facts and (self.config.mode is LeaseMode.SHARE or rerun):
            self._log(f"driver {self.driver_id}: took shard {k} (epoch {epoch}): {len(facts)} "
                      f"facts folded, {rerun} in-flight grains re-dispatched, in {took:.2f}s")

    def _resync(self, k: int, reason: str, failed: Sequence[BatchFailed] = ()) -> None:
        """The store knows better than shard ``k``'s machine: rebuild it, same lease."""
        st = self.shards.get(k)
        if st is None:
            return
        self.counters.resyncs += 1
        with self._guard(k):
            self._take(k, st.epoch, failed)

    # == performing instructions ================================================================
    def _perform(self, st: ShardState, instructions: list[Instruction]) -> list[SendBatch]:
        """Queue facts, hand outputs to the sink; the batches to send are returned."""
        sends: list[SendBatch] = []
        for ins in instructions:
            if isinstance(ins, WriteFacts):
                st.unsaved.extend(ins.facts)
            elif isinstance(ins, SendBatch):
                sends.append(ins)
            elif isinstance(ins, OutputReady):
                st.ready.append(ins)
            elif isinstance(ins, Resync):
                st.resync = ins.reason
        return sends

    def _flush(self, st: ShardState) -> None:
        """Append the shard's queued facts (fenced); a sealed Grain means: rebuild."""
        if not st.unsaved:
            return
        facts, st.unsaved = st.unsaved, []
        try:
            seqs = self.store.append(self.run_id, st.shard, st.epoch, facts,
                                     driver=self.driver_id)
        except TypeError as exc:
            raise UnstorableValueError(
                f"a fact could not be written to the lineage store: {exc}. Source items "
                "(and, with a durable store, module outputs) must be msgpack-able values; "
                "convert sets and custom objects to lists, dicts or tuples") from exc
        self.feed.confirm(st.shard)
        self._seen_seq[st.shard] = max(self._seen_seq.get(st.shard, 0), *seqs)
        if self._acked:
            for fact in facts:
                if isinstance(fact, OutputEmitted):
                    self._acked.pop(fact.index, None)

    def _flush_all(self) -> None:
        for k, st in list(self.shards.items()):
            with self._guard(k):
                try:
                    self._flush(st)
                except GrainSealedError as exc:
                    self._resync(k, str(exc))
            if st.resync is not None and self.shards.get(k) is st:
                reason, st.resync = st.resync, None
                self._resync(k, reason)

    # == admission and dispatch ==================================================================
    def _admit(self) -> None:
        micro = self.config.micro_batch
        progress = True
        now = time.time()
        while progress:
            progress = False
            for k in sorted(self.shards):
                st = self.shards[k]
                if st.draining or st.input_closed:
                    continue
                room = st.machine.room()
                rows = self.feed.take(k, min(room, micro)) if room >= 1 else []
                if rows:
                    progress = self._moved = True
                    self.stats.sources_admitted += len(rows)
                    self._perform(st, st.machine.handle(SourcesArrived(tuple(rows), now)))
                if self.feed.exhausted(k):
                    st.input_closed = True
                    self._perform(st, st.machine.handle(InputClosed()))

    def _dispatch(self) -> None:
        """Fill free actor slots with ready Grains of the held shards (batches may mix shards)."""
        states = [st for st in self.shards.values() if not st.draining]
        if not states:
            return
        self._rr += 1
        states = states[self._rr % len(states):] + states[: self._rr % len(states)]
        ready = {call for st in states for call in st.machine.ready_calls()}
        planned: list[tuple[ActorPool, Any, CallSpec, list[tuple[ShardState, SendBatch]]]] = []
        now = time.time()
        for call in sorted(ready, key=self._call_rank.__getitem__):
            pool, spec = self._pool_of[call], self.call_specs[call]
            limit = pool.module.options.batch_size
            one_parent = pool.module.options.policy is Policy.PARENT_BOUND
            while (slot := pool.reserve()) is not None:
                parts: list[tuple[ShardState, SendBatch]] = []
                room = limit
                for st in states:
                    if room <= 0:
                        break
                    for send in self._perform(st, st.machine.handle(SlotFree(call, room, now))):
                        parts.append((st, send))
                        room -= len(send.tags)
                    if parts and one_parent:
                        break
                if not parts:
                    pool.unreserve(slot)
                    break
                planned.append((pool, slot, spec, parts))
        if not planned:
            return
        self._moved = True
        try:
            self._flush_all()  # the store must know the dispatches before a worker commits
        except BaseException:
            # Nothing was sent: give the slots back (a store outage rebuilds the shards,
            # so the Grains are dispatched again, or retried, from what the store holds).
            for pool, slot, _, _ in planned:
                pool.unreserve(slot)
            raise
        for pool, slot, spec, parts in planned:
            kept = [(st, send) for st, send in parts if self.shards.get(st.shard) is st]
            if not kept:
                pool.unreserve(slot)
                continue
            tags = tuple(tag for _, send in kept for tag in send.tags)
            rows = tuple(row for _, send in kept for row in send.rows)
            task = BatchTask(spec, tags, rows, next(self._batch_ids), self.run_id)
            batch = pool.submit(slot, task)
            touched = list({id(st): st for st, _ in kept}.values())
            for st in touched:
                st.in_flight += 1
            self._batches[batch.ref] = batch
            self._batch_shards[batch.ref] = touched
            self.stats.batches += 1
            self.counters.batches += 1
            self.stats.call(spec.id).in_flight += len(tags)

    # == collection ==============================================================================
    def _wait_timeout(self) -> float:
        timeout = COLLECT_WAIT_S
        now = time.monotonic()
        for pool in self.pools.values():
            limit = pool.module.options.timeout_s
            if limit is None:
                continue
            for slot in pool.slots:
                if slot.queue and slot.queue[0].started is not None:
                    timeout = min(timeout, slot.queue[0].started + limit - now)
        return max(timeout, 0.01)

    def _actors_starting(self) -> list[Any]:
        """The start-up answers of actors still starting."""
        return [ref for pool in self.pools.values() for ref in pool.starting()]

    def _collect(self) -> None:
        """Wait for a batch to finish or an actor to come up; settle the batches that did
        (the actors that came up are noted by :meth:`_enforce_timeouts`, called next)."""
        refs = [*self._batches, *self._actors_starting()]
        done, rest = self._wait(refs, num_returns=1, timeout=self._wait_timeout())
        if done and rest:
            more, _ = self._wait(rest, num_returns=len(rest), timeout=0)
            done.extend(more)
        for ref in done:
            batch = self._batches.pop(ref, None)
            if batch is None:  # an actor's start-up answer
                continue
            self._stalls.finished((pool := self._pool_of[batch.task.call.id]).module.name, batch)
            for st in self._batch_shards.pop(ref, []):
                st.in_flight -= 1
            self._settle(pool.finish(batch))

    def _enforce_timeouts(self) -> None:
        for pool in self.pools.values():
            pool.check_started()
            for batch in pool.overdue():
                pool.time_out(batch)
        self._stalls.check(self.pools.values(), time.monotonic())

    def _settle(self, outcome: BatchOutcome) -> None:
        task = outcome.batch.task
        call = task.call.id
        self.stats.call(call).in_flight -= len(task.tags)
        if outcome.physical_failure is not None or outcome.result is None:
            self._batch_failed(call, task.tags, outcome.physical_failure or "batch lost")
            return
        result = outcome.result
        if result.verdicts is None:  # the in-process memory store: commit here
            verdicts = [int(v) for v in self.store.commit(self.run_id, result.reports)]
        else:
            verdicts = list(result.verdicts)
        by_shard: dict[int, tuple[list[GrainCommitted], list[int]]] = {}
        for report, code in zip(result.reports, verdicts, strict=True):
            reports, codes = by_shard.setdefault(self.info.shard_of(report.path[0]), ([], []))
            reports.append(report)
            codes.append(code)
        call_stats = self.stats.call(call)
        now = time.monotonic()
        for k, (reports, codes) in by_shard.items():
            st = self.shards.get(k)
            if st is None:
                continue  # not ours (any more): the store has the commit, its holder folds it
            accepted = [r.outcome for r, c in zip(reports, codes) if c == CommitVerdict.ACCEPTED]
            present = accepted.count(REPORT_PRESENT)
            call_stats.record_done(present, now)
            call_stats.failed += len(accepted) - present
            call_stats.rejected += len(codes) - len(accepted)
            self._perform(st, st.machine.handle(BatchCommitted(tuple(reports), tuple(codes))))

    def _batch_failed(self, call: CallId, tags: Sequence[tuple[Path, int]], cause: str) -> None:
        by_shard: dict[int, list[tuple[Path, int]]] = {}
        for path, gen in tags:
            by_shard.setdefault(self.info.shard_of(path[0]), []).append((path, gen))
        now = time.time()
        for k, shard_tags in by_shard.items():
            st = self.shards.get(k)
            if st is None:
                continue
            event = BatchFailed(call, tuple(shard_tags), cause, now)
            with self._guard(k):
                self._flush(st)
                self._perform(st, st.machine.handle(event))
                try:
                    self._flush(st)
                except GrainSealedError as exc:
                    # An actor committed to the store and died before it could tell us.
                    self._resync(k, str(exc), failed=[event])
                    continue
            stats = self.stats.call(call)
            stats.retried += len(shard_tags)

    # == delivery ================================================================================
    def _deliver(self) -> Iterator[tuple[int, Any]]:
        if isinstance(self.sink, CallerSink):
            yield from self._deliver_to_caller(self.sink)
            return
        for k, st in list(self.shards.items()):
            if not st.ready:
                continue
            ready, st.ready = st.ready, []
            self._moved = True
            delivered: list[OutputReady] = []
            with self._guard(k):
                self._flush(st)
                facts = []
                todo = ready
                if st.on_disk is None:  # parts of a dead holder or of a rolled-back store
                    st.on_disk = self.sink.parts_by_index(k)
                if hits := [r.index for r in ready if r.index in st.on_disk]:
                    parts = set().union(*(st.on_disk.pop(i) for i in hits))
                    facts = self.sink.adopt(k, hits, among=parts)
                    adopted = {f.index for f in facts}
                    todo = [r for r in ready if r.index not in adopted]
                if todo:
                    facts += self.sink.write_part(k, [(r.index, r.value) for r in todo])
                events = [OutputDelivered(f.index, f.outcome, f.sink, f.digest, f.ts)
                          for f in facts]
                self._perform(st, st.machine.handle(*events))
                try:
                    self._flush(st)  # fenced: a deposed driver's OutputEmitted never lands
                except (LeaseLostError, FencedError):
                    self.sink.discard(facts)
                    raise
                self._delivered(st, len(facts))
                delivered = ready
            for r in delivered:  # for a ReplicaHandle's caller: what this driver delivered
                yield r.index, r.value

    def _deliver_to_caller(self, sink: CallerSink) -> Iterator[tuple[int, Any]]:
        for k, st in self.shards.items():
            for ready in st.ready:
                acked = self._acked.get(ready.index)
                if acked is None:
                    sink.offer(k, ready)
                else:  # the caller has it already: only its fact is missing
                    self._perform(st, st.machine.handle(acked))
                    self._delivered(st, 1)
            st.ready = []
        for k, ready in sink.take():
            if k not in self.shards:
                continue
            self._moved = True
            self._ensure_lease(k)  # a driver that was asleep past its TTL never emits
            self._held = (k, ready)
            yield ready.index, ready.value
            self._acknowledge()  # the caller asked for the next item: it has this one

    def _ensure_lease(self, k: int) -> None:
        st = self.shards[k]
        if time.monotonic() - st.renewed > self.config.lease_ttl_s / 3:
            self._renew(k)
            if k not in self.shards:
                raise LeaseLostStop(f"lease lost: run {self.run_id} shard {k}")

    def _acknowledge(self) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        k, ready = held
        st = self.shards.get(k)
        if st is None:
            return
        event = OutputDelivered(ready.index, ready.outcome, "caller", "", time.time())
        self._acked[ready.index] = event  # until its fact is written
        with self._guard(k):
            self._perform(st, st.machine.handle(event))
            self._flush(st)  # at most the one held output is delivered twice after a crash
            self._delivered(st, 1)

    def _delivered(self, st: ShardState, count: int) -> None:
        st.emitted += count
        self.counters.outputs_emitted += count
        self.stats.sources_done += count

    # == finishing ===============================================================================
    def _finish_shards(self) -> None:
        for k, st in list(self.shards.items()):
            if st.in_flight or st.ready or st.machine.kernel.outputs_held:
                continue  # an output not yet delivered keeps its shard
            done = st.machine.run_completed
            if not (done or st.draining):
                continue
            self._moved = True
            with self._guard(k):
                self._flush(st)
                if done:
                    self.store.mark_shard_done(self.run_id, k)
                    self.counters.shards_finished += 1
                else:
                    self.counters.shards_released += 1
                    self._released_at[k] = time.monotonic()
                self.store.release_lease(self.run_id, k, self.driver_id, st.epoch)
                del self.shards[k]
                self._last_balance = -1e9  # look for more work (or the end) at once

    def _stuck(self) -> None:
        """Nothing in flight and nothing moved this turn: a stuck run is a bug, said so."""
        self._flush_all()
        for st in self.shards.values():
            st.machine.kernel.check_progress()  # names the stuck Grains when it can
        raise NoProgressError(
            "the run cannot progress: nothing is in flight, nothing is ready and no source "
            "can be admitted; this is a bug in rayorch, please report it with the run id "
            f"{self.run_id}")

    # == progress ================================================================================
    def _show(self) -> None:
        if self._progress is None:
            return
        for call_id, stats in self.stats.calls.items():
            stats.ready = sum(st.machine.kernel.ready_count(call_id)
                              for st in self.shards.values())
            stats.suppressed = sum(st.machine.kernel.suppressed_count(call_id)
                                   for st in self.shards.values())
        self.stats.actors_replaced = sum(p.replaced for p in self.pools.values())
        self._progress.update(self.stats)

    def _stop_progress(self) -> None:
        if self._progress is not None:
            progress, self._progress = self._progress, None
            progress.stop(self.stats)


__all__ = ["FAILOVER_CAUSE", "DriverConfig", "LeaseLostStop", "LeaseMode", "ShardDriver",
           "UnstorableValueError", "log_to_stderr"]
