"""Actor pools: one pool of Ray actors per module, shared by all Calls of that module.

A pool owns ``replicas`` actor slots at the start; :meth:`ActorPool.resize` starts more or
drains some (a draining slot takes no new batch and its actor is killed only once its
batches are back). Each slot holds at most ``depth`` batches in
flight: the module's ``max_inflight`` running at once, plus one queued (pipelining keeps
an actor busy while the driver handles a result), none queued with a ``timeout_s``.
A slot whose actor died, ran past ``timeout_s``, or whose UDF raised
``ro.ActorFailure`` is *replaced*: the old actor is killed and a fresh one built;
batches still queued on the old actor come back as physical failures. Any other
exception from the UDF is handled inside the actor (its recovery policy), which
stays: its loaded model and state serve the next batches.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

import ray

from rayorch.actors.causes import first_line, first_line_with, raised_line
from rayorch.actors.orphan_watch import orphan_grace_s
from rayorch.actors.reservation import Reservation
from rayorch.actors.worker import BatchResult, BatchTask, ModuleWorker, StoreBinding
from rayorch.core.errors import RayorchError
from rayorch.core.plan import ModuleSpec
from rayorch.core.sizes import format_byte_size
from rayorch.storage import storage_options

RemoteWorker = ray.remote(ModuleWorker)

START_TIMEOUT_S = 120.0
"""How long an actor may take to be scheduled and build its module (by default)."""
START_TIMEOUT_ENV = "RAYORCH_ACTOR_START_TIMEOUT_S"
"""Environment variable that sets it (a model that loads for minutes needs more)."""


def seconds_setting(env: str, default: float, *, zero: str | None = None) -> float:
    """``$env`` as a number of seconds, or ``default``: > 0, or >= 0 when ``zero`` says
    what 0 means; a :class:`PoolError` naming the variable otherwise."""
    raw = os.environ.get(env)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not ((value >= 0 if zero else value > 0) and value < float("inf")):
        bound = f">= 0 ({zero})" if zero else "> 0"
        raise PoolError(f"{env}={raw[:40]!r}: give a number of seconds {bound}")
    return value


def start_timeout_s() -> float:
    """The actors' start-up limit: ``$RAYORCH_ACTOR_START_TIMEOUT_S`` or 120 s."""
    return seconds_setting(START_TIMEOUT_ENV, START_TIMEOUT_S)


SHARED_NAMESPACE = "rayorch"
"""Ray namespace of the named, detached actors that the drivers of a run share."""


class PoolError(RayorchError):
    """An actor pool could not be built or scheduled."""


@dataclass(slots=True)
class InFlightBatch:
    """A submitted batch: where it runs, what it carries, and when it started."""

    ref: Any  # ray.ObjectRef[BatchResult]
    task: BatchTask
    slot: ActorSlot
    incarnation: int
    submitted: float
    started: float | None  # when it became one of the actor's oldest max_inflight batches
    kill_cause: str | None = None  # set when the driver killed its actor (timeout)
    alone: bool = False  # a crash retry: the actor takes no other batch while it holds it
    timed_out: bool = False  # its actor was killed because *it* ran past timeout_s


@dataclass(slots=True)
class ActorSlot:
    """One replica of a pool; ``incarnation`` grows every time the actor is replaced."""

    index: int
    handle: Any
    incarnation: int = 0
    queue: list[InFlightBatch] = field(default_factory=list)
    reserved: int = 0  # batches promised to this slot but not yet submitted
    ping: Any = None  # the actor's start-up answer while it is not known to be up
    spawned: float = field(default_factory=time.monotonic)
    draining: bool = False  # no new batch; the actor leaves once its queue is empty
    batches: int = 0  # batches this incarnation finished (max_batches)
    recycle: str | None = None  # why it is recycled: no new batch, replaced once idle

    @property
    def ready(self) -> bool:
        """Whether the actor is known to have built its module (batches run at once)."""
        return self.ping is None


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """A finished batch: the worker's result, or the cause of a physical failure."""

    batch: InFlightBatch
    result: BatchResult | None
    physical_failure: str | None
    crashed: bool = False  # its actor died under it (not its own timeout or ActorFailure)


