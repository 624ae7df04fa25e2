"""The real ShardDriver without Ray: in-process actor pools and a driver factory.

Shared by the property test of kills and resumes (test_driver_machine.py) and the
deterministic fault-path scenarios (test_driver_fault_paths.py). :class:`InlinePool` is
the real ``ActorPool`` with its Ray calls replaced: a batch runs in this process, with the
real worker body, when the harness's ``wait`` hands its ref back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray.exceptions

from rayorch.actors.pool import ActorPool, InFlightBatch
from rayorch.actors.worker import BatchResult, BatchTask, ModuleWorker
from rayorch.core.plan import ModuleSpec, Plan
from rayorch.runtime.ray_pools import RayPools
from rayorch.runtime.shard_driver import DriverConfig, LeaseMode, ShardDriver
from rayorch.store.memory import MemoryStore

TTL = 30.0


class Killed(BaseException):
    """The driver's process died here (SIGKILL): nothing after this point happens."""


class InlineRef:
    def __init__(self, actor: InlineActor, task: BatchTask) -> None:
        self.actor, self.task = actor, task


class InlineActor:
    """A pool actor in this process: the real worker body."""

    def __init__(self, module: ModuleSpec) -> None:
        self.worker = ModuleWorker(module, None)
        self.alive = True
        self.run_batch = self  # so that ``handle.run_batch.remote(task)`` works

    def remote(self, task: BatchTask) -> InlineRef:
        return InlineRef(self, task)


class InlinePool(ActorPool):
    """``ActorPool`` with in-process actors; a batch runs when the harness collects it."""

    def _spawn(self, index: int, incarnation: int) -> Any:
        return InlineActor(self.module)

    def _start_ping(self, handle: Any) -> Any:
        return None  # an in-process actor is up at once

    def _kill(self, handle: Any) -> None:
        handle.alive = False

    def _fetch(self, batch: InFlightBatch) -> BatchResult:
        ref: InlineRef = batch.ref
        if not ref.actor.alive:
            raise ray.exceptions.RayError("the actor died")
        return ref.actor.worker.run_batch(ref.task)


def make_driver(store: MemoryStore, plan: Plan, run_id: str, harness: Any, *,
                feed: Any, sink: Any, mode: LeaseMode, driver_id: str,
                sleep: Callable[[float], None] = lambda _: None, reuse: Any = None,
                pool_class: type[InlinePool] = InlinePool) -> ShardDriver:
    """A driver of ``run_id`` whose batches finish when ``harness.wait`` says."""
    info = store.run_info(run_id)
    pools: dict[str, ActorPool] = {}
    call_module = {}
    for node in plan.calls:
        assert node.call is not None
        call_module[node.call.id] = node.call.module
        if node.call.module not in pools:
            pools[node.call.module] = pool_class(plan.module(node.call.module), None)
    config = DriverConfig(mode, TTL, info.micro_batch, 4, progress=False, log=lambda _: None,
                          sleep=sleep)
    ports = RayPools(pools, call_module, run_id=run_id, log=config.log, wait=harness.wait)
    return ShardDriver(store=store, run_id=run_id, info=info, plan=plan, driver_id=driver_id,
                       pools=ports, feed=feed, sink=sink, config=config, reuse=reuse)
