"""A discrete-event simulator that drives the real kernel under a virtual clock.

The loop is the driver's (``rayorch/runtime/loop.py``) with Ray replaced by an event heap:
admit sources while ``Kernel.admissible()`` allows -> for every Call with ready Grains and
every idle actor of its pool, ``Kernel.take_batch`` (the Call's own policy and batch size)
-> ``GrainDispatched`` per Grain -> the UDF runs at once (time is virtual) and the batch's
completion is scheduled at ``now + cost(call, rows)`` -> at that virtual time the reports go
through the commit gate (``Kernel.verdict``) and are folded as ``GrainCommitted`` (plus
``BarrierInstalled`` for a group failure) -> finished sources are emitted. All completions
that share one virtual instant are folded before the next dispatch, as a driver that sees
them in one ``ray.wait`` would. Actors are never idle while their Call has a ready Grain.

Nothing here sleeps or copies kernel logic: scheduling, propagation, reduce and completion
are the kernel's. Actor counts are the modules' ``replicas``, batch sizes their
``batch_size``; the cost of a batch is the caller's ``cost(call_id, rows)`` in virtual
seconds.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rayorch.core.errors import KernelError
from rayorch.core.facts import (
    REPORT_GROUP_FAILURE,
    BarrierInstalled,
    GrainDispatched,
    OutputEmitted,
    SourceAdmitted,
)
from rayorch.core.ids import CallId, GrainKey
from rayorch.core.outcome import Item
from rayorch.core.plan import CallSpec, ModuleSpec, Plan
from rayorch.core.state import Kernel
from rayorch.core.udf import Row, RowResult, UdfError, instantiate, invoke_batch, reports_for

CostModel = Callable[[CallId, Sequence[Row]], float]
"""Virtual seconds one batch of ``rows`` of Call ``call_id`` takes on one actor."""


@dataclass(frozen=True)
class BatchRecord:
    """One batch as it ran: which actor, when (virtual seconds) and how many Grains."""

    call: CallId
    actor: int
    start_s: float
    end_s: float
    size: int


@dataclass
class SimResult:
    """What one simulated run produced and how it used its actors."""

    makespan_s: float
    outputs: dict[int, tuple[Item, ...]]
    completion_s: dict[int, float]  # source index -> virtual time its output was emitted
    batches: list[BatchRecord]
    actors: dict[CallId, int]
    wall_s: float
    kernel: Kernel  # the kernel after the run (its ``log`` holds every fact, in fold order)
    retries: int = 0

    def windows(self, call: CallId) -> list[tuple[float, float]]:
        """The union of the Call's batch intervals: when at least one of its actors was busy."""
        return merge_intervals([(b.start_s, b.end_s) for b in self.batches if b.call == call])

    def busy_s(self, call: CallId) -> float:
        """Actor-seconds the Call's pool spent running batches."""
        return sum(b.end_s - b.start_s for b in self.batches if b.call == call)

    def utilization(self, call: CallId) -> float:
        """Busy actor-seconds / (actors x makespan)."""
        capacity = self.actors[call] * self.makespan_s
        return self.busy_s(call) / capacity if capacity else 0.0

    def batch_sizes(self, call: CallId) -> list[int]:
        return [b.size for b in self.batches if b.call == call]


