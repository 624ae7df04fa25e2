"""The in-process executor: the one driver with in-process actors and a memory store, no Ray.

:class:`Executor` is :class:`~rayorch.runtime.shard_driver.ShardDriver` with these
ports (:mod:`rayorch.runtime.ports`): a :class:`~rayorch.store.memory.MemoryStore` as the
fact log (its commit gate is the one commit rule), :class:`LocalPools` as the pools and
:class:`CollectSink` as the sink. Its knobs produce the physical schedules the property
tests need: batch sizes, a policy override, several simulated actors per Call, random
completion order, injected faults (exceptions, actor crashes, timeouts whose reports
arrive late), stale and duplicate reports (which the store must reject), and driver
restarts (the shard's machine is thrown away and rebuilt from the store, as after a
take-over). The user code runs as in a pool actor
(:func:`~rayorch.core.udf.run_with_recovery`): an exception it raises is handled by the
module's recovery policy, in place; only ``ro.ActorFailure`` is a physical failure (the
simulated actor is replaced).

Injected faults are bounded so that a run stays comparable with the reference
interpreter: a Grain gets at most ``max_faults_per_grain`` injected faults and never
on its last allowed attempt (so a record that fails for real fails with its own cause).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rayorch.core.errors import KernelError
from rayorch.core.facts import Fact, GrainCommitted
from rayorch.core.ids import CallId, GrainKey
from rayorch.core.machine import GrainTag, OutputDelivered, OutputReady
from rayorch.core.outcome import ActorFailure, Item
from rayorch.core.plan import CallSpec, ModuleSpec, Plan, Policy, override_plan
from rayorch.core.state import Kernel
from rayorch.core.udf import instantiate, one_line_cause, reports_for, run_with_recovery
from rayorch.core.vocabulary import CommitVerdict
from rayorch.runtime.delivery import ManifestFeed
from rayorch.runtime.ports import Completion, ModulePools, PoolCounts, actor_need
from rayorch.runtime.shard_driver import DriverConfig, LeaseMode, ShardDriver
from rayorch.store.memory import MemoryStore

CRASH_CAUSE = "ActorDiedError: simulated actor crash"
INJECTED_CAUSE = "InjectedError: simulated transient failure"
TIMEOUT_CAUSE = "TimeoutError: simulated timeout"
RESTART_CAUSE = "DriverRestarted: in-flight attempt fenced by a new driver"
RUN_ID = "in-process"
NEVER_EXPIRES_S = 1e9  # the executor is the only driver: its lease never lapses


@dataclass(frozen=True)
class ExecutorOptions:
    """The physical-schedule knobs of :class:`Executor`."""

    batch_size: int | None = None  # override every module's batch_size
    policy: Policy | None = None  # override every module's reservation policy
    actors: int | None = None  # simulated actors per Call (default: module replicas)
    seed: int = 0
    random_order: bool = False  # complete outstanding batches in random order
    fault_rate: float = 0.0  # chance that one attempt fails physically (injected)
    max_faults_per_grain: int = 1
    bogus_report_rate: float = 0.0  # chance to (re)deliver a duplicate report later
    restart_rate: float = 0.0  # chance per step that the driver restarts
    fence_on_restart: bool = False  # a restarted driver retries in-flight Grains
    max_active_sources: int | None = None
    check_rebuild: bool = False  # compare a rebuilt kernel's state with the old one
    validate: bool = False  # Kernel.validate() after every step
    keep_history: bool = True  # False: no kernel log, delivered sources forgotten (the driver)
    max_steps: int = 1_000_000
    reuse: Any = None  # a core.reuse.Reuse: dispatches get reuse keys, ready Grains reused
    resize_rate: float = 0.0  # chance per step that a module's pool is resized (1..4 actors)


@dataclass
class ExecutionResult:
    """Outputs per source index, the fact log and what happened physically."""

    outputs: dict[int, tuple[Item, ...]]
    log: list[Fact]
    kernel: Kernel
    stats: dict[str, int] = field(default_factory=dict)
    completion_order: list[int] = field(default_factory=list)


def run_batch(fn: Callable[..., Any], module: ModuleSpec, call: CallSpec,
              tags: Sequence[GrainTag], rows: Sequence[tuple[Any, ...]]
              ) -> tuple[tuple[GrainCommitted, ...], str | None]:
    """Run one batch as a pool actor does: its reports, or the ``ActorFailure`` that
    condemns the actor (every other exception is handled by the recovery policy)."""
    try:
        results = run_with_recovery(fn, module.options, call, list(rows)).results
    except ActorFailure as failure:
        return (), f"ActorFailure: {one_line_cause(failure).removeprefix('ActorFailure: ')}"
    return tuple(reports_for(call.id, list(tags), results)), None


class CollectSink:
    """The sink of the in-process drivers: outputs kept in memory, delivered at once."""

    name = "caller"

    def __init__(self, clock: Callable[[], float] = lambda: 0.0) -> None:
        self.outputs: dict[int, tuple[Item, ...]] = {}
        self.order: list[int] = []
        self.times: dict[int, float] = {}  # when each was delivered (the driver's clock)
        self._clock = clock

    def reset(self, shard: int) -> None:
        """Nothing is on disk."""

    def deliver(self, shard: int, ready: Sequence[OutputReady], *, acked: int = 0
                ) -> list[OutputDelivered]:
        now = self._clock()
        for r in ready:
            self.outputs[r.index] = r.items
            self.order.append(r.index)
            self.times[r.index] = now
        return [OutputDelivered(r.index, r.outcome, self.name, "", now) for r in ready]

    def discard(self, delivered: Sequence[OutputDelivered]) -> None:
        """The executor holds every shard for good: a refusal never happens."""

    def spooled(self, shard: int) -> int:
        """Nothing waits: each output is delivered when it is ready."""
        return 0

    def seal(self, shard: int, *, acked: int = 0) -> list[OutputDelivered]:
        return []


@dataclass
class _Job:
    handle: int
    call: CallId
    actor: int
    tags: tuple[GrainTag, ...]
    fault: str | None  # crash | injected | timeout | None
    reports: tuple[GrainCommitted, ...] = ()
    error: str | None = None


class LocalPools(ModulePools):
    """The pools port of :class:`Executor`: simulated actors running the UDFs in process."""

    def __init__(self, plan: Plan, options: ExecutorOptions, rng: random.Random,
                 store: MemoryStore, stats: dict[str, int]) -> None:
        super().__init__(plan)
        self.options, self.rng, self.store, self.stats = options, rng, store, stats
        self._attempts: dict[CallId, int] = {}
        tables = Kernel(plan).tables.calls
        self._actors: dict[CallId, list[Callable[..., Any] | None]] = {}
        self._busy: dict[CallId, list[bool]] = {}
        for call, module in self._modules.items():
            self._attempts[call] = tables[call].max_attempts
            count = options.actors or module.options.replicas
            self._actors[call] = [None] * count
            self._busy[call] = [False] * count
        self._leaving: dict[CallId, set[int]] = {call: set() for call in self._actors}  # draining
        self._gone: dict[CallId, set[int]] = {call: set() for call in self._actors}
        self._faults: dict[GrainKey, int] = {}
        self._outstanding: list[_Job] = []
        self._fenced: list[_Job] = []
        self.bogus: list[GrainCommitted] = []
        self._handles = 0
        self._replaced = 0

    # -- the port (batch_limit, one_parent: ModulePools) ---------------------------------
    def reserve(self, call: CallId) -> int | None:
        busy, leaving, gone = self._busy[call], self._leaving[call], self._gone[call]
        for actor, is_busy in enumerate(busy):
            if not is_busy and actor not in leaving and actor not in gone:
                busy[actor] = True
                return actor
        return None

    def unreserve(self, call: CallId, slot: Any) -> None:
        self._release(call, slot)

    def _release(self, call: CallId, actor: int) -> None:
        """The actor's batch is back: it is free, or it leaves if it was draining."""
        self._busy[call][actor] = False
        if actor in self._leaving[call]:
            self._leaving[call].discard(actor)
            self._gone[call].add(actor)
            self._actors[call][actor] = None

    # -- sizing -------------------------------------------------------------------------
    def _live(self, call: CallId) -> list[int]:
        out = self._leaving[call] | self._gone[call]
        return [a for a in range(len(self._busy[call])) if a not in out]

    def counts(self) -> dict[str, PoolCounts]:
        out = {}
        for module, calls in self._calls_of.items():
            first = calls[0]
            live = self._live(first)
            out[module] = PoolCounts(
                size=len(live), starting=0, draining=len(self._leaving[first]),
                idle=sum(not self._busy[first][a] for a in live),
                in_flight=sum(len(job.tags) for job in self._outstanding if job.call in calls),
                need=actor_need(self._modules[first]))
        return out

    def free(self) -> dict[str, float]:
        return {"CPU": 1e6, "GPU": 1e6}  # simulated actors hold nothing

    def resize(self, module: str, size: int) -> None:
        """Per Call of ``module``: add actors, or drain (an idle one leaves at once)."""
        for call in self._calls_of[module]:
            live = self._live(call)
            if size > len(live):
                grow = size - len(live)
                self._actors[call].extend([None] * grow)
                self._busy[call].extend([False] * grow)
                continue
            surplus = sorted(live, key=lambda a: (self._busy[call][a], -a))
            for actor in surplus[: len(live) - max(1, size)]:
                self._leaving[call].add(actor)
                if not self._busy[call][actor]:
                    self._release(call, actor)

    def submit(self, slot: Any, call: CallSpec, tags: tuple[GrainTag, ...],
               rows: tuple[tuple[Any, ...], ...], alone: bool = False) -> int:
        cid = call.id
        self._handles += 1
        stats = self.stats
        stats["batches"] += 1
        stats["dispatched"] += len(tags)
        stats["max_batch"] = max(stats["max_batch"], len(tags))
        fault = None
        cap, limit = self.options.max_faults_per_grain, self._attempts[cid]
        if (self.options.fault_rate and self.rng.random() < self.options.fault_rate
                and all(self._faults.get((cid, path), 0) < cap and gen + 1 < limit
                        for path, gen in tags)):
            fault = self.rng.choice(("crash", "injected", "timeout"))
            for path, _ in tags:
                self._faults[(cid, path)] = self._faults.get((cid, path), 0) + 1
        job = _Job(self._handles, cid, slot, tags, fault)
        if fault not in ("crash", "injected"):  # the UDF runs now; the report comes later
            fn = self._actors[cid][slot]
            if fn is None:
                fn = self._actors[cid][slot] = instantiate(self._modules[cid])
            job.reports, job.error = run_batch(fn, self._modules[cid], call, tags, rows)
            if job.error is not None:  # the user code says its actor is broken: replace it
                self._replace(cid, slot)
        self._outstanding.append(job)
        return job.handle

    def busy(self) -> bool:
        return bool(self._outstanding or self._fenced or self.bogus)

    def collect(self) -> list[Completion]:
        """Maybe one stale or duplicate report (which the store must refuse); then the
        fenced batches, else one outstanding batch (random order: any)."""
        if self._fenced:  # their failures are folded before any of their late reports
            jobs, self._fenced = self._fenced, []
            return [self._failure(job, RESTART_CAUSE) for job in jobs]
        if self.bogus and (len(self._outstanding) <= 1 or self.rng.random() < 0.3):
            # (the failure of a batch whose late reports these are is folded already)
            self.deliver_bogus(self.bogus.pop(self.rng.randrange(len(self.bogus))))
        out: list[Completion] = []
        if self._outstanding:
            pick = self.rng.randrange(len(self._outstanding)) if self.options.random_order else 0
            out = [self._finish(self._outstanding.pop(pick))]
        return out

    def replaced(self) -> int:
        return self._replaced

    # -- faults -------------------------------------------------------------------------
    def fence_all(self) -> bool:
        """A restarted driver fences every attempt in flight (when no Grain would pass its
        fault cap or last attempt); their reports arrive later, stale."""
        cap, tags = self.options.max_faults_per_grain, [
            ((job.call, path), gen) for job in self._outstanding for path, gen in job.tags]
        if any(self._faults.get(g, 0) >= cap or gen + 1 >= self._attempts[g[0]]
               for g, gen in tags):
            return False
        for grain, _ in tags:
            self._faults[grain] = self._faults.get(grain, 0) + 1
        for job in self._outstanding:
            self.bogus.extend(job.reports)
        self._fenced.extend(self._outstanding)
        self._outstanding.clear()
        return True

    def deliver_bogus(self, report: GrainCommitted) -> None:
        """A stale, duplicate or late report: the store's commit gate must refuse it."""
        self.stats["bogus_delivered"] += 1
        (verdict,) = self.store.commit(RUN_ID, [report])
        if verdict is CommitVerdict.ACCEPTED:
            raise KernelError(f"a stale/duplicate report was accepted: {report!r}")
        self.stats["rejected"] += 1

    def _replace(self, call: CallId, actor: int) -> None:
        self._actors[call][actor] = None
        self._replaced += 1

    def _failure(self, job: _Job, cause: str, crashed: bool = False) -> Completion:
        self._release(job.call, job.actor)
        return Completion(job.handle, job.call, job.tags, failure=cause, crashed=crashed)

    def _finish(self, job: _Job) -> Completion:
        if job.fault is not None:
            self.stats["faults"] += 1
            if job.fault == "crash":
                self._replace(job.call, job.actor)
            if job.fault == "timeout":
                self.bogus.extend(job.reports)  # the late reports of a timed-out batch
            cause = {"crash": CRASH_CAUSE, "injected": INJECTED_CAUSE}.get(job.fault,
                                                                           TIMEOUT_CAUSE)
            return self._failure(job, cause, crashed=job.fault == "crash")
        if job.error is not None:
            return self._failure(job, job.error)
        self._release(job.call, job.actor)
        rate = self.options.bogus_report_rate
        if rate and self.rng.random() < rate:
            self.bogus.extend(job.reports)  # a duplicate delivery, later
        return Completion(job.handle, job.call, job.tags, job.reports)


