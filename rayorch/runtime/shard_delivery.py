"""The delivery side of the driver's loop: held shards' ready outputs to the caller or a sink.

A shard's machine says a source is finished (``OutputReady``); :class:`ShardDelivery`
hands it on and feeds the machine its ``OutputDelivered``, whose ``OutputEmitted`` the
driver appends like any fact (docs/ARCHITECTURE.md, "One driver", "File sinks"):

* to the caller's iterator (``Pipeline.run``, ``join_run`` without a sink): one output at a
  time; the caller asking for the next item acknowledges the one it holds, and that fact
  is written before the next is handed (at most the one held output is delivered twice
  after a crash);
* to a file sink through the :class:`~rayorch.runtime.delivery_writer.DeliveryWriter`:
  parts written off the loop, one delivery per shard at a time, their facts appended when
  the part is published; a refused append takes the part back.

Every write to a shard runs under the driver's guard (a fenced write drops the shard)
after its queued facts are appended, fenced: a deposed driver writes neither a part nor
its facts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.core.index_set import IndexSet
from rayorch.core.machine import Instruction, OutputDelivered, OutputReady
from rayorch.progress import RunStats
from rayorch.runtime.delivery import CallerSink
from rayorch.runtime.delivery_writer import PART_RECORDS, DeliveryWriter
from rayorch.runtime.ports import Sink
from rayorch.runtime.replica_state import HeldShards, ReplicaStats, ShardState
from rayorch.runtime.shard_leases import ShardLeases
from rayorch.store.base import LineageStore
from rayorch.store.errors import FencedError, LeaseLostError, StoreUnavailableError


class ShardDelivery:
    """Delivers the ready outputs of the driver's held ``shards`` to ``sink`` (a file sink
    through a :class:`DeliveryWriter` with ``lanes`` lanes, or the caller's
    :class:`CallerSink`); see the module doc.

    ``perform`` feeds a shard's machine's instructions back to the driver; ``flush``
    appends a shard's queued facts (fenced). ``moved`` is set when a call did something
    (the driver clears it each turn of its loop).
    """

    def __init__(self, sink: Sink | CallerSink, *, lanes: int, shards: HeldShards,
                 leases: ShardLeases, store: LineageStore, run_id: str,
                 clock: Callable[[], float], counters: ReplicaStats, stats: RunStats,
                 perform: Callable[[ShardState, list[Instruction]], object],
                 flush: Callable[[ShardState], None]) -> None:
        self.sink, self.shards, self.leases = sink, shards, leases
        self.store, self.run_id = store, run_id
        self._now = clock  # fact timestamps
        self.counters, self.stats = counters, stats
        self._perform, self._flush = perform, flush
        self._guard = leases.guard  # a write to one shard: losing it drops the shard
        self.writer = None if isinstance(sink, CallerSink) else DeliveryWriter(sink, lanes)
        self.moved = False
        self._held: tuple[int, OutputReady] | None = None  # handed to the caller, not acked
        # Outputs the caller has whose OutputEmitted is not known to be written (a store
        # outage hit the write): a shard rebuilt meanwhile records them, never re-delivers.
        self._acked: dict[int, OutputDelivered] = {}
        self._handed = IndexSet()  # every source handed to the caller (a rollback may forget)

    # == what the driver's loop asks ========================================================
    def behind(self, k: int, queued: int) -> bool:
        """Whether shard ``k``'s outputs waiting for the writer hold its admission back."""
        return self.writer is not None and self.writer.behind(k, queued)

    def pending(self) -> int:
        """Deliveries to a file sink in flight or finished and not yet recorded."""
        return 0 if self.writer is None else self.writer.pending()

    def reset(self, k: int) -> None:
        """Shard ``k`` was rebuilt: the parts of a dead holder or a rolled-back store are
        read again."""
        if self.writer is not None:
            self.writer.reset(k)

    def forget(self, k: int) -> None:
        """Shard ``k`` is lost: drop what the caller sink buffered of it."""
        if isinstance(self.sink, CallerSink):
            self.sink.drop_shard(k)

    def recorded(self, indexes: Sequence[int]) -> None:
        """The ``OutputEmitted`` of these sources are written."""
        for index in indexes:
            self._acked.pop(index, None)

    def acknowledge_held(self) -> None:
        """The caller closed the iterator normally: the output it holds is delivered."""
        if self._held is not None:
            with contextlib.suppress(RayorchError, StoreUnavailableError):
                self._acknowledge()

    def close(self) -> None:
        """Wait for the deliveries in flight (their parts stay: a resume adopts them)."""
        if self.writer is not None:
            self.writer.close()

    # == delivery ============================================================================
    def deliver(self) -> Iterator[tuple[int, Any]]:
        """One turn's delivery; yields what the caller sink delivers (and, for a file sink,
        what this driver recorded)."""
        if isinstance(self.sink, CallerSink):
            yield from self._deliver_to_caller(self.sink)
            return
        writer = self.writer
        assert writer is not None  # a file sink's
        for k, st in list(self.shards.items()):
            if not st.ready or writer.busy(k) or not writer.room() \
                    or not self.leases.still_held(k):  # a paused driver learns it lost k
                continue  # one delivery per shard at a time; at most ``lanes`` in all
            ready, st.ready = st.ready[:PART_RECORDS], st.ready[PART_RECORDS:]
            self.moved = True
            with self._guard(k):
                self._flush(st)  # fenced: a deposed driver writes no part
                # (the part's name records what the store acknowledged: audit's rollback check)
                writer.submit(k, st, ready, self.shards.known_seq(k))
        yield from self.record()

    def record(self, wait_s: float = 0.0) -> Iterator[tuple[int, Any]]:
        """Append the ``OutputEmitted`` of the deliveries the writer finished (fenced),
        waiting up to ``wait_s`` for one."""
        writer = self.writer
        assert writer is not None  # a file sink's
        for done in writer.collect(wait_s):
            if done.error is not None:
                raise done.error
            k, st = done.shard, self.shards.get(done.shard)
            if st is not done.owner:
                continue  # the shard was lost: its next holder adopts the part
            self.moved = True
            recorded: Sequence[OutputReady] = ()  # what the store took: a refusal yields none
            with self._guard(k):
                self._perform(st, st.machine.handle(*done.events))
                try:
                    self._flush(st)  # fenced: a deposed driver's OutputEmitted never lands
                except (LeaseLostError, FencedError):
                    writer.refused(self.store, self.run_id, k, done.events)
                    raise
                self._delivered(len(done.events))
                recorded = done.ready
            for r in recorded:  # for a ReplicaHandle's caller: what this driver delivered
                yield r.index, r.value

    def seal(self, k: int, st: ShardState) -> None:
        """A shard whose every source is complete but some wait in the sink's spool for a
        part of their size: the writer publishes them as its last part of the shard."""
        writer = self.writer
        if writer is None or st.ready or st.machine.kernel.in_flight or writer.busy(k) \
                or not (st.machine.run_completed or st.draining) \
                or not writer.sink.spooled(k):
            return
        self.moved = True
        with self._guard(k):
            self._flush(st)  # fenced: a deposed driver writes no part
            writer.submit(k, st, [], self.shards.known_seq(k), seal=True)

    def _deliver_to_caller(self, sink: CallerSink) -> Iterator[tuple[int, Any]]:
        for k, st in self.shards.items():
            for ready in st.ready:
                acked = self._acked.get(ready.index)
                if acked is None and ready.index in self._handed:  # its fact was forgotten
                    acked = OutputDelivered(ready.index, ready.outcome, "caller", "", self._now())
                if acked is None:
                    sink.offer(k, ready)
                else:  # the caller has it already: only its fact is missing
                    self._perform(st, st.machine.handle(acked))
                    self._delivered(1)
            st.ready = []
        for k, ready in sink.take():
            if k not in self.shards:
                continue
            self.moved = True
            self.leases.ensure_fresh(k)  # a driver asleep past its TTL never emits
            self._held = (k, ready)
            self._handed.add(ready.index)
            yield ready.index, ready.value
            self._acknowledge()  # the caller asked for the next item: it has this one

    def _acknowledge(self) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        k, ready = held
        st = self.shards.get(k)
        if st is None:
            return
        event = OutputDelivered(ready.index, ready.outcome, "caller", "", self._now())
        self._acked[ready.index] = event  # until its fact is written
        with self._guard(k):
            self._perform(st, st.machine.handle(event))
            self._flush(st)  # at most the one held output is delivered twice after a crash
            self._delivered(1)

    def _delivered(self, count: int) -> None:
        self.counters.outputs_emitted += count
        self.stats.sources_done += count


__all__ = ["ShardDelivery"]
