"""Where a driver's sources come from and where its outputs go.

Feeds (sources in):

* :class:`IteratorFeed` — ``Pipeline.run``'s inputs, read once, in index order (or in
  an ``admission_order`` of input positions: a source's index is its input position
  whatever order it is admitted in); the rows pulled but not yet known to be in the
  store are kept so a shard rebuilt after a store outage re-admits them (nothing read
  from a generator is lost).
  ``IteratorFeed.indexed`` takes ``(id, values, identity)`` rows instead: a streamed
  listing whose ids were assigned (and identities read) as it was listed.
* :class:`ManifestFeed` — the sources recorded in a run's manifest (``rayorch
  driver``/``resume``, ``join_run``): each shard's indexes not yet admitted.

Sinks (outputs out; docs/ARCHITECTURE.md, "Delivery"):

* :class:`CallerSink` — the caller's iterator. An output is delivered when the caller
  asks for the next item (or closes the iterator normally); buffering for
  ``ordered=True`` is not delivery.
* a file sink (:mod:`rayorch.runtime.sinks`) — delivered after the atomic write of
  its part file; the driver then records ``OutputEmitted`` (fenced).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from rayorch.core.index_set import IndexSet
from rayorch.core.machine import OutputReady
from rayorch.storage import row_identity
from rayorch.store.base import RunInfo

Row = tuple[int, tuple[Any, ...], str | None]
"""``(index, values, identity)``: a source as admitted (``SourceAdmitted``)."""
Identities = Sequence[str | None]


def _identity(identities: Identities | None, index: int, values: tuple[Any, ...]) -> str | None:
    """The identity the listing gave source ``index``, else what metadata says of the files
    its values name (a local file's stat; an object's is unknown): never a byte read."""
    if identities is not None:
        return identities[index]
    return row_identity(values)


class IteratorFeed:
    """Sources read from an iterator in index order, micro-batch by micro-batch.

    With ``order`` (distinct input positions, e.g. the largest files first) the inputs
    are read into a list and only those positions are admitted, in that order, each
    under its input position as index; an admission then takes up to ``micro_batch``
    sources of one shard. ``identities``: each input position's identity as its listing
    gave it (``SourceAdmitted.identity``).
    """

    def __init__(self, rows: Iterator[tuple[Any, ...]], info: RunInfo,
                 total: int | None, order: Sequence[int] | None = None,
                 identities: Identities | None = None) -> None:
        self._info = info
        positions: Iterator[tuple[int, tuple[Any, ...]]]
        if order is None:
            positions = enumerate(rows)
            self.total = total
        else:
            table = list(rows)
            positions = ((i, table[i]) for i in order)
            self.total = len(order)
        # Each row's identity is found as it is peeked (one source ahead of admission).
        self._rows: Iterator[Row] = (
            (index, tuple(values), _identity(identities, index, tuple(values)))
            for index, values in positions)
        self._in_order = order is None
        self._taken = 0
        self._peeked: list[Row] = []
        self._ended = False
        self._requeued: dict[int, deque[Row]] = {}
        # Per shard, every row taken and not yet delivered: a store that goes back may
        # forget an admission it acknowledged, and the iterator cannot give the row again.
        self._kept: dict[int, dict[int, Row]] = {}

    @classmethod
    def indexed(cls, rows: Iterable[Row], info: RunInfo) -> IteratorFeed:
        """Sources given as ``(id, values, identity)`` in admission order, read lazily (a
        streamed listing: :mod:`rayorch.pipelines.inputs`); the total is not known up
        front."""
        feed = cls(iter(()), info, None)
        feed._rows = iter(rows)
        feed._in_order = False
        return feed

    def _peek(self) -> bool:
        if not self._peeked and not self._ended:
            self._peeked = list(itertools.islice(self._rows, 1))
            self._ended = not self._peeked
        return bool(self._peeked)

    def take(self, shard: int, limit: int) -> list[Row]:
        """Up to ``limit`` next sources if they belong to ``shard`` (never past a micro-batch)."""
        again = self._requeued.get(shard)
        if again:
            return [again.popleft() for _ in range(min(limit, len(again)))]  # still kept
        taken: list[Row] = []
        micro = self._info.micro_batch
        while (len(taken) < limit and self._peek()
               and self._info.shard_of(self._peeked[0][0]) == shard):
            row = self._peeked.pop()
            index = row[0]
            taken.append(row)
            self._taken += 1
            if (index + 1 if self._in_order else self._taken) % micro == 0:
                break
        if taken:
            self._kept.setdefault(shard, {}).update((row[0], row) for row in taken)
        return taken

    def exhausted(self, shard: int) -> bool:
        return not self._requeued.get(shard) and not self._peek()

    def delivered(self, shard: int, indexes: Sequence[int]) -> None:
        """The store has the ``OutputEmitted`` of these sources: their rows may go."""
        kept = self._kept.get(shard)
        if kept:
            for index in indexes:
                kept.pop(index, None)

    def reset(self, shard: int, admitted: set[int]) -> None:
        """``shard`` was rebuilt from the store: offer again what the store does not have
        (never handed to it, or forgotten by a store that went back)."""
        kept = self._kept.get(shard, {})
        lost = sorted(row for index, row in kept.items() if index not in admitted)
        if lost:
            self._requeued[shard] = deque(lost)
        else:
            self._requeued.pop(shard, None)

    def shard_total(self, shard: int) -> int | None:
        return None


class ManifestFeed:
    """The sources of a recorded run, per shard, minus those the store shows admitted.

    A shard's indexes are computed from the sharding rule (runs of ``micro_batch``), not
    listed, and the admitted ones are kept as ranges: the feed adds nothing per source
    to the manifest it reads from (docs/ARCHITECTURE.md, "Bounded driver memory").
    """

    def __init__(self, sources: Sequence[tuple[Any, ...]], info: RunInfo,
                 identities: Identities | None = None) -> None:
        self._sources = sources
        self._identities = identities
        self._info = info
        self.total: int | None = len(sources)
        self._pending: dict[int, Iterator[int]] = {}
        self._next: dict[int, int | None] = {}  # the next index to admit, per shard

    def _starts(self, shard: int) -> range:
        """The first index of each of ``shard``'s micro-batch runs."""
        micro = self._info.micro_batch
        return range(shard * micro, len(self._sources), micro * self._info.shards)

    def _indexes(self, shard: int) -> Iterator[int]:
        end, micro = len(self._sources), self._info.micro_batch
        for start in self._starts(shard):
            yield from range(start, min(start + micro, end))

    def shard_total(self, shard: int) -> int:
        end, micro = len(self._sources), self._info.micro_batch
        return sum(min(micro, end - start) for start in self._starts(shard))

    def reset(self, shard: int, admitted: set[int]) -> None:
        done = IndexSet(sorted(admitted))
        pending = (i for i in self._indexes(shard) if i not in done)
        self._pending[shard] = pending
        self._next[shard] = next(pending, None)

    def take(self, shard: int, limit: int) -> list[Row]:
        index = self._next.get(shard)
        if index is None:
            return []
        pending = self._pending[shard]
        out: list[Row] = []
        while index is not None and len(out) < limit:
            values = tuple(self._sources[index])
            out.append((index, values, _identity(self._identities, index, values)))
            index = next(pending, None)
        self._next[shard] = index
        return out

    def exhausted(self, shard: int) -> bool:
        return self._next.get(shard) is None

    def delivered(self, shard: int, indexes: Sequence[int]) -> None:
        """Nothing to keep: the manifest holds every source."""