def merge_intervals(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted disjoint ``(start, end)`` pairs covering the union of ``intervals``."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


@dataclass(order=True)
class _Pending:
    """A batch in flight on one actor; ordered by completion time, then dispatch order."""

    end_s: float
    seq: int
    call: CallId = field(compare=False)
    actor: int = field(compare=False)
    start_s: float = field(compare=False)
    tags: list[tuple[GrainKey, int]] = field(compare=False)
    results: list[RowResult] | None = field(compare=False)
    error: str | None = field(compare=False)


class Simulator:
    """Runs one Plan over a list of sources with virtual-time actors; see the module doc."""

    def __init__(
        self,
        plan: Plan,
        cost: CostModel,
        max_active_sources: int | None = 256,
        max_events: int = 50_000_000,
    ) -> None:
        self.plan = plan
        self.cost = cost
        self.max_active_sources = max_active_sources
        self.max_events = max_events
        self._modules: dict[CallId, ModuleSpec] = {}
        self._specs: dict[CallId, CallSpec] = {}
        for node in plan.calls:
            assert node.call is not None
            self._modules[node.call.id] = plan.module(node.call.module)
            self._specs[node.call.id] = node.call

    def run(self, sources: Sequence[tuple[Any, ...]]) -> SimResult:
        """Simulate every source (a tuple of forward arguments) to completion."""
        started = time.perf_counter()
        total = len(sources)
        kernel = Kernel(self.plan, max_active_sources=self.max_active_sources,
                        total_sources=total)
        apply = kernel.apply
        actors = {call: module.options.replicas for call, module in self._modules.items()}
        idle: dict[CallId, deque[int]] = {c: deque(range(n)) for c, n in actors.items()}
        functions: dict[tuple[CallId, int], Callable[..., Any]] = {}
        heap: list[_Pending] = []
        batches: list[BatchRecord] = []
        outputs: dict[int, tuple[Item, ...]] = {}
        completion: dict[int, float] = {}
        now = 0.0
        seq = 0
        retries = 0
        next_source = 0
        if total == 0:
            kernel.close_input()
        for _ in range(self.max_events):
            # admit -> dispatch onto every idle actor
            if next_source < total:
                for _ in range(kernel.admissible()):
                    apply(SourceAdmitted(next_source, tuple(sources[next_source])))
                    next_source += 1
                if next_source == total:
                    kernel.close_input()
            for call in kernel.ready_calls():
                free = idle[call]
                module = self._modules[call]
                while free:
                    tags = kernel.take_batch(call, module.options.batch_size)
                    if not tags:
                        break
                    actor = free.popleft()
                    for (c, path), generation in tags:
                        apply(GrainDispatched(c, path, generation))
                    rows = [kernel.inputs_of(grain) for grain, _ in tags]
                    fn = functions.get((call, actor))
                    if fn is None:
                        fn = functions[(call, actor)] = instantiate(module)
                    results: list[RowResult] | None = None
                    error = None
                    try:
                        results = invoke_batch(fn, module.options, self._specs[call], rows)
                    except UdfError as exc:
                        error = exc.cause
                    end = now + float(self.cost(call, rows))
                    heapq.heappush(heap, _Pending(end, seq, call, actor, now, tags, results,
                                                  error))
                    seq += 1
            for index, items in kernel.pop_completed():
                outputs[index] = items
                completion[index] = now
                apply(OutputEmitted(index, items[0].outcome.value if items else "present"))
            if not heap:
                if kernel.run_completed:
                    break
                kernel.check_progress()
                raise KernelError("the simulator has nothing in flight but the run is not done")
            # advance the clock to the next completion; fold every batch ending then
            now = heap[0].end_s
            while heap and heap[0].end_s == now:
                job = heapq.heappop(heap)
                idle[job.call].append(job.actor)
                batches.append(BatchRecord(job.call, job.actor, job.start_s, now, len(job.tags)))
                if job.error is not None:
                    for fact in kernel.physical_failure(job.tags, job.error):
                        apply(fact)
                        retries += 1
                    continue
                path_tags = [(path, gen) for (_, path), gen in job.tags]
                for report in reports_for(job.call, path_tags, job.results or []):
                    if not kernel.verdict(report).accepted:
                        continue  # suppressed by a barrier after dispatch: rejected
                    apply(report)
                    if report.outcome == REPORT_GROUP_FAILURE and len(report.path) > 1:
                        apply(BarrierInstalled(report.call, report.path[:-1], report.cause or ""))
        else:
            raise KernelError(f"the simulation did not finish in {self.max_events} events")
        return SimResult(now, outputs, completion, batches, actors,
                         time.perf_counter() - started, kernel, retries)


__all__ = ["BatchRecord", "CostModel", "SimResult", "Simulator", "merge_intervals"]
