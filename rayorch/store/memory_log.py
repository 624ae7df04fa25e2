"""One shard's facts in the memory store: a live tail, compressed segments, values freed.

The memory store lives in the driver's heap, so it keeps what the Redis store keeps in Redis
and no more (docs/topics/PAYLOADS.md, "Freeing values"; docs/topics/ARCHIVE.md):

* **Values** go when their source is delivered (its ``OutputEmitted`` is appended), by the
  run's ``keep`` (:func:`~rayorch.store.layout.keeps_value`; the memory store's default is
  ``none``): the fact then reads as its ``outline``, what the fold of a delivered source
  needs, as a freed payload segment reads on Redis (:func:`~rayorch.store.payload.is_freed`).
  Its Grains leave the Grain table, as the Redis archive's trim drops them; the table answers
  for them as sealed (:class:`GrainTable`), so a late report is ``SEALED`` and a dispatch of
  one refused, as before they left.
* **Facts** move, ``BLOCK`` at a time once the tail holds twice that, into segments in the
  archive's format (:func:`~rayorch.store.archive.encode_segment`: msgpack facts,
  compressed), like the Redis store's archive; a fact whose values are still needed (its
  source undelivered, or a value the run keeps) stays beside its segment as the object it
  is (its segment holds it slimmed, the outline in place of its outputs), and so does a fact
  the codec cannot store. Readers read segments and tail as one log.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from rayorch.core.errors import RayorchError
from rayorch.core.facts import (
    Fact,
    GrainCommitted,
    GrainReused,
    OutputEmitted,
    SourceAdmitted,
    holds_freed,
    outline_of,
)
from rayorch.core.ids import CallId, DomainId
from rayorch.core.index_set import IndexSet
from rayorch.core.vocabulary import GrainPhase
from rayorch.store.archive import ArchivedFact, decode_segment, encode_segment
from rayorch.store.base import StoredFact
from rayorch.store.gate import GrainEntry
from rayorch.store.records.facts import decode_fact, encode_fact

BLOCK = 2048
"""Facts per compressed segment; the tail holds up to ``2 * BLOCK`` facts as objects."""


def freed(fact: GrainCommitted) -> GrainCommitted:
    """The fact as a reader sees it once its values are freed: its outline as its outputs
    (the fact itself when its outline is its outputs: every value small)."""
    if fact.outputs is None or fact.outline is not None:
        return fact
    outline = outline_of(fact.outputs)
    if not holds_freed(outline):
        return fact
    return replace(fact, outputs=outline, outline=outline)


def _slim(fact: Fact) -> Fact:
    """What a segment holds of a fact: a commit's outline in place of its outputs."""
    if isinstance(fact, GrainCommitted):
        fact = freed(fact)
        if fact.outline is not None and fact.payload_ref is None:
            return replace(fact, outputs=None)
    return fact


def _unslim(fact: Fact) -> Fact:
    """A fact decoded from a segment as a reader sees it (see :func:`freed`)."""
    if isinstance(fact, GrainCommitted) and fact.outputs is None \
            and fact.outline is not None and fact.payload_ref is None:
        return replace(fact, outputs=fact.outline)
    return fact


def source_of(fact: Fact) -> int | None:
    """The source whose values ``fact`` carries (None: it carries none)."""
    if isinstance(fact, SourceAdmitted):
        return fact.index
    if isinstance(fact, GrainCommitted | GrainReused) and fact.outputs is not None:
        return fact.path[0]
    return None


def _source_of_field(key: str) -> int | None:
    """The source of a Grain field (``call|source.ordinal...``)."""
    root = key.rpartition("|")[2].partition(".")[0]
    return int(root) if root.isdigit() else None


class GrainTable(dict[str, GrainEntry]):
    """A shard's Grain table: the entries of undelivered sources, and a delivered source's
    Grains as sealed (they left the table; nothing of theirs is accepted again)."""

    def __init__(self) -> None:
        super().__init__()
        self.delivered = IndexSet()

    def get(self, key: str, default: GrainEntry | None = None) -> GrainEntry | None:  # type: ignore[override]
        entry = dict.get(self, key)
        if entry is not None:
            return entry
        if self.delivered and _source_of_field(key) in self.delivered:
            return _SEALED_LONG_AGO
        return default


_SEALED_LONG_AGO: GrainEntry = (GrainPhase.SEALED, -1)  # the generation is not kept


@dataclass
class _Segment:
    first: int
    last: int
    blob: bytes  # encode_segment of the slimmed facts the codec stores
    held: dict[int, StoredFact] = field(default_factory=dict)  # values still needed, by seq
    unstored: dict[int, StoredFact] = field(default_factory=dict)  # what the codec cannot


