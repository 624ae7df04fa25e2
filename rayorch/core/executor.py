"""An in-process executor: runs a compiled Plan through the kernel, no Ray.

It plays driver, actor pools and memory store at once, on one thread, and keeps the
fact log. Its knobs produce the physical schedules the property tests need: batch
sizes, a policy override, several simulated actors per Call, random completion
order, injected faults (exceptions, actor crashes, timeouts whose reports arrive
late), stale and duplicate reports (which must be rejected and change nothing), and
driver restarts (the kernel is thrown away and rebuilt by folding the fact log).
The user code runs as in a pool actor (:func:`~rayorch.core.udf.run_with_recovery`): an
exception it raises is handled by the module's recovery policy, in place; only
``ro.ActorFailure`` is a physical failure (the simulated actor is replaced).

Injected faults are bounded so that a run stays comparable with the reference
interpreter: a Grain gets at most ``max_faults_per_grain`` injected faults and never
on its last allowed attempt (so a record that fails for real fails with its own cause).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rayorch.core.errors import KernelError
from rayorch.core.facts import REPORT_GROUP_FAILURE, Fact, GrainCommitted
from rayorch.core.ids import CallId, GrainKey
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
    barrier_fact,
)
from rayorch.core.outcome import ActorFailure, Item
from rayorch.core.plan import Plan, Policy
from rayorch.core.state import Kernel
from rayorch.core.udf import instantiate, one_line_cause, reports_for, run_with_recovery

CRASH_CAUSE = "ActorDiedError: simulated actor crash"
INJECTED_CAUSE = "InjectedError: simulated transient failure"
TIMEOUT_CAUSE = "TimeoutError: simulated timeout"
RESTART_CAUSE = "DriverRestarted: in-flight attempt fenced by a new driver"


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


@dataclass
class ExecutionResult:
    """Outputs per source index, the fact log and what happened physically."""

    outputs: dict[int, tuple[Item, ...]]
    log: list[Fact]
    kernel: Kernel
    stats: dict[str, int] = field(default_factory=dict)
    completion_order: list[int] = field(default_factory=list)


@dataclass
class _Batch:
    call: CallId
    actor: int
    tags: list[tuple[GrainKey, int]]
    fault: str | None  # crash | injected | timeout | None
    results: list[Any] | None = None
    error: str | None = None


def override_plan(plan: Plan, batch_size: int | None, policy: Policy | None) -> Plan:
    """The plan with every module's batch size and/or policy replaced."""
    if batch_size is None and policy is None:
        return plan
    modules = []
    for module in plan.modules:
        options = module.options
        if batch_size is not None:
            options = replace(options, batch_size=batch_size)
        if policy is not None:
            options = replace(options, policy=policy)
        modules.append(replace(module, options=options))
    return replace(plan, modules=tuple(modules))


def rebuild(plan: Plan, log: Sequence[Fact], **kernel_args: Any) -> Kernel:
    """A new Kernel folding ``log`` in order (what a restarted driver does)."""
    kernel = Kernel(plan, **kernel_args)
    for fact in log:
        kernel.apply(fact)
    return kernel