Feed = IteratorFeed | ManifestFeed


class CallerSink:
    """Outputs for the caller's iterator: in source order (``ordered``) or as they finish."""

    name = "caller"

    def __init__(self, ordered: bool, indexes: Sequence[int] | None = None) -> None:
        self.ordered = ordered
        self._waiting: dict[int, tuple[int, OutputReady]] = {}
        self._order: deque[int] = deque()
        # In order: the sources' indexes ascending (0, 1, 2, ... unless ``indexes``).
        self._sequence: Iterator[int] = iter(sorted(indexes)) if indexes is not None \
            else itertools.count()
        self._next: int | None = next(self._sequence, None)

    def offer(self, shard: int, ready: OutputReady) -> None:
        """A finished source (offered again after a rebuild: kept once)."""
        if ready.index not in self._waiting:
            self._waiting[ready.index] = (shard, ready)
            self._order.append(ready.index)

    def take(self) -> Iterator[tuple[int, OutputReady]]:
        """What may be handed to the caller now, in order."""
        if not self.ordered:
            while self._order:
                index = self._order.popleft()
                entry = self._waiting.pop(index, None)
                if entry is not None:
                    yield entry
            return
        while self._next is not None and self._next in self._waiting:
            entry = self._waiting.pop(self._next)
            self._next = next(self._sequence, None)
            yield entry

    def drop_shard(self, shard: int) -> None:
        """Forget the outputs of a shard this driver no longer holds."""
        for index in [i for i, (k, _) in self._waiting.items() if k == shard]:
            del self._waiting[index]


__all__ = ["CallerSink", "Feed", "IteratorFeed", "ManifestFeed", "Row"]
