"""The one driver shell: a shard-aware loop that performs the shard machines' instructions.

It hands each instruction to a port and feeds each port's completion back to the machine
as an event (:mod:`rayorch.runtime.ports`): facts to the fact log (the store, fenced),
batches to the pools, finished sources to the sink. Every way of running a pipeline is
this loop with other ports (docs/ARCHITECTURE.md, "One driver"):

* ``Pipeline.run`` — the driver holds *every* shard of its run (``LeaseMode.HOLD_ALL``)
  and its sink is the caller's iterator; losing a lease stops it with a clear error.
* ``rayorch driver`` / ``rayorch resume`` / ``join_run`` — the same driver sharing the
  shards with other drivers (``LeaseMode.SHARE``: balance, take over, drain), with a
  file sink (or the caller's iterator for ``join_run`` without one);
* the in-process executor of the property tests (:mod:`rayorch.runtime.in_process`) and
  the simulator (``bench/simulator``): in-process or virtual-clock pools, a memory store.

Each held shard is a :class:`~rayorch.core.machine.ShardMachine`. One turn of the loop:
leases → admit → dispatch → deliver → finish shards → collect batches → write facts.
Delivery, to the caller or through the delivery writer to a file sink, is
:class:`~rayorch.runtime.shard_delivery.ShardDelivery`'s; the leases are
:class:`~rayorch.runtime.shard_leases.ShardLeases`'.
Recovery has one shape: when the store and a machine disagree (a sealed Grain, a
rejected report, a store outage, a restart), the shard is rebuilt from the store.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import Any

from rayorch.core.facts import GrainCommitted, GrainRetried, OutputEmitted
from rayorch.core.ids import CallId, Path
from rayorch.core.machine import (
    BatchCommitted,
    BatchFailed,
    FactsStored,
    InputClosed,
    Instruction,
    MachineLoad,
    OutputReady,
    Resync,
    SendBatch,
    ShardMachine,
    SlotFree,
    SourcesArrived,
    TakenOver,
    WantSources,
    WriteFacts,
)
from rayorch.core.plan import CallSpec, Plan
from rayorch.core.reuse import Reuse
from rayorch.core.vocabulary import FAILOVER_CAUSE, REPORT_PRESENT, CommitVerdict
from rayorch.progress import RunStats
from rayorch.runtime.delivery import CallerSink, Feed
from rayorch.runtime.pool_sizer import PoolSizer
from rayorch.runtime.ports import Completion, Pools, Sink
from rayorch.runtime.replica_state import HeldShards, ReplicaStats, ShardState
from rayorch.runtime.run_watch import RunWatch
from rayorch.runtime.shard_delivery import ShardDelivery
from rayorch.runtime.shard_leases import (
    DriverConfig,
    LeaseLostStop,
    LeaseMode,
    ShardLeases,
    UnstorableValueError,
    log_to_stderr,
)
from rayorch.store.base import LineageStore, RunInfo
from rayorch.store.errors import GrainSealedError, StoreUnavailableError

IDLE_SLEEP_S = 0.05


class ShardDriver:
    """Drives the shards of one run through its ports; iterate :meth:`results` to run it.

    ``pools`` is the pools port, ``sink`` a :class:`~rayorch.runtime.ports.Sink` or the
    caller's :class:`CallerSink`; ``on_turn`` (the in-process executor's faults) runs after
    every turn of the loop.
    """

    def __init__(self, *, store: LineageStore, run_id: str, info: RunInfo, plan: Plan,
                 driver_id: str, pools: Pools, feed: Feed, sink: Sink | CallerSink,
                 config: DriverConfig, on_close: Callable[[bool], None] | None = None,
                 on_turn: Callable[[], None] | None = None, reuse: Reuse | None = None) -> None:
        self.store, self.run_id, self.info, self.plan = store, run_id, info, plan
        self.driver_id = driver_id
        self.pools = pools
        self.feed, self.config = feed, config
        self._log = config.log
        self._now = config.clock  # fact timestamps
        self._on_close = on_close
        self._on_turn = on_turn
        self.reuse = reuse  # every shard's machine gets it (core/reuse.py)
        self.call_specs: dict[CallId, CallSpec] = {}
        for node in plan.calls:
            assert node.call is not None
            self.call_specs[node.call.id] = node.call
        # Downstream Calls first: finishing parents frees memory and yields results sooner.
        self._call_rank = {call: -i for i, call in enumerate(self.call_specs)}
        self.shards = HeldShards()  # shared with self.leases (runtime/replica_state.py)
        self.finished: dict[int, ShardState] = {}  # with config.keep_finished only
        self.counters = ReplicaStats(driver_id)
        self.stats = RunStats(run_id, sources_total=feed.total)
        for call in self.call_specs:
            self.stats.call(call)
        # Batches in flight: handle -> (Call, tags, sent alone). What a shard has in flight is
        # its machine's (a take-over re-dispatches what none of these carries).
        self._batches: dict[int, tuple[CallId, tuple[tuple[Path, int], ...], bool]] = {}
        self._done: deque[Completion] = deque()  # collected from the pools, not yet settled
        self.leases = ShardLeases(self, store=store, run_id=run_id, info=info,
                                  driver_id=driver_id, config=config, counters=self.counters)
        self._guard = self.leases.guard  # a write to one shard: losing it drops the shard
        self.watch = RunWatch(stats=self.stats, pools=pools, store=store, run_id=run_id,
                              driver_id=driver_id, config=config, loads=self._loads,
                              clock=self._now,
                              modules={c: s.module for c, s in self.call_specs.items()})
        self.sizer: PoolSizer | None = None  # pools that size themselves (runtime/pool_sizer.py)
        if config.sizing is not None and any(m.options.sizes_itself for m in plan.modules):
            self.sizer = PoolSizer(plan, pools, config.sizing, clock=self._now, log=self._log,
                                   budget=config.pool_budget, driver=driver_id,
                                   record=self.watch.record_pools, ledger=config.ledger)
        self._rr = 0
        self._closed = False
        self._moved = False
        self.delivery = ShardDelivery(sink, lanes=config.delivery_lanes, shards=self.shards,
                                      leases=self.leases, store=store, run_id=run_id,
                                      clock=self._now, counters=self.counters, stats=self.stats,
                                      perform=self._perform, flush=self._flush)

    @property
    def disagreements(self) -> int:
        """Reports the store accepted after a barrier this driver had folded (see machine)."""
        return sum(st.machine.disagreements for st in self.shards.values())

    # == the loop ===========================================================================
    def results(self) -> Generator[tuple[int, Any], None, None]:
        """Run until the run's shards are done; yield what the caller sink delivers."""
        self.watch.start()
        try:
            if self.config.mode is LeaseMode.HOLD_ALL:
                self.leases.take_all()
            while not self.leases.run_done:
                try:
                    self._moved = self.delivery.moved = False
                    self.leases.tick()
                    if self.leases.run_done:
                        break
                    self._admit()
                    self._dispatch()
                    yield from self.delivery.deliver()
                    self._finish_shards()
                    if self._done or self.pools.busy():
                        self._collect()
                    elif self.delivery.pending():  # the loop waits on writes
                        yield from self.delivery.record(IDLE_SLEEP_S)
                    elif self.config.mode is LeaseMode.SHARE:
                        self.config.sleep(IDLE_SLEEP_S if self.shards
                                          else self.config.lease_ttl_s / 8)
                    elif not (self._moved or self.delivery.moved):
                        self._flush_all()
                        self.shards.stuck(self.run_id)  # a stuck run is a bug, said so
                    if self.sizer is not None:
                        self.sizer.tick(self._loads)
                    self._flush_all()
                    self.leases.store_back()
                    self.watch.show()
                    if self._on_turn is not None:
                        self._on_turn()
                except StoreUnavailableError as exc:
                    self.leases.outage(exc)
        finally:
            self.watch.stop()

    def acknowledge_held(self) -> None:
        """The caller closed the iterator normally: the output it holds is delivered."""
        if not self._closed:
            self.delivery.acknowledge_held()

    def close(self) -> None:
        """Leave the run: write what is queued, release the leases, stop or leave the pools."""
        if self._closed:
            return
        self._closed = True
        self.watch.close()
        self.delivery.close()
        if self.sizer is not None and self.sizer.decisions:
            self._log(f"rayorch: {self.sizer.summary()}")
        for k, st in list(self.shards.items()):
            with contextlib.suppress(Exception):  # a lease expires by itself anyway
                self._flush(st)
                self.store.release_lease(self.run_id, k, self.driver_id, st.epoch)
        self.shards.clear()
        self.store.wait_archived()  # finished shards leave the store before the driver does
        if self._on_close is not None:
            self._on_close(self.leases.run_done)

    # == the host side of the leases (runtime/shard_leases.py ShardHost) ====================
    def forget_outputs(self, k: int) -> None:
        self.delivery.forget(k)

    # == take-over and rebuild ================================================================
    def take(self, k: int, epoch: int, failed: Sequence[BatchFailed] = ()) -> None:
        """Rebuild shard ``k`` from the store and hold it with ``epoch``.

        The machine sends back to ready the Grains in flight that none of this driver's live
        batches carry (their driver died: ``TakenOver``), after ``failed`` (this driver's own
        failed batches whose facts did not land) is applied with its real cause.
        """
        started = time.monotonic()
        machine = ShardMachine(self.plan, max_active_sources=self.config.max_active_sources,
                               total_sources=self.feed.shard_total(k),
                               keep_history=self.config.keep_history, reuse=self.reuse,
                               micro_batch=self.config.micro_batch)
        stored = list(self.store.iter_facts(self.run_id, k))
        facts = tuple(s.fact for s in stored)
        last_seq = stored[-1].seq if stored else 0
        self.leases.seen(k, last_seq)
        st = ShardState(k, epoch, machine, read_seq=last_seq)
        self.shards[k] = st
        self.delivery.reset(k)  # parts of a dead holder or a rolled-back store: read again
        self._perform(st, machine.handle(FactsStored(facts)))
        self.feed.reset(k, machine.kernel.admitted_sources())
        self._close_input(st)
        for event in failed:
            self._perform(st, machine.handle(event))
        live = frozenset((call, path, gen) for call, tags, _ in self._batches.values()
                         for path, gen in tags)
        self._perform(st, machine.handle(TakenOver(live, FAILOVER_CAUSE, self._now())))
        rerun = machine.rerun
        self._flush(st)
        took = time.monotonic() - started
        self.counters.shards_taken += 1
        self.counters.grains_rerun += rerun
        self.counters.take_seconds.append(took)
        if facts and (self.config.mode is LeaseMode.SHARE or rerun):
            self._log(f"driver {self.driver_id}: took shard {k} (epoch {epoch}): {len(facts)} "
                      f"facts folded, {rerun} in-flight grains re-dispatched, in {took:.2f}s")

    def rebuild(self, k: int) -> None:
        """Throw shard ``k``'s machine away and rebuild it from the store (a restart)."""
        st = self.shards[k]
        with self._guard(k):
            self.take(k, st.epoch)

    def resync(self, k: int, reason: str, failed: Sequence[BatchFailed] = ()) -> None:
        """The store knows better than shard ``k``'s machine: rebuild it, same lease."""
        st = self.shards.get(k)
        if st is None:
            return
        self.counters.resyncs += 1
        with self._guard(k):
            self.leases.take_settled(k, st.epoch, failed)

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
            elif isinstance(ins, WantSources):
                st.wanted = ins.limit
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
                                     driver=self.driver_id, basis=st.basis())
        except TypeError as exc:
            raise UnstorableValueError(
                f"a fact could not be written to the lineage store: {exc}. Source items "
                "(and, with a durable store, module outputs) must be msgpack-able values; "
                "convert sets and custom objects to lists, dicts or tuples") from exc
        st.appended(seqs)
        self.shards.appended(st.shard, seqs)
        emitted = [fact.index for fact in facts if isinstance(fact, OutputEmitted)]
        if emitted:
            self.feed.delivered(st.shard, emitted)
            self.delivery.recorded(emitted)

    def _flush_all(self) -> None:
        for k, st in list(self.shards.items()):
            with self._guard(k):
                try:
                    self._flush(st)
                except GrainSealedError as exc:
                    self.resync(k, str(exc))
            if st.resync is not None and self.shards.get(k) is st:
                reason, st.resync = st.resync, None
                self.resync(k, reason)

    # == admission and dispatch ==================================================================
    def _admit(self) -> None:
        """Answer the machines' asks for sources from the feed (their shards' next rows)."""
        progress = True
        now = self._now()
        while progress:
            progress = False
            for k in sorted(self.shards):
                st = self.shards[k]
                if st.draining or st.machine.input_closed or \
                        self.delivery.behind(k, len(st.ready)):
                    continue  # outputs waiting for the writer hold admission back
                rows = self.feed.take(k, st.wanted) if st.wanted else []
                if rows:
                    progress = self._moved = True
                    st.wanted = 0  # the machine asks again while it has room
                    self.stats.sources_admitted += len(rows)
                    self._perform(st, st.machine.handle(SourcesArrived(tuple(rows), now)))
                self._close_input(st)

    def _close_input(self, st: ShardState) -> None:
        if not st.machine.input_closed and self.feed.exhausted(st.shard):
            st.wanted = 0
            self._perform(st, st.machine.handle(InputClosed()))

    def _dispatch(self) -> None:
        """Fill free actor slots with ready Grains of the held shards (batches may mix shards)."""
        states = [st for st in self.shards.values() if not st.draining]
        if not states:
            return
        self._rr += 1
        states = states[self._rr % len(states):] + states[: self._rr % len(states)]
        ready = {call for st in states for call in st.machine.ready_calls()}
        planned: list[tuple[Any, CallSpec, list[tuple[ShardState, SendBatch]], bool]] = []
        now = self._now()
        pools = self.pools
        for call in sorted(ready, key=self._call_rank.__getitem__):
            if planned and planned[-1][3]:
                break  # a crash retry's actor takes nothing else: see below
            spec = self.call_specs[call]
            limit = pools.batch_limit(call)
            one_parent = pools.one_parent(call)
            while (slot := pools.reserve(call)) is not None:
                parts: list[tuple[ShardState, SendBatch]] = []
                room = limit
                # A crash retry waits for an idle actor (core/crash_split.py): offer it the
                # first idle slot, and let busy ones drain rather than fill them meanwhile.
                waiting = [st for st in states if st.machine.needs_idle(call)]
                idle = bool(waiting) and pools.idle(call, slot)
                if waiting and not idle:
                    pools.unreserve(call, slot)
                    break
                alone = False
                for st in waiting + [st for st in states if st not in waiting]:
                    if room <= 0:
                        break
                    free = SlotFree(call, room, now, idle=idle and not parts)
                    for send in self._perform(st, st.machine.handle(free)):
                        parts.append((st, send))
                        room -= len(send.tags)
                        alone = alone or send.alone
                    if parts and (one_parent or alone):
                        break
                if not parts:
                    pools.unreserve(call, slot)
                    break
                planned.append((slot, spec, parts, alone))
                if alone:  # its slot looks free until it is sent: plan nothing more now
                    break
        if not planned:
            return
        self._moved = True
        try:
            self._flush_all()  # the store must know the dispatches before a worker commits
        except BaseException:
            # Nothing was sent: give the slots back (a store outage rebuilds the shards,
            # so the Grains are dispatched again, or retried, from what the store holds).
            for slot, spec, _, _ in planned:
                pools.unreserve(spec.id, slot)
            raise
        for slot, spec, parts, alone in planned:
            kept = [(st, send) for st, send in parts if self.shards.get(st.shard) is st]
            if not kept:
                pools.unreserve(spec.id, slot)
                continue
            tags = tuple(tag for _, send in kept for tag in send.tags)
            rows = tuple(row for _, send in kept for row in send.rows)
            handle = pools.submit(slot, spec, tags, rows, alone)
            self._batches[handle] = (spec.id, tags, alone)
            self.stats.batches += 1
            self.counters.batches += 1
            self.stats.call(spec.id).in_flight += len(tags)

    # == collection ==============================================================================
    def _collect(self) -> None:
        """Wait for batches to finish (or actors to come up); settle those that did.

        Completions wait in a queue until settled: when settling one raises (a store
        outage), the others are settled on a later turn, never dropped."""
        if not self._done:
            self._done.extend(self.pools.collect())
            self.watch.record_recycled()
        while self._done:
            done = self._done.popleft()
            sent = self._batches.pop(done.handle, None)
            if sent is None:
                continue  # not sent by this driver (a warm pool's earlier run)
            self._settle(done, alone=sent[2])

    def _settle(self, done: Completion, *, alone: bool = False) -> None:
        call = done.call
        if self.sizer is not None:
            self.sizer.observe(done)
        self.stats.call(call).in_flight -= len(done.tags)
        if done.failure is not None:
            self.watch.failed(call, done.failure, len(done.tags))
            self._batch_failed(call, done.tags, done.failure, crashed=done.crashed, alone=alone)
            return
        commit_s = done.commit_s
        if done.verdicts is None:  # the worker did not commit (the memory store): here
            codes, commit_s = self.watch.timed(
                lambda: self.store.commit(self.run_id, done.reports))
            verdicts = [int(v) for v in codes]
        else:
            verdicts = list(done.verdicts)
        self.watch.batch(call, done, commit_s)
        for report in done.reports:
            if report.outcome != REPORT_PRESENT:
                self.watch.failed(call, report.cause or report.outcome)
        by_shard: dict[int, tuple[list[GrainCommitted], list[int]]] = {}
        for report, code in zip(done.reports, verdicts, strict=True):
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
            st.folded(reports, codes)  # the store must still hold them when we next append
            self._perform(st, st.machine.handle(BatchCommitted(tuple(reports), tuple(codes))))

    def _batch_failed(self, call: CallId, tags: Sequence[tuple[Path, int]], cause: str, *,
                      crashed: bool = False, alone: bool = False) -> None:
        by_shard: dict[int, list[tuple[Path, int]]] = {}
        for path, gen in tags:
            by_shard.setdefault(self.info.shard_of(path[0]), []).append((path, gen))
        now = self._now()
        for k, shard_tags in by_shard.items():
            st = self.shards.get(k)
            if st is None:
                continue
            event = BatchFailed(call, tuple(shard_tags), cause, now, crashed, alone)
            with self._guard(k):
                self._flush(st)
                self._perform(st, st.machine.handle(event))
                uncharged = sum(isinstance(f, GrainRetried) and not f.charged for f in st.unsaved)
                try:
                    self._flush(st)
                except GrainSealedError as exc:
                    # An actor committed to the store and died before it could tell us.
                    self.resync(k, str(exc), failed=[event])
                    continue
            stats = self.stats.call(call)
            stats.retried += len(shard_tags)
            stats.uncharged += uncharged

    # == finishing ===============================================================================
    def _finish_shards(self) -> None:
        for k, st in list(self.shards.items()):
            self.delivery.seal(k, st)
            if st.machine.holds_work or st.ready:
                continue  # a Grain in flight, or an output not yet delivered, keeps its shard
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
                    self.leases.released(k)
                self.store.release_lease(self.run_id, k, self.driver_id, st.epoch)
                del self.shards[k]
                if done and self.config.keep_finished:
                    self.finished[k] = st
                self.leases.look_again()  # look for more work (or the end) at once

    def _loads(self) -> list[MachineLoad]:
        """What each held shard has ready and in flight (the one stats query)."""
        return [st.machine.load() for st in self.shards.values()]


__all__ = ["FAILOVER_CAUSE", "DriverConfig", "LeaseLostStop", "LeaseMode", "ShardDriver",
           "UnstorableValueError", "log_to_stderr"]