class Executor:
    """Runs one Plan over a list of sources, in process; see :class:`ExecutorOptions`."""

    def __init__(self, plan: Plan, options: ExecutorOptions | None = None) -> None:
        self.options = options = options or ExecutorOptions()
        self.plan = override_plan(plan, options.batch_size, options.policy)
        self.rng = random.Random(options.seed)
        self.stats: dict[str, int] = {
            "batches": 0, "dispatched": 0, "committed": 0, "faults": 0, "restarts": 0,
            "rejected": 0, "bogus_delivered": 0, "max_batch": 0, "resizes": 0,
        }
        self._steps = 0

    def run(self, sources: Sequence[tuple[Any, ...]]) -> ExecutionResult:
        """Run every source (a tuple of forward arguments) to completion."""
        options = self.options
        # With its history the executor returns the whole log, every value in it (keep=all).
        store = MemoryStore("memory://?keep=all" if options.keep_history else "memory://")
        info = store.open_run(RUN_ID, self.plan)
        pools = LocalPools(self.plan, options, self.rng, store, self.stats)
        sink = CollectSink()
        config = DriverConfig(LeaseMode.HOLD_ALL, NEVER_EXPIRES_S, 1 << 30,
                              options.max_active_sources, log=lambda _: None,
                              new_run=True, clock=lambda: 0.0,
                              keep_history=options.keep_history, keep_finished=True)
        driver = ShardDriver(store=store, run_id=RUN_ID, info=info, plan=self.plan,
                             driver_id="in-process", pools=pools,
                             feed=ManifestFeed(sources, info), sink=sink, config=config,
                             on_turn=lambda: self._turn(driver, pools), reuse=options.reuse)
        for _ in driver.results():
            pass  # the collecting sink delivers at once
        while pools.bogus:  # the late reports still on their way arrive after the end
            pools.deliver_bogus(pools.bogus.pop(self.rng.randrange(len(pools.bogus))))
        log = [stored.fact for stored in store.iter_facts(RUN_ID, 0)]
        self.stats["committed"] = sum(isinstance(f, GrainCommitted) for f in log)
        self.stats["rejected"] += sum(c.rejected for c in driver.stats.calls.values())
        state = driver.finished.get(0) or driver.shards[0]
        return ExecutionResult(sink.outputs, log, state.machine.kernel, dict(self.stats),
                               sink.order)

    def _turn(self, driver: ShardDriver, pools: LocalPools) -> None:
        """After every turn of the loop: the step bound, a restart, the invariants."""
        self._steps += 1
        if self._steps > self.options.max_steps:
            raise KernelError(f"the executor did not finish in {self.options.max_steps} steps")
        state = driver.shards.get(0)
        if state is None:
            return
        if driver.counters.resyncs:
            raise KernelError("the in-process store disagreed with the kernel: "
                              f"{driver.counters.resyncs} rebuilds")
        options = self.options
        if options.restart_rate and self.rng.random() < options.restart_rate:
            self.stats["restarts"] += 1
            old = state.machine.kernel
            driver.rebuild(0)
            if options.check_rebuild:
                before, after = old.snapshot(), driver.shards[0].machine.kernel.snapshot()
                if before != after:
                    diff = sorted(k for k in before if before[k] != after[k])
                    raise KernelError(f"a rebuilt kernel differs from the original in {diff}")
            if options.fence_on_restart:
                pools.fence_all()
        if options.resize_rate and self.rng.random() < options.resize_rate:
            self.stats["resizes"] += 1
            module = self.rng.choice(sorted(pools.counts()))
            pools.resize(module, self.rng.randint(1, 4))
        if options.validate:
            driver.shards[0].machine.kernel.validate()


def execute(
    plan: Plan, sources: Sequence[tuple[Any, ...]], options: ExecutorOptions | None = None
) -> ExecutionResult:
    """Run ``plan`` over ``sources`` in process; see :class:`ExecutorOptions`."""
    return Executor(plan, options).run(sources)


__all__ = ["CollectSink", "ExecutionResult", "Executor", "ExecutorOptions", "LocalPools",
           "execute", "run_batch"]
