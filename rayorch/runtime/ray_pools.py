"""The pools port on Ray: the modules' actor pools, ``ray.wait``, timeouts and stall lines.

:class:`RayPools` is what the one driver (:mod:`rayorch.runtime.shard_driver`) sends
batches through when it runs on Ray; see :mod:`rayorch.runtime.ports`. A test harness may
pass pools of in-process actors and its own ``wait`` (tests/property/inline_driver.py).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray

from rayorch.actors.pool import ActorPool, ActorSlot, InFlightBatch
from rayorch.actors.shared_pool import adopt_live, held_indexes, kill_by_name
from rayorch.actors.worker import BatchTask
from rayorch.core.ids import CallId
from rayorch.core.machine import GrainTag
from rayorch.core.plan import CallSpec, Policy
from rayorch.runtime.pool_ledger import RayLedger
from rayorch.runtime.ports import Completion, PoolCounts, actor_need
from rayorch.runtime.stall_watch import StallWatch

COLLECT_WAIT_S = 0.5


class RayPools:
    """The actor pools of one run's modules, by Call; see the module docstring."""

    def __init__(self, pools: dict[str, ActorPool], call_module: dict[CallId, str], *,
                 run_id: str, log: Callable[[str], None],
                 wait: Callable[..., tuple[list[Any], list[Any]]] = ray.wait,
                 available: Callable[[], dict[str, float]] = ray.available_resources) -> None:
        self.pools = pools  # by module name
        self._pool_of = {call: pools[module] for call, module in call_module.items()}
        self._run_id = run_id
        self._wait = wait
        self._available = available
        self._batches: dict[Any, tuple[int, InFlightBatch]] = {}  # ref -> (handle, batch)
        self._handles = itertools.count()
        self._stalls = StallWatch(log)  # a batch running far too long is said
        self.ledger: RayLedger | None = None  # set: the shared pools follow the run's live sets
        self.version = 0  # of the live sets adopted (pool_ledger.SharedPools)

    # -- the port ----------------------------------------------------------------------
    def batch_limit(self, call: CallId) -> int:
        return self._pool_of[call].module.options.batch_size

    def one_parent(self, call: CallId) -> bool:
        return self._pool_of[call].module.options.policy is Policy.PARENT_BOUND

    def reserve(self, call: CallId) -> ActorSlot | None:
        return self._pool_of[call].reserve()

    def unreserve(self, call: CallId, slot: Any) -> None:
        self._pool_of[call].unreserve(slot)

    def idle(self, call: CallId, slot: Any) -> bool:
        return self._pool_of[call].idle(slot)

    def submit(self, slot: Any, call: CallSpec, tags: tuple[GrainTag, ...],
               rows: tuple[tuple[Any, ...], ...], alone: bool = False) -> int:
        handle = next(self._handles)
        task = BatchTask(call, tags, rows, handle, self._run_id)
        batch = self._pool_of[call.id].submit(slot, task, alone)
        self._batches[batch.ref] = (handle, batch)
        return handle

    def busy(self) -> bool:
        return bool(self._batches) or bool(self._starting())

    def collect(self) -> list[Completion]:
        """Wait for a batch to finish or an actor to come up; the batches that did."""
        refs = [*self._batches, *self._starting()]
        done, rest = self._wait(refs, num_returns=1, timeout=self._wait_timeout())
        if done and rest:
            more, _ = self._wait(rest, num_returns=len(rest), timeout=0)
            done.extend(more)
        out: list[Completion] = []
        for ref in done:
            entry = self._batches.pop(ref, None)
            if entry is None:  # an actor's start-up answer (noted below)
                continue
            handle, batch = entry
            pool = self._pool_of[batch.task.call.id]
            self._stalls.finished(pool.module.name, batch)
            busy_s = time.monotonic() - (batch.started or batch.submitted)
            outcome = pool.finish(batch)
            task = outcome.batch.task
            result = outcome.result
            if outcome.physical_failure is not None or result is None:
                out.append(Completion(handle, task.call.id, task.tags,
                                      failure=outcome.physical_failure or "batch lost",
                                      crashed=outcome.crashed))
            else:
                out.append(Completion(handle, task.call.id, task.tags, result.reports,
                                      result.verdicts, busy_s=busy_s,
                                      commit_s=result.commit_seconds
                                      if result.verdicts is not None else None,
                                      rss_bytes=result.rss_bytes, actor=result.worker_pid,
                                      tokens=result.tokens,
                                      payload_bytes=result.payload_bytes))
        self._enforce_timeouts()
        return out

    def replaced(self) -> int:
        return sum(p.replaced for p in self.pools.values())

    def recycled(self) -> list[tuple[str, str]]:
        out = []
        for name, pool in self.pools.items():
            out += [(name, why) for _, why in pool.recycled]
            pool.recycled.clear()
        return out

    def counts(self) -> dict[str, PoolCounts]:
        out = {}
        for name, pool in self.pools.items():
            live = pool.live_slots()
            times = pool.start_times
            out[name] = PoolCounts(
                size=len(live), starting=sum(not s.ready for s in live),
                draining=len(pool.slots) - len(live),
                idle=sum(not s.queue and not s.reserved for s in live),
                in_flight=sum(len(b.task.tags) for s in pool.slots for b in s.queue),
                need=actor_need(pool.module),
                start_s=sum(times) / len(times) if times else None,
                resizable=not pool.shared or self.ledger is not None, cap=pool.cap)
        return out

    def free(self) -> dict[str, float]:
        """Ray's available resources, less what this run's starting actors will take (an
        actor not yet placed does not show as used)."""
        free: dict[str, float] = dict(self._available())
        for pool in self.pools.values():
            starting = sum(not slot.ready for slot in pool.slots)
            for key, amount in actor_need(pool.module).items():
                free[key] = free.get(key, 0.0) - starting * amount
        return free

    def resize(self, module: str, size: int) -> None:
        pool = self.pools[module]
        if not pool.shared:
            pool.resize(size)
            return
        if self.ledger is None:
            return  # nobody publishes a shared pool's size: it keeps it
        answer = self.ledger.resize(module, size, [s.index for s in pool.drain_order()])
        if answer is not None:
            live, version = answer
            self.adopt({module: live}, version)

    # -- shared pools (pool_ledger.SharedPools) --------------------------------------------
    def held(self) -> dict[str, list[int]]:
        return {name: held_indexes(pool) for name, pool in self.pools.items() if pool.shared}

    def adopt(self, live: Mapping[str, Sequence[int]], version: int) -> None:
        if version < self.version:  # a late reply: this driver follows newer sets already
            return
        for name, indexes in live.items():
            if name in self.pools and self.pools[name].shared:
                adopt_live(self.pools[name], indexes)
        self.version = max(self.version, version)

    def kill_dropped(self, module: str, indexes: Sequence[int]) -> None:
        if module in self.pools:
            kill_by_name(self.pools[module], indexes)

    # -- Ray details ---------------------------------------------------------------------
    def _starting(self) -> list[Any]:
        """The start-up answers of actors still starting."""
        return [ref for pool in self.pools.values() for ref in pool.starting()]

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

    def _enforce_timeouts(self) -> None:
        for pool in self.pools.values():
            pool.check_started()
            for batch in pool.overdue():
                pool.time_out(batch)
        self._stalls.check(self.pools.values(), time.monotonic())


__all__ = ["COLLECT_WAIT_S", "RayPools"]
