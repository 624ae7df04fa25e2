"""A discrete-event simulator: the one driver shell with virtual-clock actors.

The simulator is :class:`~rayorch.runtime.shard_driver.ShardDriver` (the driver every
run uses) with other ports (``rayorch/runtime/ports.py``): :class:`VirtualPools`, whose
actors finish a batch at ``now + cost(call, rows)`` of a virtual clock, a memory store as
the fact log (its commit gate is the one commit rule) and a collecting sink. The driver
admits while the machine has room, fills every idle actor of a Call with ready Grains
(the Call's own policy and batch size), and folds all the completions that share one
virtual instant before it dispatches again, as a driver that sees them in one
``ray.wait`` would. The user code runs as in a pool actor (``run_batch``: an exception
is handled by the module's recovery policy; ``ro.ActorFailure`` fails the batch
physically and it is retried).

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
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.simulator.llm import EngineModel, EnginePool
from rayorch.core.errors import KernelError
from rayorch.core.ids import CallId
from rayorch.core.machine import GrainTag
from rayorch.core.outcome import Item
from rayorch.core.plan import CallSpec, Plan
from rayorch.core.pool_sizing import SizingSettings
from rayorch.core.state import Kernel
from rayorch.core.udf import Row, instantiate
from rayorch.runtime.delivery import IteratorFeed, ManifestFeed
from rayorch.runtime.delivery import Row as FeedRow
from rayorch.runtime.in_process import NEVER_EXPIRES_S, CollectSink, run_batch
from rayorch.runtime.pool_sizer import PoolSizer
from rayorch.runtime.ports import Completion, ModulePools, PoolCounts, actor_need
from rayorch.runtime.shard_driver import DriverConfig, LeaseMode, ShardDriver
from rayorch.store.memory import MemoryStore

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
    actor_s: dict[CallId, float] = field(default_factory=dict)  # actor-seconds each pool held
    sizer: PoolSizer | None = None  # its size changes and decisions, when pools sized themselves

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
    tags: tuple[GrainTag, ...] = field(compare=False)
    completion: Completion = field(compare=False)


class VirtualPools(ModulePools):
    """The pools port of the simulator: actors on a virtual clock (see the module doc).

    Pools may be resized (a module with one Call, without an engine model): an actor (the
    first ones too) is up ``start_s[module]`` virtual seconds after its start, a drained one
    leaves when its batch is back;
    ``capacity`` is the cluster the sizing policy sees (its free part: ``free()``).
    """

    def __init__(self, plan: Plan, cost: CostModel, engines: dict[CallId, EngineModel], *,
                 capacity: dict[str, float] | None = None,
                 start_s: dict[str, float] | None = None) -> None:
        super().__init__(plan)
        self.cost = cost
        self.now = 0.0
        self.actors = {call: module.options.replicas for call, module in self._modules.items()}
        self.engines = {c: EnginePool(m, self.actors[c]) for c, m in engines.items()}
        # One entry per batch an actor may hold (round-robin over the actors).
        self._idle: dict[CallId, deque[int]] = {
            c: deque(a for _ in range(engines[c].depth if c in engines else 1)
                     for a in range(n)) for c, n in self.actors.items()}
        self._inside: dict[int, _Pending] = {}  # batches inside an engine, by dispatch number
        self._functions: dict[tuple[CallId, int], Callable[..., Any]] = {}
        self._heap: list[_Pending] = []
        self._seq = 0
        self.batches: list[BatchRecord] = []
        self.retries = 0
        self.capacity = dict(capacity or {})
        self.start_s = dict(start_s or {})
        self._next_actor = dict(self.actors)  # actor ids are never reused
        self._starting: dict[CallId, dict[int, float]] = {c: {} for c in self.actors}  # id: up at
        for call, module in self._modules.items():  # the first actors load their model too
            up = self.start_s.get(module.name, 0.0)
            if up > 0 and call not in self.engines:
                self._starting[call] = dict.fromkeys(self._idle[call], up)
                self._idle[call].clear()
        self._leaving: dict[CallId, set[int]] = {c: set() for c in self.actors}
        self.held: dict[CallId, list[tuple[float, int]]] = {  # (time, actors held) per change
            c: [(0.0, n)] for c, n in self.actors.items()}

    def reserve(self, call: CallId) -> int | None:  # (batch_limit, one_parent: ModulePools)
        free = self._idle[call]
        return free.popleft() if free else None

    def unreserve(self, call: CallId, slot: Any) -> None:
        self._idle[call].appendleft(slot)

    def idle(self, call: CallId, slot: Any) -> bool:
        """No batch of ``call`` is on actor ``slot`` (an engine's actor holds several)."""
        held = [*self._heap, *self._inside.values()]
        return not any(job.call == call and job.actor == slot for job in held)

    def submit(self, slot: Any, call: CallSpec, tags: tuple[GrainTag, ...],
               rows: tuple[tuple[Any, ...], ...], alone: bool = False) -> int:
        cid, module = call.id, self._modules[call.id]
        fn = self._functions.get((cid, slot))
        if fn is None:
            fn = self._functions[(cid, slot)] = instantiate(module)
        reports, failure = run_batch(fn, module, call, tags, rows)
        if failure is not None:  # ro.ActorFailure: the actor is replaced
            del self._functions[(cid, slot)]
        seq = self._seq
        self._seq += 1
        took = float(self.cost(cid, rows)) if cid not in self.engines else None
        done = Completion(seq, cid, tags, reports, failure=failure, busy_s=took)
        end = self.now + (took or 0.0)
        job = _Pending(end, seq, cid, slot, self.now, tags, done)
        if cid in self.engines:
            self.engines[cid].send(slot, seq, list(rows), self.now)
            self._inside[seq] = job
        else:
            heapq.heappush(self._heap, job)
        return seq

    def busy(self) -> bool:
        return bool(self._heap or self._inside or any(self._starting.values()))

    def collect(self) -> list[Completion]:
        """Advance the clock to the next event; the batches that end at that instant."""
        heap = self._heap
        engine_next = min((pool.next_s() for pool in self.engines.values()), default=math.inf)
        up_next = min((t for ups in self._starting.values() for t in ups.values()),
                      default=math.inf)
        if up_next < min(engine_next, heap[0].end_s if heap else math.inf):
            self.now = up_next  # actors come up: they take batches from now on
            for call, ups in self._starting.items():
                for actor in [a for a, t in ups.items() if t <= up_next]:
                    del ups[actor]
                    self._idle[call].append(actor)
            return []
        if engine_next < (heap[0].end_s if heap else math.inf):
            self.now = engine_next  # an engine event: a batch arrives or a request ends
            for pool in self.engines.values():
                for key, back_s in pool.advance(self.now):
                    job = self._inside.pop(key)
                    job.end_s = back_s
                    heapq.heappush(heap, job)
            return []
        now = self.now = heap[0].end_s
        out: list[Completion] = []
        while heap and heap[0].end_s == now:
            job = heapq.heappop(heap)
            if job.actor in self._leaving[job.call]:  # drained: it leaves with its batch back
                self._leaving[job.call].discard(job.actor)
                self._note_held(job.call)
            else:
                self._idle[job.call].append(job.actor)
            self.batches.append(BatchRecord(job.call, job.actor, job.start_s, now,
                                            len(job.tags)))
            if job.completion.failure is not None:
                self.retries += len(job.tags)
            out.append(job.completion)
        return out

    def replaced(self) -> int:
        return 0

    # -- sizing ---------------------------------------------------------------------------------
    def _call_of(self, module: str) -> CallId:
        calls = self._calls_of[module]
        if len(calls) != 1 or calls[0] in self.engines:
            raise KernelError(f"the simulator resizes modules of one Call without an engine "
                              f"model, not {module!r}")
        return calls[0]

    def _note_held(self, call: CallId) -> None:
        held = self.actors[call] + len(self._leaving[call])
        self.held[call].append((self.now, held))

    def counts(self) -> dict[str, PoolCounts]:
        out = {}
        for module, calls in self._calls_of.items():
            call = calls[0]
            out[module] = PoolCounts(
                size=self.actors[call], starting=len(self._starting[call]),
                draining=len(self._leaving[call]),
                idle=len(self._idle[call]) + len(self._starting[call]),
                in_flight=sum(len(job.tags) for job in self._heap if job.call == call),
                need=actor_need(self._modules[call]), start_s=self.start_s.get(module),
                resizable=len(calls) == 1 and call not in self.engines)
        return out

    def free(self) -> dict[str, float]:
        free = dict(self.capacity)
        for call, module in self._modules.items():
            held = self.actors[call] + len(self._leaving[call])
            for key, amount in actor_need(module).items():
                free[key] = free.get(key, 0.0) - held * amount
        return free

    def resize(self, module: str, size: int) -> None:
        """Start actors (up ``start_s`` later) or drain: a starting one first, then an idle
        one, then a busy one, which leaves when its batch is back."""
        call = self._call_of(module)
        size = max(1, size)
        while self.actors[call] < size:
            actor = self._next_actor[call]
            self._next_actor[call] += 1
            self._starting[call][actor] = self.now + self.start_s.get(module, 0.0)
            self.actors[call] += 1
        starting, idle = self._starting[call], self._idle[call]
        while self.actors[call] > size:
            self.actors[call] -= 1
            if starting:
                starting.pop(max(starting))
            elif idle:
                idle.pop()
            else:
                busy = {job.actor for job in self._heap if job.call == call}
                self._leaving[call].add(max(busy - self._leaving[call]))
        self._note_held(call)

    def actor_seconds(self, call: CallId, end_s: float) -> float:
        """Actor-seconds the Call's pool held (starting and draining actors included)."""
        points = [*self.held[call], (end_s, 0)]
        return sum(n * (t1 - t0) for (t0, n), (t1, _) in itertools.pairwise(points))


class Simulator:
    """Runs one Plan over a list of sources with virtual-time actors; see the module doc."""

    def __init__(
        self,
        plan: Plan,
        cost: CostModel,
        max_active_sources: int | None = 256,
        max_events: int = 50_000_000,
        engines: dict[CallId, EngineModel] | None = None,
        *,
        sizing: SizingSettings | None = None,
        capacity: dict[str, float] | None = None,
        start_s: dict[str, float] | None = None,
    ) -> None:
        self.plan = plan
        self.engines = dict(engines or {})
        self.sizing, self.capacity, self.start_s = sizing, capacity, start_s
        self.cost = cost
        self.max_active_sources = max_active_sources
        self.max_events = max_events

    def run(self, sources: Sequence[tuple[Any, ...]],
            indexed: Iterable[FeedRow] | None = None) -> SimResult:
        """Simulate every source (a tuple of forward arguments) to completion.

        ``indexed``: the sources as ``(id, values, identity)`` rows in admission order
        instead (read lazily, as the job's streamed input: ``IteratorFeed.indexed``)."""
        started = time.perf_counter()
        run_id = "simulation"
        store = MemoryStore()
        info = store.open_run(run_id, self.plan)
        pools = VirtualPools(self.plan, self.cost, self.engines, capacity=self.capacity,
                             start_s=self.start_s)
        sink = CollectSink(clock=lambda: pools.now)
        config = DriverConfig(LeaseMode.HOLD_ALL, NEVER_EXPIRES_S, 1 << 30,
                              self.max_active_sources, log=lambda _: None, new_run=True,
                              clock=lambda: pools.now, keep_history=True, keep_finished=True,
                              sizing=self.sizing)
        turns = 0

        def count_turn() -> None:
            nonlocal turns
            turns += 1
            if turns > self.max_events:
                raise KernelError(f"the simulation did not finish in {self.max_events} events")

        driver = ShardDriver(store=store, run_id=run_id, info=info, plan=self.plan,
                             driver_id="simulator", pools=pools,
                             feed=(ManifestFeed(sources, info) if indexed is None
                                   else IteratorFeed.indexed(indexed, info)),
                             sink=sink, config=config,
                             on_turn=count_turn)
        for _ in driver.results():
            pass  # the collecting sink delivers at once
        kernel = driver.finished[0].machine.kernel
        return SimResult(pools.now, sink.outputs, sink.times, pools.batches, pools.actors,
                         time.perf_counter() - started, kernel, pools.retries, pools.engines,
                         {call: pools.actor_seconds(call, pools.now) for call in pools.actors},
                         driver.sizer)


__all__ = ["BatchRecord", "CostModel", "SimResult", "Simulator", "VirtualPools",
           "merge_intervals"]
