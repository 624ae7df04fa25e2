"""Deliveries to a file sink, off the driver's loop (docs/topics/FILE-SINKS.md, "File sinks").

Writing a delivery (a source's own files, then its part file: :meth:`FileSink.deliver`) is
object-store I/O; done on the driver's loop it bounds the run by the store's latency. A
:class:`DeliveryWriter` runs each delivery on a small thread pool instead, and the loop
records the result (the fenced ``OutputEmitted``) when it collects it. What exactly-once
rests on is unchanged: the part is published whole (a conditional create) before its facts
are appended, a refused append discards it, and a part whose facts never landed is adopted
by the shard's next reader (:meth:`FileSink.deliver` reads a shard's parts when it is
rebuilt).

Rules the driver keeps (``runtime/shard_driver.py``):

* one delivery per shard at a time (a shard's parts are written in order, and the sink's
  per-shard state is touched by one thread), of at most :data:`PART_RECORDS` sources; at
  most ``lanes`` deliveries in flight in all: the loop submits no more and the outputs wait
  in the shard's queue; past :data:`WAITING_MAX` waiting outputs the shard admits no more
  sources (backpressure: the driver's memory stays bounded when the store is slow);
* before a shard is rebuilt (:meth:`reset`) its delivery in flight ends and its result is
  dropped: the rebuilt shard finds the part on storage and adopts it;
* a delivery that failed surfaces on the loop with its cause (:attr:`Delivery.error`).

``lanes=0`` delivers on the caller's thread at :meth:`submit` (the in-process executor,
the simulator: deterministic runs).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from rayorch.core.facts import OutputEmitted
from rayorch.core.machine import OutputDelivered, OutputReady
from rayorch.runtime.ports import Sink
from rayorch.store.base import LineageStore
from rayorch.store.errors import StoreUnavailableError

DELIVERY_LANES = 4
"""Deliveries in flight at most for a Ray driver (one per shard at a time)."""
PART_RECORDS = 512
"""Sources one delivery (one part file) holds at most."""
WAITING_MAX = 2 * PART_RECORDS
"""Finished sources of a shard waiting for the writer (queued and in flight) past which the
driver admits no more sources to it: the outputs it holds stay bounded when the store is
slower than the pools."""
RENDER_THREADS = 8
"""Threads a file sink writes one delivery's own files with (a job's ``.md``, figures)."""


@dataclass(frozen=True)
class Delivery:
    """One delivery of a shard's finished sources: its events, or the error that stopped it."""

    shard: int
    owner: Any  # what the driver held the shard as when it submitted (its ShardState)
    ready: tuple[OutputReady, ...]
    events: tuple[OutputDelivered, ...] = ()
    error: BaseException | None = None


class DeliveryWriter:
    """Runs :meth:`Sink.deliver` on ``lanes`` threads; see the module doc."""

    def __init__(self, sink: Sink, lanes: int = 4) -> None:
        self.sink = sink
        self.lanes = max(0, lanes)
        self._pool = (ThreadPoolExecutor(self.lanes, thread_name_prefix="rayorch-deliver")
                      if self.lanes else None)
        self._running: dict[int, Future[Delivery]] = {}  # shard -> its delivery in flight
        self._flying: dict[int, int] = {}  # shard -> sources in its delivery in flight
        self._done: deque[Delivery] = deque()  # finished inline (lanes=0)

    def busy(self, shard: int) -> bool:
        """A delivery of ``shard`` is in flight."""
        return shard in self._running

    def behind(self, shard: int, queued: int) -> bool:
        """Whether ``shard`` has too many outputs waiting (``queued`` in its queue, and its
        delivery in flight) to admit more sources now (:data:`WAITING_MAX`)."""
        return queued + self._flying.get(shard, 0) >= WAITING_MAX

    def room(self) -> bool:
        """Whether another delivery may start now (fewer than ``lanes`` in flight)."""
        return self._pool is None or len(self._running) < self.lanes

    def pending(self) -> int:
        """Deliveries in flight or finished and not yet collected."""
        return len(self._running) + len(self._done)

    def submit(self, shard: int, owner: Any, ready: list[OutputReady], acked: int, *,
               seal: bool = False) -> None:
        """Deliver ``ready`` (outputs of ``shard``, held as ``owner``), or with ``seal``
        publish what the sink's spool holds of ``shard`` (:meth:`Sink.seal`); :meth:`collect`
        gives the result."""
        if shard in self._running:
            raise RuntimeError(f"shard {shard} has a delivery in flight already")
        job = (shard, owner, tuple(ready), acked, seal)
        if self._pool is None:
            self._done.append(self._deliver(*job))
        else:
            self._running[shard] = self._pool.submit(self._deliver, *job)
            self._flying[shard] = len(ready)

    def _deliver(self, shard: int, owner: Any, ready: tuple[OutputReady, ...], acked: int,
                 seal: bool) -> Delivery:
        try:
            events = (self.sink.seal(shard, acked=acked) if seal
                      else self.sink.deliver(shard, ready, acked=acked))
        except BaseException as exc:  # surfaced on the driver's loop, cause and all
            return Delivery(shard, owner, ready, error=exc)
        return Delivery(shard, owner, ready, tuple(events))

    def collect(self, timeout: float = 0.0) -> list[Delivery]:
        """The deliveries that finished, waiting up to ``timeout`` seconds for one when
        none has."""
        if self._running and not self._done and timeout > 0:
            wait(list(self._running.values()), timeout=timeout, return_when=FIRST_COMPLETED)
        for shard, future in list(self._running.items()):
            if future.done():
                del self._running[shard]
                self._flying.pop(shard, None)
                self._done.append(future.result())
        out = list(self._done)
        self._done.clear()
        return out

    def reset(self, shard: int) -> None:
        """``shard`` is rebuilt from the store: wait for its delivery in flight, drop its
        result, and have the sink read the shard's parts again (what the delivery wrote is
        found there and adopted, never written twice)."""
        future = self._running.pop(shard, None)
        self._flying.pop(shard, None)
        if future is not None:
            wait([future])
        kept = [d for d in self._done if d.shard != shard]
        self._done.clear()
        self._done.extend(kept)
        self.sink.reset(shard)

    def refused(self, store: LineageStore, run_id: str, shard: int,
                events: Sequence[OutputDelivered]) -> None:
        """The fenced append of ``events`` was refused: discard the parts the store holds
        no record of.

        A retry after a lost reply is refused once another driver appended, though the
        first try landed: a part its record names stays. When the store cannot say, every
        part stays (a part no fact names is adopted by the next holder, never lost)."""
        try:
            stored = {(fact.index, fact.sink) for s in store.iter_facts(run_id, shard)
                      if isinstance(fact := s.fact, OutputEmitted)}
        except StoreUnavailableError:
            return
        self.sink.discard([e for e in events if (e.index, e.sink) not in stored])

    def close(self) -> None:
        """Wait for the deliveries in flight (their parts stay: a resume adopts them)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._running.clear()
        self._done.clear()


__all__ = ["DELIVERY_LANES", "PART_RECORDS", "RENDER_THREADS", "WAITING_MAX", "Delivery",
           "DeliveryWriter"]