class Executor:
    """Runs one Plan over a list of sources, in process; see :class:`ExecutorOptions`.

    It performs the same :class:`~rayorch.core.machine.ShardMachine` instructions as
    the Ray driver, playing the memory store (its ``log``) and the actor pools itself.
    """

    def __init__(self, plan: Plan, options: ExecutorOptions | None = None) -> None:
        self.options = options = options or ExecutorOptions()
        self.plan = override_plan(plan, options.batch_size, options.policy)
        self.rng = random.Random(options.seed)
        self.log: list[Fact] = []
        self.machine = ShardMachine(self.plan)
        self.stats: dict[str, int] = {
            "batches": 0, "dispatched": 0, "committed": 0, "faults": 0, "restarts": 0,
            "rejected": 0, "bogus_delivered": 0, "max_batch": 0,
        }
        self._actors: dict[CallId, list[Callable[..., Any] | None]] = {}
        self._busy: dict[CallId, list[bool]] = {}
        self._faults: dict[GrainKey, int] = {}
        self._outstanding: list[_Batch] = []
        self._bogus: list[GrainCommitted] = []
        self._outputs: dict[int, tuple[Item, ...]] = {}
        self._order: list[int] = []

    @property
    def kernel(self) -> Kernel:
        return self.machine.kernel

    # -- performing instructions ----------------------------------------------------------
    def perform(self, instructions: list[Instruction]) -> list[SendBatch]:
        """Write facts to the log, deliver outputs at once; the batches to run are returned."""
        sends: list[SendBatch] = []
        for ins in instructions:
            if isinstance(ins, WriteFacts):
                self.log.extend(ins.facts)
            elif isinstance(ins, SendBatch):
                sends.append(ins)
            elif isinstance(ins, OutputReady):
                self._outputs[ins.index] = ins.items
                self._order.append(ins.index)
                sends.extend(self.perform(self.machine.handle(
                    OutputDelivered(ins.index, ins.outcome, "caller"))))
            elif isinstance(ins, Resync):
                raise KernelError(f"the in-process store disagreed with the kernel: {ins.reason}")
        return sends

    def _kernel_args(self, total: int) -> dict[str, Any]:
        return {"max_active_sources": self.options.max_active_sources, "total_sources": total,
                "keep_history": self.options.keep_history, "reuse": self.options.reuse}

    # -- the run --------------------------------------------------------------------
    def run(self, sources: Sequence[tuple[Any, ...]]) -> ExecutionResult:
        """Run every source (a tuple of forward arguments) to completion."""
        options = self.options
        total = len(sources)
        self.machine = ShardMachine(self.plan, **self._kernel_args(total))
        for node in self.plan.calls:
            assert node.call is not None
            module = self.plan.module(node.call.module)
            count = options.actors or module.options.replicas
            self._actors[node.call.id] = [None] * count
            self._busy[node.call.id] = [False] * count
        next_source = 0
        closed = False
        for _ in range(options.max_steps):
            machine = self.machine
            take = min(machine.room(), total - next_source)
            if take > 0:
                rows = tuple((i, tuple(sources[i])) for i in range(next_source, next_source + take))
                self.perform(machine.handle(SourcesArrived(rows)))
                next_source += take
            if next_source == total and not closed:
                self.perform(machine.handle(InputClosed()))
                closed = True
            dispatched = self._dispatch()
            if self._outstanding:
                pick = self.rng.randrange(len(self._outstanding)) if options.random_order else 0
                self._deliver(self._outstanding.pop(pick))
            if self._bogus and (not self._outstanding or self.rng.random() < 0.3):
                self._deliver_bogus(self._bogus.pop(self.rng.randrange(len(self._bogus))))
            if options.restart_rate and self.rng.random() < options.restart_rate:
                self._restart(total, closed)
            if options.validate:
                self.kernel.validate()
            if not dispatched and not self._outstanding and not self._bogus:
                if self.kernel.run_completed:
                    break
                self.kernel.check_progress()
        else:
            raise KernelError(f"the executor did not finish in {options.max_steps} steps")
        return ExecutionResult(self._outputs, self.log, self.kernel, dict(self.stats),
                               self._order)

    def _dispatch(self) -> int:
        machine = self.machine
        count = 0
        for call in machine.ready_calls():
            busy = self._busy[call]
            limit = self.kernel.tables.calls[call].max_attempts
            module = self.plan.module(self.plan.call_node(call).call.module)  # type: ignore[union-attr]
            for actor, is_busy in enumerate(busy):
                if is_busy:
                    continue
                sends = self.perform(machine.handle(SlotFree(call, module.options.batch_size)))
                if not sends:
                    break
                (send,) = sends
                batch = [((call, path), gen) for path, gen in send.tags]
                busy[actor] = True
                count += 1
                self.stats["batches"] += 1
                self.stats["dispatched"] += len(batch)
                self.stats["max_batch"] = max(self.stats["max_batch"], len(batch))
                fault = None
                cap = self.options.max_faults_per_grain
                if (
                    self.options.fault_rate
                    and self.rng.random() < self.options.fault_rate
                    and all(self._faults.get(g, 0) < cap and gen + 1 < limit for g, gen in batch)
                ):
                    fault = self.rng.choice(("crash", "injected", "timeout"))
                    for grain, _ in batch:
                        self._faults[grain] = self._faults.get(grain, 0) + 1
                self._outstanding.append(self._execute(call, actor, batch, send.rows, fault))
        return count

    def _execute(
        self, call: CallId, actor: int, batch: list[tuple[GrainKey, int]],
        rows: Sequence[tuple[Any, ...]], fault: str | None
    ) -> _Batch:
        """Run the UDF now (as the actor would); the report is delivered later."""
        job = _Batch(call, actor, batch, fault)
        if fault in ("crash", "injected"):
            return job
        node = self.plan.call_node(call)
        assert node.call is not None
        module = self.plan.module(node.call.module)
        fn = self._actors[call][actor]
        if fn is None:
            fn = self._actors[call][actor] = instantiate(module)
        try:  # as a pool actor runs it: exceptions are handled here, by the recovery policy
            job.results = run_with_recovery(fn, module.options, node.call, list(rows)).results
        except ActorFailure as failure:  # the user code says its actor is broken: replace it
            job.error = f"ActorFailure: {one_line_cause(failure).removeprefix('ActorFailure: ')}"
            self._actors[call][actor] = None
        return job

    def _failed(self, job: _Batch, cause: str) -> None:
        tags = tuple((path, gen) for (_, path), gen in job.tags)
        self.perform(self.machine.handle(BatchFailed(job.call, tags, cause)))

    def _deliver(self, job: _Batch) -> None:
        self._busy[job.call][job.actor] = False
        if job.fault is not None or job.error is not None:
            cause = job.error or {"crash": CRASH_CAUSE, "injected": INJECTED_CAUSE}.get(
                job.fault or "", TIMEOUT_CAUSE)
            if job.fault is not None:
                self.stats["faults"] += 1
            if job.fault == "crash":
                self._actors[job.call][job.actor] = None  # the actor is replaced
            self._failed(job, cause)
            if job.fault == "timeout" and job.results is not None:
                self._bogus.extend(self._reports(job))  # the late reports of a timed-out batch
            return
        for report in self._reports(job):  # one at a time: the log interleaves as folded
            verdict = self._commit(report)
            self.perform(self.machine.handle(BatchCommitted((report,), (verdict,))))

    def _commit(self, report: GrainCommitted) -> int:
        """The memory store's commit gate: the verdict; an accepted report (+ barrier) logged."""
        verdict = self.kernel.verdict(report)
        if verdict.accepted:
            self.log.append(report)
            self.stats["committed"] += 1
            if report.outcome == REPORT_GROUP_FAILURE and len(report.path) > 1:
                self.log.append(barrier_fact(report))
            rate = self.options.bogus_report_rate
            if rate and self.rng.random() < rate:
                self._bogus.append(report)  # a duplicate delivery
        else:
            self.stats["rejected"] += 1
        return int(verdict)

    def _deliver_bogus(self, report: GrainCommitted) -> None:
        """A stale, duplicate or late report: it must be rejected."""
        self.stats["bogus_delivered"] += 1
        verdict = self.kernel.verdict(report)
        if verdict.accepted:
            raise KernelError(f"a stale/duplicate report was accepted: {report!r}")
        self.stats["rejected"] += 1

    @staticmethod
    def _reports(job: _Batch) -> list[GrainCommitted]:
        if job.results is None:
            return []
        return reports_for(job.call, [(path, gen) for (_, path), gen in job.tags], job.results)

    def _restart(self, total: int, closed: bool) -> None:
        """Throw the machine away and rebuild it from the fact log."""
        self.stats["restarts"] += 1
        old = self.kernel
        self.machine = ShardMachine(self.plan, **self._kernel_args(total))
        self.perform(self.machine.handle(FactsStored(tuple(self.log))))
        if closed:
            self.perform(self.machine.handle(InputClosed()))
        if self.options.check_rebuild:
            before, after = old.snapshot(), self.kernel.snapshot()
            if before != after:
                diff = sorted(k for k in before if before[k] != after[k])
                raise KernelError(f"a rebuilt kernel differs from the original in {diff}")
        if not self.options.fence_on_restart:
            return  # outstanding attempts keep running and report to the new driver
        cap = self.options.max_faults_per_grain
        tags = [t for job in self._outstanding for t in job.tags]
        limits = self.kernel.tables.calls
        if any(self._faults.get(g, 0) >= cap or gen + 1 >= limits[g[0]].max_attempts
               for g, gen in tags):
            return
        for grain, _ in tags:
            self._faults[grain] = self._faults.get(grain, 0) + 1
        for job in self._outstanding:
            self._busy[job.call][job.actor] = False
            self._failed(job, RESTART_CAUSE)
            if job.results is not None:
                self._bogus.extend(self._reports(job))  # their reports now arrive stale
        self._outstanding.clear()


def execute(
    plan: Plan, sources: Sequence[tuple[Any, ...]], options: ExecutorOptions | None = None
) -> ExecutionResult:
    """Run ``plan`` over ``sources`` in process; see :class:`ExecutorOptions`."""
    return Executor(plan, options).run(sources)


__all__ = ["ExecutionResult", "Executor", "ExecutorOptions", "execute", "override_plan", "rebuild"]
