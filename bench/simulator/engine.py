"""A discrete-event simulator that drives the real kernel under a virtual clock.

It performs the same ``ShardMachine`` instructions as the Ray driver
(``rayorch/runtime/shard_driver.py``) with Ray replaced by an event heap: admit sources
while the machine has room -> for every Call with ready Grains and every idle actor of its
pool, ``SlotFree`` (the Call's own policy and batch size) -> the UDF of each ``SendBatch``
runs at once (time is virtual) and the batch's completion is scheduled at
``now + cost(call, rows)`` -> at that virtual time the reports go through the commit gate
and back as ``BatchCommitted`` -> finished sources (``OutputReady``) are delivered. All completions
that share one virtual instant are folded before the next dispatch, as a driver that sees
them in one ``ray.wait`` would. Actors are never idle while their Call has a ready Grain.

Nothing here sleeps or copies kernel logic: scheduling, propagation, reduce and completion
are the kernel's. Actor counts are the modules' ``replicas``, batch sizes their
``batch_size``; the cost of a batch is the caller's ``cost(call_id, rows)`` in virtual
seconds. A Call given an :class:`~bench.simulator.llm.EngineModel` (``engines=``) runs on
continuous-batching engines instead: each actor holds ``depth`` batches, runs ``inflight``
of them at once, and a batch ends when its last request has its tokens
(:mod:`bench.simulator.llm`).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.simulator.llm import EngineModel, EnginePool
from rayorch.core.errors import KernelError
from rayorch.core.ids import CallId, Path
from rayorch.core.machine import (
    BatchCommitted,
    BatchFailed,
    InputClosed,
    Instruction,
    OutputDelivered,
    OutputReady,
    SendBatch,
    ShardMachine,
    SlotFree,
    SourcesArrived,
)
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
    engines: dict[CallId, EnginePool] = field(default_factory=dict)

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
    tags: list[tuple[Path, int]] = field(compare=False)
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
        engines: dict[CallId, EngineModel] | None = None,
    ) -> None:
        self.plan = plan
        self.engines = dict(engines or {})
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
        machine = ShardMachine(self.plan, max_active_sources=self.max_active_sources,
                               total_sources=total)
        kernel = machine.kernel
        actors = {call: module.options.replicas for call, module in self._modules.items()}
        engines = {c: EnginePool(m, actors[c]) for c, m in self.engines.items()}
        # One entry per batch an actor may hold (round-robin over the actors).
        idle: dict[CallId, deque[int]] = {
            c: deque(a for _ in range(self.engines[c].depth if c in engines else 1)
                     for a in range(n)) for c, n in actors.items()}
        inside: dict[int, _Pending] = {}  # batches inside an engine, by dispatch number
        functions: dict[tuple[CallId, int], Callable[..., Any]] = {}
        heap: list[_Pending] = []
        batches: list[BatchRecord] = []
        outputs: dict[int, tuple[Item, ...]] = {}
        completion: dict[int, float] = {}
        now = 0.0
        seq = 0
        retries = 0
        next_source = 0

        def perform(instructions: list[Instruction]) -> list[SendBatch]:
            """Outputs are delivered at once (virtual time); facts need no store here."""
            sends = []
            for ins in instructions:
                if isinstance(ins, SendBatch):
                    sends.append(ins)
                elif isinstance(ins, OutputReady):
                    outputs[ins.index] = ins.items
                    completion[ins.index] = now
                    perform(machine.handle(OutputDelivered(ins.index, ins.outcome, "caller")))
            return sends

        if total == 0:
            perform(machine.handle(InputClosed()))
        for _ in range(self.max_events):
            # admit -> dispatch onto every idle actor
            if next_source < total:
                take = min(machine.room(), total - next_source)
                rows = tuple((i, tuple(sources[i])) for i in range(next_source, next_source + take))
                perform(machine.handle(SourcesArrived(rows)))
                next_source += take
                if next_source == total:
                    perform(machine.handle(InputClosed()))
            for call in machine.ready_calls():
                free = idle[call]
                module = self._modules[call]
                while free:
                    sends = perform(machine.handle(SlotFree(call, module.options.batch_size)))
                    if not sends:
                        break
                    (send,) = sends
                    actor = free.popleft()
                    fn = functions.get((call, actor))
                    if fn is None:
                        fn = functions[(call, actor)] = instantiate(module)
                    results: list[RowResult] | None = None
                    error = None
                    try:
                        results = invoke_batch(fn, module.options, self._specs[call],
                                               list(send.rows))
                    except UdfError as exc:
                        error = exc.cause
                    end = now + float(self.cost(call, send.rows)) if call not in engines else now
                    job = _Pending(end, seq, call, actor, now, list(send.tags), results, error)
                    if call in engines:
                        engines[call].send(actor, seq, list(send.rows), now)
                        inside[seq] = job
                    else:
                        heapq.heappush(heap, job)
                    seq += 1
            engine_next = min((pool.next_s() for pool in engines.values()), default=math.inf)
            if engine_next < (heap[0].end_s if heap else math.inf):
                now = engine_next  # an engine event: a batch arrives or a request ends
                for pool in engines.values():
                    for key, back_s in pool.advance(now):
                        job = inside.pop(key)
                        job.end_s = back_s
                        heapq.heappush(heap, job)
                continue
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
                    retries += len(job.tags)
                    perform(machine.handle(BatchFailed(job.call, tuple(job.tags), job.error)))
                    continue
                reports = tuple(reports_for(job.call, job.tags, job.results or []))
                verdicts = tuple(int(kernel.verdict(r)) for r in reports)  # the commit gate
                perform(machine.handle(BatchCommitted(reports, verdicts)))
        else:
            raise KernelError(f"the simulation did not finish in {self.max_events} events")
        return SimResult(now, outputs, completion, batches, actors,
                         time.perf_counter() - started, kernel, retries, engines)


__all__ = ["BatchRecord", "CostModel", "SimResult", "Simulator", "merge_intervals"]