class ShardLog:
    """A shard's facts (seq 1..``last_seq``) and its Grain table, in the memory store."""

    def __init__(self, run_id: str, shard: int, kept: Callable[[CallId], bool]) -> None:
        self.run_id = run_id
        self.shard = shard
        self.kept = kept  # whether a value of the Call outlives its source's delivery
        self.grains = GrainTable()
        self.barriers: set[str] = set()
        self._segments: list[_Segment] = []
        self._firsts: list[int] = []
        self._base = 0  # seqs up to it are in segments
        self._live: list[StoredFact] = []
        self._by_domain: dict[DomainId, list[int]] = {}  # live seqs of each Domain
        self._holding: dict[int, list[int]] = {}  # undelivered source -> seqs of its values
        self._delivered = self.grains.delivered
        self._grain_sources: dict[int, list[str]] = {}  # undelivered source -> Grain fields
        self._decoded: tuple[int, list[StoredFact]] | None = None  # a segment, decoded

    @property
    def last_seq(self) -> int:
        return self._base + len(self._live)

    def places(self) -> tuple[int, int, int]:
        """``(last compacted seq, segments, live facts)``."""
        return self._base, len(self._segments), len(self._live)

    # -- writing ---------------------------------------------------------------------------
    def add(self, domain: DomainId, fact: Fact) -> int:
        seq = self.last_seq + 1
        source = source_of(fact)
        if source is not None:
            if source not in self._delivered:
                self._holding.setdefault(source, []).append(seq)
            elif isinstance(fact, GrainCommitted) and not self.kept(fact.call):
                fact = freed(fact)  # a commit landing after its source was delivered
        self._live.append(StoredFact(seq, domain, fact))
        self._by_domain.setdefault(domain, []).append(seq)
        if isinstance(fact, OutputEmitted):
            self._release(fact.index)
        if len(self._live) >= 2 * BLOCK:
            self.compact(BLOCK)
        return seq

    def note_grains(self, entries: dict[str, GrainEntry]) -> None:
        """Record Grain table entries a driver append leaves (new Grains counted by source)."""
        grains = self.grains
        for key, entry in entries.items():
            if key not in grains:
                source = _source_of_field(key)
                if source is not None:
                    self._grain_sources.setdefault(source, []).append(key)
            grains[key] = entry

    def _release(self, source: int) -> None:
        """Source ``source`` is delivered: free its values and its Grain table entries."""
        self._delivered.add(source)
        for key in self._grain_sources.pop(source, ()):
            self.grains.pop(key, None)
        for seq in self._holding.pop(source, ()):
            if seq > self._base:
                stored = self._live[seq - self._base - 1]
                fact = stored.fact
                if isinstance(fact, GrainCommitted) and not self.kept(fact.call):
                    self._live[seq - self._base - 1] = stored._replace(fact=freed(fact))
            else:
                segment = self._segments[bisect_right(self._firsts, seq) - 1]
                held = segment.held.get(seq)
                if held is not None and not (isinstance(held.fact, GrainCommitted)
                                             and self.kept(held.fact.call)):
                    del segment.held[seq]  # its segment holds it, slimmed
                    if not segment.held:
                        segment.held = {}  # a dict keeps its size when emptied
                    self._decoded = None

    def compact(self, count: int) -> None:
        """Move the ``count`` oldest live facts into a segment (all of them when larger)."""
        moved, self._live = self._live[:count], self._live[count:]
        if not moved:
            return
        segment = _Segment(moved[0].seq, moved[-1].seq, b"")
        rows: list[ArchivedFact] = []
        for stored in moved:
            fact = stored.fact
            try:
                rows.append((stored.seq, stored.domain, encode_fact(_slim(fact))))
            except (TypeError, ValueError, OverflowError, RayorchError):
                segment.unstored[stored.seq] = stored  # the codec cannot store it
                continue
            source = source_of(fact)
            if source is not None and (source not in self._delivered or (
                    isinstance(fact, GrainCommitted) and self.kept(fact.call))):
                segment.held[stored.seq] = stored
        first, last = segment.first, segment.last
        if rows:
            segment.blob = encode_segment(self.run_id, self.shard, rows)
        self._segments.append(segment)
        self._firsts.append(first)
        self._base = last
        for seqs in self._by_domain.values():
            del seqs[:bisect_right(seqs, last)]

    # -- reading ---------------------------------------------------------------------------
    def _facts_of(self, segment: _Segment) -> list[StoredFact]:
        cached = self._decoded
        if cached is not None and cached[0] == segment.first:
            return cached[1]
        facts: list[StoredFact] = []
        rows = decode_segment(segment.blob, f"memory segment {segment.first}-{segment.last}",
                              self.run_id, self.shard) if segment.blob else []
        at = {seq: (domain, blob) for seq, domain, blob in rows}
        for seq in range(segment.first, segment.last + 1):
            stored = segment.held.get(seq) or segment.unstored.get(seq)
            if stored is None:
                domain, blob = at[seq]
                stored = StoredFact(seq, domain, _unslim(decode_fact(blob)))
            facts.append(stored)
        self._decoded = (segment.first, facts)
        return facts

    def select(self, after: int, limit: int, domain: DomainId | None) -> list[StoredFact]:
        """Facts with ``seq > after``, in order, at most ``limit`` (only ``domain``'s)."""
        out: list[StoredFact] = []
        if after < self._base:
            for segment in self._segments[max(bisect_right(self._firsts, after + 1) - 1, 0):]:
                for stored in self._facts_of(segment):
                    if stored.seq > after and (domain is None or stored.domain == domain):
                        out.append(stored)
                        if len(out) >= limit:
                            return out
            after = self._base
        room = limit - len(out)
        if domain is None:
            start = after - self._base
            return out + self._live[start:start + room]
        seqs = self._by_domain.get(domain, [])
        start = bisect_right(seqs, after)
        base = self._base
        return out + [self._live[s - base - 1] for s in seqs[start:start + room]]


__all__ = ["BLOCK", "ShardLog", "freed", "source_of"]
