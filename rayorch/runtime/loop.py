"""The driver loop: admit, dispatch, collect, commit, emit (DESIGN section 8).

The pure :class:`~rayorch.core.state.Kernel` decides everything; this loop
performs its decisions on Ray and the lineage store and feeds the results back as
facts. Every fact the kernel folds is also written to the store, in fold order:
driver facts through a fenced ``append``, worker reports through the commit gate
(``store.commit``: in-process for the memory store, inside the actor otherwise).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from typing import Any

import ray

from rayorch.actors.pool import ActorPool, ActorSlot, BatchOutcome, InFlightBatch
from rayorch.actors.worker import BatchTask
from rayorch.core.commit import CommitVerdict
from rayorch.core.errors import NoProgressError, RayorchError
from rayorch.core.facts import (
    REPORT_GROUP_FAILURE,
    REPORT_PRESENT,
    Fact,
    GrainCommitted,
    GrainDispatched,
    GrainFailed,
    GrainRetried,
    OutputEmitted,
    RunCompleted,
    SourceAdmitted,
)
from rayorch.core.ids import CallId, GrainKey
from rayorch.core.outcome import FailedResult, source_result
from rayorch.core.plan import CallSpec, Plan
from rayorch.core.state import Kernel
from rayorch.progress import RunStats, make_progress
from rayorch.runtime.session import RunSession, RunSettings
from rayorch.store.base import RunLayout, barrier_fact
from rayorch.store.errors import GrainSealedError

IDLE_WAIT_S = 0.5


class UnstorableValueError(RayorchError):
    """A source value or output cannot be encoded for the lineage store."""


item_result = source_result  # the value(s) or a FailedResult (one place: core.outcome)


class DriverLoop:
    """Drives one run: the kernel's decisions performed on Ray and the store."""

    def __init__(
        self,
        session: RunSession,
        plan: Plan,
        sources: Iterator[tuple[Any, ...]],
        total: int | None,
        settings: RunSettings,
    ) -> None:
        self.session = session
        self.plan = plan
        self.settings = settings
        self.kernel = Kernel(plan, max_active_sources=settings.max_active_sources)
        self.layout = RunLayout(session.info)
        self._sources = sources
        self._next_index = 0
        self._exhausted = False
        self._batches: dict[Any, InFlightBatch] = {}
        self._unsaved: list[Fact] = []
        self._batch_ids = itertools.count()
        self._catch_up_cursor = dict.fromkeys(range(session.info.shards), 0)
        self._admitted_per_shard = dict.fromkeys(range(session.info.shards), 0)
        self._call_specs: dict[CallId, CallSpec] = {}
        for node in plan.calls:
            assert node.call is not None
            self._call_specs[node.call.id] = node.call
        # Downstream Calls first: finishing parents frees memory and yields results sooner.
        self._call_rank = {call: -i for i, call in enumerate(self._call_specs)}
        self.stats = RunStats(session.run_id, sources_total=total)
        for call in self._call_specs:
            self.stats.call(call)
        self.store_kernel_disagreements = 0
        self._progress = make_progress(settings.progress)
        self._closed = False

    # -- the loop -------------------------------------------------------------
    def results(self) -> Iterator[tuple[int, Any]]:
        """Run to completion, yielding ``(index, value)`` as source items finish."""
        if self._progress is not None:
            self._progress.start()
        try:
            while True:
                self.session.renew_leases()  # first: the caller may have been slow
                admitted = self._admit()
                dispatched = self._dispatch()
                yield from self._emit_completed()
                self.session.renew_leases()  # the caller may have held on to a result
                if self._exhausted and not self._batches and self.kernel.finished:
                    break
                if not self._batches:
                    if not (admitted or dispatched):
                        self._flush()
                        self.kernel.check_progress()
                        raise NoProgressError(
                            "the run cannot progress: nothing is in flight, nothing is ready "
                            "and no source can be admitted; this is a bug in rayorch, please "
                            f"report it with the run id {self.session.run_id}"
                        )
                    continue
                self._collect()
                self._enforce_timeouts()
                self._flush()
                self._show()
            self._finish()
        finally:
            self._stop_progress()

    def _stop_progress(self) -> None:
        if self._progress is not None:
            progress, self._progress = self._progress, None
            progress.stop(self.stats)

    def close(self) -> None:
        """Stop the progress display, the actors and the leases (idempotent)."""
        if not self._closed:
            self._closed = True
            self._stop_progress()
            self.session.close()

    # -- admission --------------------------------------------------------------
    def _admit(self) -> int:
        """Admit sources in micro-batches while the kernel has room; how many were admitted."""
        admitted = 0
        micro = self.settings.micro_batch
        cap = self.settings.max_active_sources
        granule = micro if cap is None else min(micro, cap)
        now = time.time()
        while not self._exhausted:
            room = self.kernel.admissible()
            if room < granule:
                break
            take = min(room, micro)
            chunk = list(itertools.islice(self._sources, take))
            for values in chunk:
                self._fold(SourceAdmitted(self._next_index, tuple(values), ts=now))
                self._admitted_per_shard[self.session.info.shard_of(self._next_index)] += 1
                self._next_index += 1
            admitted += len(chunk)
            if len(chunk) < take:
                self._exhausted = True
                self._unsaved.extend(self.kernel.close_input())
        self.stats.sources_admitted += admitted
        return admitted

    # -- dispatch ---------------------------------------------------------------
    def _dispatch(self) -> int:
        """Fill every free actor slot with a batch of its Calls' ready Grains."""
        planned: list[tuple[ActorPool, ActorSlot, BatchTask]] = []
        calls = sorted(self.kernel.ready_calls(), key=self._call_rank.__getitem__)
        now = time.time()
        for call_id in calls:
            pool = self.session.pool_of(call_id)
            spec = self._call_specs[call_id]
            limit = pool.module.options.batch_size
            while (slot := pool.reserve()) is not None:
                grains = self.kernel.take_batch(call_id, limit)
                if not grains:
                    pool.unreserve(slot)
                    break
                tags = []
                for (_, path), generation in grains:
                    self._fold(GrainDispatched(call_id, path, generation, ts=now))
                    tags.append((path, generation))
                rows = tuple(self.kernel.inputs_of(grain) for grain, _ in grains)
                task = BatchTask(spec, tuple(tags), rows, next(self._batch_ids))
                planned.append((pool, slot, task))
                self.stats.call(call_id).in_flight += len(tags)
        if planned:
            self._flush()  # the store must know the dispatches before a worker commits
            for pool, slot, task in planned:
                batch = pool.submit(slot, task)
                self._batches[batch.ref] = batch
            self.stats.batches += len(planned)
        return len(planned)

    # -- collection -------------------------------------------------------------
    def _wait_timeout(self) -> float:
        timeout = IDLE_WAIT_S
        now = time.monotonic()
        for pool in self.session.pools.values():
            limit = pool.module.options.timeout_s
            if limit is None:
                continue
            for slot in pool.slots:
                if slot.queue and slot.queue[0].started is not None:
                    timeout = min(timeout, slot.queue[0].started + limit - now)
        return max(timeout, 0.01)

    def _collect(self) -> None:
        refs = list(self._batches)
        ready, rest = ray.wait(refs, num_returns=1, timeout=self._wait_timeout())
        if ready and rest:
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready.extend(more)
        for ref in ready:
            batch = self._batches.pop(ref)
            self._settle(self.session.pool_of(batch.task.call.id).finish(batch))

    def _enforce_timeouts(self) -> None:
        for pool in self.session.pools.values():
            for batch in pool.overdue():
                pool.time_out(batch)
                self.stats.actors_replaced += 1

    def _settle(self, outcome: BatchOutcome) -> None:
        task = outcome.batch.task
        stats = self.stats.call(task.call.id)
        stats.in_flight -= len(task.tags)
        if outcome.physical_failure is not None or outcome.result is None:
            self._physical_failure(task, outcome.physical_failure or "batch lost")
            return
        result = outcome.result
        if result.verdicts is None:
            self._flush()
            store, run_id = self.session.store, self.session.run_id
            verdicts = [int(v) for v in store.commit(run_id, result.reports)]
        else:
            verdicts = list(result.verdicts)
        now = time.monotonic()
        unexplained: list[GrainCommitted] = []
        for report, code in zip(result.reports, verdicts, strict=True):
            if code == CommitVerdict.ACCEPTED:
                self._fold_commit(report, stats, now)
                continue
            stats.rejected += 1
            if code != CommitVerdict.BARRED and (
                self.kernel.verdict(report) is CommitVerdict.ACCEPTED
            ):
                unexplained.append(report)
        if unexplained:
            self._reconcile(task, unexplained, verdicts)

    def _reconcile(
        self, task: BatchTask, reports: list[GrainCommitted], verdicts: list[int]
    ) -> None:
        """The shared store rejected reports this driver still expects: learn why, then retry.

        (A BARRED rejection needs nothing: the barrier's own commit reaches the kernel.)
        """
        for shard in {self.session.info.shard_of(r.path[0]) for r in reports}:
            self._catch_up(shard)
        names = sorted({CommitVerdict(v).name for v in verdicts if v != CommitVerdict.ACCEPTED})
        retry = BatchTask(task.call, tuple((r.path, r.generation) for r in reports), ())
        self._physical_failure(retry, f"the lineage store rejected the report ({', '.join(names)})")

    def _fold_commit(self, report: GrainCommitted, stats: Any, now: float) -> None:
        """Fold a report the store accepted (the store already holds it)."""
        if self.kernel.verdict(report) is not CommitVerdict.ACCEPTED:
            # A GroupFailure barrier reached the kernel before this sibling's commit,
            # while the shared store saw them the other way round; the parent's
            # result is Suppressed either way.
            self.store_kernel_disagreements += 1
            return
        self._fold(report, save=False)
        if report.outcome == REPORT_GROUP_FAILURE and len(report.path) > 1:
            self._fold(barrier_fact(report), save=False)
        if report.outcome == REPORT_PRESENT:
            stats.record_done(1, now)
        else:
            stats.failed += 1

    def _physical_failure(self, task: BatchTask, cause: str) -> None:
        """Send the batch's Grains back to ready (or Failed) through the kernel and the store."""
        batch: list[tuple[GrainKey, int]] = [((task.call.id, path), gen) for path, gen in task.tags]
        self._flush()
        facts = self.kernel.physical_failure(batch, cause, ts=time.time())
        try:
            self._append_now(facts)
        except GrainSealedError as exc:
            # The actor committed to the shared store and died before it could tell us.
            self._catch_up(exc.shard)
            facts = self.kernel.physical_failure(batch, cause, ts=time.time())
            self._append_now(facts)
        for fact in facts:
            self._fold(fact, save=False)

    def _catch_up(self, shard: int) -> None:
        """Fold commits of ``shard`` that reached the store but not this driver."""
        store, run_id = self.session.store, self.session.run_id
        cursor = self._catch_up_cursor[shard]
        now = time.monotonic()
        for stored in store.iter_facts(run_id, shard, cursor):
            cursor = stored.seq
            fact = stored.fact
            if isinstance(fact, GrainCommitted) and (
                self.kernel.verdict(fact) is CommitVerdict.ACCEPTED
            ):
                self._fold_commit(fact, self.stats.call(fact.call), now)
        self._catch_up_cursor[shard] = cursor

    # -- facts ------------------------------------------------------------------
    def _fold(self, fact: Fact, *, save: bool = True) -> None:
        """Fold ``fact`` into the kernel; queue it (and what it derives) for the store."""
        derived = self.kernel.apply(fact)
        if save:
            self._unsaved.append(fact)
        self._unsaved.extend(derived)
        if isinstance(fact, GrainRetried):
            self.stats.call(fact.call).retried += 1
        elif isinstance(fact, GrainFailed):
            self.stats.call(fact.call).failed += 1

    def _append_now(self, facts: Sequence[Fact]) -> None:
        by_shard: dict[int, list[Fact]] = {}
        for fact in facts:
            if isinstance(fact, RunCompleted):
                # The kernel spans every shard; each shard's stream records its own sources.
                for k, count in self._admitted_per_shard.items():
                    by_shard.setdefault(k, []).append(RunCompleted(count, ts=fact.ts))
                continue
            shard = self.layout.shard_of_fact(fact)
            for k in self.session.epochs if shard is None else (shard,):
                by_shard.setdefault(k, []).append(fact)
        for shard, shard_facts in by_shard.items():
            try:
                self.session.store.append(
                    self.session.run_id, shard, self.session.epochs[shard], shard_facts
                )
            except TypeError as exc:
                raise UnstorableValueError(
                    f"a fact could not be written to the lineage store: {exc}. Source items "
                    "(and, with a durable store, module outputs) must be msgpack-able values; "
                    "convert sets and custom objects to lists, dicts or tuples"
                ) from exc

    def _flush(self) -> None:
        """Write the queued facts, one fenced append per shard."""
        if self._unsaved:
            facts, self._unsaved = self._unsaved, []
            self._append_now(facts)

    # -- results ----------------------------------------------------------------
    def _emit_completed(self) -> Iterator[tuple[int, Any]]:
        completed = self.kernel.pop_completed()
        if not completed:
            return
        now = time.time()
        results = []
        for index, items in completed:
            value = item_result(index, items, self.plan.output_names)
            outcome = "present" if not isinstance(value, FailedResult) else value.outcome.value
            self._fold(OutputEmitted(index, outcome, ts=now))
            results.append((index, value))
        self.stats.sources_done += len(results)
        self._flush()
        yield from results

    def _finish(self) -> None:
        """Write the last facts (the kernel derived ``RunCompleted`` when the input closed)."""
        self._flush()

    def _show(self) -> None:
        if self._progress is None:
            return
        kernel = self.kernel
        for call_id, stats in self.stats.calls.items():
            stats.ready = kernel.ready_count(call_id)
            stats.suppressed = kernel.suppressed_count(call_id)
        self.stats.actors_replaced = sum(p.replaced for p in self.session.pools.values())
        self._progress.update(self.stats)


__all__ = ["DriverLoop", "item_result"]