class ActorPool:
    """The Ray actors of one module (``replicas`` of them, resources from its options)."""

    def __init__(
        self,
        module: ModuleSpec,
        binding: StoreBinding | None,
        *,
        name_prefix: str | None = None,
        depth: int | None = None,
        shared: bool = False,
        reservation: Reservation | None = None,
        indexes: list[int] | None = None,
    ) -> None:
        """``shared``: the actors are named, detached and found by name (``get_if_exists``),
        so every driver of a run uses the same ones; one actor per slot index (its name
        carries no incarnation), and :meth:`shutdown` only forgets them (see
        ``actors/shared_pool.py`` ``kill_shared``). Needs ``name_prefix``. ``reservation``:
        the run's placement group, which holds this module's first actor
        (actors/reservation.py). ``indexes``:
        the actors a shared pool starts with (the run's live set), else ``0..replicas-1``.
        """
        opts = module.options
        if shared and name_prefix is None:
            raise PoolError("a shared actor pool needs a name_prefix (the run's actor names)")
        if shared and (opts.max_rss is not None or opts.max_batches is not None):
            print(f"rayorch: module {module.name!r}: max_rss/max_batches do not apply to the "
                  "actors that the drivers of a run share (they run other drivers' batches "
                  "too); its actors are not recycled", file=sys.stderr, flush=True)
        self.module = module
        self.binding = binding
        self.name_prefix = name_prefix
        self.shared = shared
        self.reservation = reservation
        self._bundle = None if reservation is None else reservation.bundle(module.name)
        self.inflight = opts.max_inflight
        # With a timeout a batch must start when submitted, so no pipelining.
        queued = 0 if opts.timeout_s is not None else 1
        self.depth = max(depth, self.inflight) if depth is not None else self.inflight + queued
        self.replaced = 0
        self.recycled: list[tuple[int, str]] = []  # (slot index, why), in order
        self.slots: list[ActorSlot] = []
        self._next_index = 0  # slot indexes (actor names) are never reused
        first = indexes or list(range(max(1, opts.replicas)))
        self._first = set(first)  # the slots of the pool as built
        self.cap: int | None = None  # set when an actor added by resize() failed to build
        self.start_times: list[float] = []  # seconds each recent actor took to start
        self._built = False  # an actor spawned later is spawned mid-run (orphan watch)
        self._grow(len(first), first)
        self._built = True
        self._said_late: set[tuple[int, int]] = set()
        self.ready_at: float | None = None if self.starting() else time.monotonic()
        """When every first actor was up (``time.monotonic()``); None while one starts."""

    # -- start-up -------------------------------------------------------------
    # A pool is usable as soon as it is made: the driver goes on (admits sources, takes
    # leases) while the actors start, and reserve() hands batches only to actors that are
    # up, so the first batches go to whichever replica starts first and none waits behind
    # a slow start (docs/topics/ACTORS.md, "Runtime details": start-up).
    def _start_ping(self, handle: Any) -> Any:
        """A ref that resolves once ``handle``'s actor has built its module."""
        return handle.ping.remote()

    def starting(self) -> list[Any]:
        """The start-up answers still awaited (the driver waits on them with its batches)."""
        return [slot.ping for slot in self.slots if not slot.ready]

    def _answered(self, refs: list[Any]) -> set[Any]:
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return set(done)

    def check_started(self, timeout_s: float | None = None) -> None:
        """Note the actors that are up. Raise :class:`PoolError` when a first actor's module
        failed to build, or when no actor of the pool is up ``timeout_s`` after its start;
        an actor that is late while another one serves is said once on stderr (the pool
        runs on the others meanwhile)."""
        waiting = [slot for slot in self.slots if not slot.ready]
        if not waiting:
            return
        timeout_s = start_timeout_s() if timeout_s is None else timeout_s
        answered = self._answered([slot.ping for slot in waiting])
        now = time.monotonic()
        for slot in waiting:
            if slot.ping in answered:
                ping, slot.ping = slot.ping, None
                self.start_times = [*self.start_times[-7:], now - slot.spawned]
                if slot.incarnation == 0 and slot.index in self._first:
                    self._raise_start_failure([ping])  # (a replacement's shows on its batches)
                elif slot.incarnation == 0:
                    self._grown_up(slot, ping)
        if self.reservation is not None and not self.reservation.placed():
            for slot in self.slots:  # start-up clocks run from the placement on
                slot.spawned = now
            return
        for slot in self.slots:
            if slot.ready or now - slot.spawned <= timeout_s:
                continue
            if not any(other.ready for other in self.slots):
                raise self._unscheduled(timeout_s)
            if (slot.index, slot.incarnation) not in self._said_late:
                self._said_late.add((slot.index, slot.incarnation))
                print(f"rayorch: actor {slot.index} of module {self.module.name!r} is not up "
                      f"{timeout_s:g}s after its start (the cluster lacks the resources it "
                      f"asks for: {self.describe_resources()}; or its constructor is slow); "
                      "the pool runs on the others until it is", file=sys.stderr, flush=True)
        if self.ready_at is None and not self.starting():
            self.ready_at = now

    def _unscheduled(self, timeout_s: float) -> PoolError:
        return PoolError(
            f"the actors of module {self.module.name!r} were not up within {timeout_s:g}s of "
            f"their start: the cluster lacks the resources they ask for "
            f"({self.describe_resources()}; lower replicas/num_gpus or add nodes), or their "
            f"constructor takes longer (a large model: set {START_TIMEOUT_ENV})"
        )

    def _raise_start_failure(self, refs: list[Any]) -> None:
        """``ray.get`` the start-up answers; a module that failed to build is a PoolError."""
        try:
            ray.get(refs)
        except ray.exceptions.RayError as exc:
            if "No module named" in str(exc):
                raise PoolError(
                    f"the actors of module {self.module.name!r} cannot import the code of "
                    f"{self.module.target_name!r}: {first_line_with(exc, 'No module named')}. "
                    "Ray workers do not see your script's sys.path: install your code as a "
                    "package, start Ray with runtime_env={'working_dir': ...} (or PYTHONPATH), "
                    "or call ray.cloudpickle.register_pickle_by_value(your_module)"
                ) from exc
            raise PoolError(
                f"building module {self.module.name!r} in its actor failed: "
                f"{raised_line(exc)}; check the module's constructor and arguments"
            ) from exc

    # -- actors ---------------------------------------------------------------
    def _spawn(self, index: int, incarnation: int) -> Any:
        opts = self.module.options
        options: dict[str, Any] = {
            "num_cpus": opts.num_cpus,
            "num_gpus": opts.num_gpus,
            "max_restarts": 0,
            "max_task_retries": 0,
            "max_concurrency": opts.max_inflight,
        }
        if opts.resources:
            options["resources"] = dict(opts.resources)
        if index == 0 and self._bundle is not None and self.reservation is not None:
            options["scheduling_strategy"] = self.reservation.strategy(self._bundle)
        # The module's ray_options (runtime_env, memory, max_restarts, scheduling_strategy,
        # ...) pass through unchanged; the compiler refused the ones rayorch owns.
        options.update(dict(opts.ray_options))
        binding = self.binding
        if self.shared:
            options.update(name=self.shared_name(index), namespace=SHARED_NAMESPACE,
                           lifetime="detached", get_if_exists=True)
            if binding is not None:  # detached: it must leave by itself once orphaned
                binding = replace(binding, orphan_grace_s=orphan_grace_s(),
                                  orphan_driver_seen=self._built)
        elif self.name_prefix is not None:
            options["name"] = f"{self.name_prefix}:{self.module.name}:{index}:{incarnation}"
        # The --storage-option settings go to the actor in memory (never in the store).
        return RemoteWorker.options(**options).remote(self.module, binding,
                                                      storage_options() or None)

    def _fetch(self, batch: InFlightBatch) -> BatchResult:
        """The batch's result (raises ``ray.exceptions.RayError`` when its actor died)."""
        return ray.get(batch.ref)  # type: ignore[no-any-return]

    def _kill(self, handle: Any) -> None:
        with contextlib.suppress(ValueError):  # already gone
            ray.kill(handle, no_restart=True)

    def shared_name(self, index: int) -> str:
        """The Ray name of slot ``index``'s shared actor."""
        return f"{self.name_prefix}:{self.module.name}:{index}"

    def _await_name_released(self, slot: ActorSlot, timeout_s: float = 5.0) -> None:
        """Wait until the slot's name no longer points at the dead actor we just killed."""
        old_id = getattr(slot.handle, "_actor_id", None)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                current = ray.get_actor(self.shared_name(slot.index), namespace=SHARED_NAMESPACE)
            except ValueError:
                return
            if getattr(current, "_actor_id", None) != old_id:
                return
            time.sleep(0.05)

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Block until every actor has built its user target (raises on failure)."""
        timeout_s = start_timeout_s() if timeout_s is None else timeout_s
        # Each actor's start-up answer (asked for when it was spawned); one that is already
        # up is asked again: a shared actor may have been killed by another driver since.
        refs = [slot.ping or slot.handle.ping.remote() for slot in self.slots]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if pending:
            raise self._unscheduled(timeout_s)
        if not self.shared:
            self._raise_start_failure(ready)
        else:
            # Shared actors may be killed while another driver uses them: replace those.
            for slot, ref in zip(self.slots, refs):
                for attempt in range(5):
                    try:
                        ray.get(ref, timeout=timeout_s)
                        break
                    except ray.exceptions.RayActorError as exc:
                        if attempt == 4 or "process has died" not in str(exc):
                            self._raise_start_failure([ref])
                        self.replace(slot)
                        ref = slot.ping
                    except ray.exceptions.RayError:
                        self._raise_start_failure([ref])
        for slot in self.slots:
            slot.ping = None
        self.ready_at = self.ready_at or time.monotonic()

    def describe_resources(self) -> str:
        opts = self.module.options
        parts = [f"replicas={opts.replicas_text}", f"num_cpus={opts.num_cpus}"]
        if opts.num_gpus:
            parts.append(f"num_gpus={opts.num_gpus}")
        parts.extend(f"{k}={v}" for k, v in opts.resources)
        return ", ".join(parts)

    # -- size -----------------------------------------------------------------------------
    def _grow(self, count: int, indexes: list[int] | None = None) -> None:
        for index in indexes or range(self._next_index, self._next_index + count):
            self._next_index = max(self._next_index, index + 1)
            slot = ActorSlot(index, self._spawn(index, 0))
            slot.ping = self._start_ping(slot.handle)
            self.slots.append(slot)

    def _grown_up(self, slot: ActorSlot, ping: Any) -> None:
        """An actor :meth:`resize` added answered: if its module failed to build, it goes
        and no more are added (said once); the run goes on."""
        try:
            ray.get(ping)
        except ray.exceptions.RayError as exc:
            self._kill(slot.handle)
            self.slots.remove(slot)
            if self.cap is None:
                print(f"rayorch: an actor added to the pool of module {self.module.name!r} "
                      f"failed to build ({raised_line(exc)}); no more are added to it",
                      file=sys.stderr, flush=True)
            self.cap = min(self.cap or len(self.slots), len(self.live_slots()))

    def live_slots(self) -> list[ActorSlot]:
        """The slots that take batches (not draining)."""
        return [slot for slot in self.slots if not slot.draining]

    def resize(self, size: int) -> None:
        """Start actors up to ``size``, or drain the surplus: a starting actor first, then an
        idle one, then the least loaded; a draining one leaves once its batches are back."""
        if self.shared:
            raise PoolError(f"the pool of module {self.module.name!r} is shared by the run's "
                            "drivers: it follows the run's live set (actors/shared_pool.py)")
        live = self.live_slots()
        if self.cap is not None:
            size = min(size, self.cap)
        if size > len(live):
            self._grow(size - len(live))
            return
        for slot in self.drain_order()[: len(live) - max(1, size)]:
            slot.draining = True
        self.retire()

    def drain_order(self) -> list[ActorSlot]:
        """The live slots in the order a shrink drains them: starting ones, then the least
        loaded, the newest first among equals."""
        return sorted(self.live_slots(),
                      key=lambda s: (s.ready, len(s.queue) + s.reserved, -s.index))

    def retire(self) -> None:
        """Kill the draining actors whose batches are all back (a shared pool's are only
        let go of: the run's leader kills them once no driver holds them, see
        actors/shared_pool.py)."""
        for slot in [s for s in self.slots if s.draining and not s.queue and not s.reserved]:
            if not self.shared:
                self._kill(slot.handle)
            self.slots.remove(slot)

    def replace(self, slot: ActorSlot, *, count: bool = True) -> None:
        """Kill the slot's actor and start a fresh one (a draining slot just goes);
        ``count``: a replacement after a failure (not a recycling).

        Batches still queued on the old actor stay in flight as far as the driver
        knows; their refs resolve (with a result or an actor error) and are handed
        to :meth:`finish` like any other.
        """
        for batch in slot.queue:
            batch.kill_cause = batch.kill_cause or f"actor of {self.module.name!r} was replaced"
        slot.queue.clear()
        self._kill(slot.handle)
        if slot.draining:
            if slot in self.slots:
                self.slots.remove(slot)
            return
        if self.shared:
            # Another driver may have replaced it already: then get_if_exists finds that one.
            self._await_name_released(slot)
        slot.incarnation += 1
        slot.handle = self._spawn(slot.index, slot.incarnation)
        slot.ping, slot.spawned = self._start_ping(slot.handle), time.monotonic()
        slot.batches, slot.recycle = 0, None
        self.replaced += count

    def shutdown(self) -> None:
        """Kill every actor of the pool (a shared pool's actors are left to the other drivers)."""
        reservation, self.reservation = self.reservation, None
        for slot in self.slots:
            if self.shared:
                slot.queue.clear()
                continue
            self._kill(slot.handle)
            slot.queue.clear()
        if reservation is not None:
            reservation.release()

    def settle(self, timeout_s: float = 30.0) -> None:
        """Make the pool ready for another run (a warm ``Executor``'s pools serve many).

        Batches a closed run left queued are waited for and dropped; an actor whose
        batches do not finish within ``timeout_s`` is replaced.
        """
        for slot in self.slots:
            slot.reserved = 0
            if not slot.queue:
                continue
            refs = [batch.ref for batch in slot.queue]
            _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
            if pending:
                self.replace(slot)
            slot.queue.clear()

    # -- batches --------------------------------------------------------------
    def reserve(self) -> ActorSlot | None:
        """Promise the next batch to the least-loaded actor that is up and has room; None
        when there is none (an actor still starting gets batches once it answers)."""
        self.check_started()
        self._recycle_idle()
        best: ActorSlot | None = None
        for slot in self.slots:
            load = len(slot.queue) + slot.reserved
            spent = self.module.options.max_batches  # none past it, queued ones included
            if (load >= self.depth or not slot.ready or slot.draining or slot.recycle
                    or (spent is not None and slot.batches + load >= spent)
                    or _holds_alone(slot)):
                continue
            if best is None or load < len(best.queue) + best.reserved:
                best = slot
        if best is not None:
            best.reserved += 1
        return best

    def unreserve(self, slot: ActorSlot) -> None:
        """Take back a promise made by :meth:`reserve` (no batch after all)."""
        slot.reserved -= 1

    def idle(self, slot: ActorSlot) -> bool:
        """Whether ``slot`` (reserved once) holds nothing else: no batch, no other promise.

        Only this driver's batches are known: an actor shared with other drivers may run
        theirs too (a crash retry is then not quite alone; core/crash_split.py bounds it)."""
        return not slot.queue and slot.reserved <= 1

    def capacity(self) -> int:
        """How many more batches the pool accepts now."""
        return sum(self.depth - len(s.queue) - s.reserved for s in self.live_slots()
                   if not s.recycle)

    def in_flight(self) -> int:
        return sum(len(slot.queue) for slot in self.slots)

    def submit(self, slot: ActorSlot, task: BatchTask, alone: bool = False) -> InFlightBatch:
        """Send ``task`` to ``slot``'s actor (reserved with :meth:`reserve`); ``alone``: the
        actor takes no other batch until this one is back."""
        slot.reserved = max(0, slot.reserved - 1)
        now = time.monotonic()
        ref = slot.handle.run_batch.remote(task)
        started = now if len(slot.queue) < self.inflight else None
        batch = InFlightBatch(ref, task, slot, slot.incarnation, now, started, alone=alone)
        slot.queue.append(batch)
        return batch

    def finish(self, batch: InFlightBatch) -> BatchOutcome:
        """Collect a batch whose ref is ready; replaces its actor after a physical failure.
        A draining actor whose last batch this was leaves now."""
        try:
            return self._finish(batch)
        finally:
            if batch.slot.draining:
                self.retire()
            self._recycle_idle()

    def _finish(self, batch: InFlightBatch) -> BatchOutcome:
        slot = batch.slot
        current = batch.incarnation == slot.incarnation and batch in slot.queue
        if current:
            slot.queue.remove(batch)
            for running in slot.queue[: self.inflight]:  # the oldest ones run
                if running.started is None:
                    running.started = time.monotonic()
        try:
            result: BatchResult = self._fetch(batch)
        except ray.exceptions.RayError as exc:
            self.check_started()  # a module that never built is the run's error, not a retry
            cause = batch.kill_cause or (
                f"actor of {self.module.name!r} died: {type(exc).__name__}: {first_line(exc)}"
            )
            if current:
                # Every batch queued on the dead actor died with it, for the same reason.
                for queued in slot.queue:
                    queued.kill_cause = queued.kill_cause or cause
                self.replace(slot)
            return BatchOutcome(batch, None, cause, crashed=not batch.timed_out)
        if result.physical_failure is not None:
            if current:
                # The UDF said its actor is broken (ro.ActorFailure): replace it now, like a
                # crash; the batches queued on it come back as physical failures.
                cause = f"actor of {self.module.name!r} was replaced: {result.physical_failure}"
                for queued in slot.queue:
                    queued.kill_cause = queued.kill_cause or cause
                self.replace(slot)
            return BatchOutcome(batch, result, result.physical_failure)
        if current:
            slot.batches += 1
            slot.recycle = slot.recycle or self._over_limit(slot, result.rss_bytes)
        return BatchOutcome(batch, result, None)

    # -- recycling (max_rss, max_batches) ----------------------------------------------------
    def _over_limit(self, slot: ActorSlot, rss: int) -> str | None:
        """Why the slot's actor must be recycled after this batch, or None."""
        opts = self.module.options
        if self.shared:
            return None  # said once at the pool's start (__init__)
        if opts.max_rss is not None and rss > opts.max_rss:
            return (f"recycled actor {slot.index}: RSS {format_byte_size(rss)} over max_rss "
                    f"{format_byte_size(opts.max_rss)} after {slot.batches} batches")
        if opts.max_batches is not None and slot.batches >= opts.max_batches:
            return f"recycled actor {slot.index}: max_batches={opts.max_batches} reached"
        return None

    def _recycle_idle(self) -> None:
        """Replace each actor marked for recycling once its batches are all back: it took
        no new one since (so none is lost or run twice), and a fresh one takes its place.
        A shared pool's actors are never recycled (other drivers' batches may run there)."""
        for slot in self.slots:
            if slot.recycle and not slot.queue and not slot.reserved and not slot.draining:
                why, slot.recycle = slot.recycle, None
                slot.batches = 0
                self.recycled.append((slot.index, why))
                self.replace(slot, count=False)

    def overdue(self, now: float | None = None) -> list[InFlightBatch]:
        """Batches running longer than ``timeout_s`` (none when no timeout is set): a slot's
        oldest batch started first, so it is the one to look at."""
        timeout = self.module.options.timeout_s
        if timeout is None:
            return []
        now = time.monotonic() if now is None else now
        return [
            slot.queue[0]
            for slot in self.slots
            if slot.queue
            and slot.queue[0].started is not None
            and now - slot.queue[0].started > timeout
        ]

    def time_out(self, batch: InFlightBatch) -> None:
        """Kill the actor running the overdue ``batch`` and start a fresh one."""
        timeout = self.module.options.timeout_s
        batch.kill_cause = f"batch of {self.module.name!r} ran past timeout_s={timeout}"
        batch.timed_out = True
        self.replace(batch.slot)


def _holds_alone(slot: ActorSlot) -> bool:
    return any(batch.alone for batch in slot.queue)
