"""Finished lineage on object storage: a shard's facts as compressed, immutable segments.

A segment holds every fact of one shard with a sequence number in ``[first, last]`` (all
Domains), as msgpack ``[version, run, shard, first, last, [[seq, domain, fact], ...]]``
compressed with zstandard (zlib where zstandard is not installed; the first bytes say
which). It is named ``<run>/<shard>/<first>-<last>.facts`` (numbers zero-padded, so a
listing is in order) and written by a conditional create: a segment is never overwritten
nor seen in part. Segments of a shard are contiguous from seq 1; the archive's
*watermark* is the last seq its segments hold. Two archivers of one range write the same
facts (facts are immutable), so overlapping segments are harmless: a reader takes each
seq once (docs/topics/ARCHIVE.md, "Archived lineage").

This module knows objects only; the Redis store decides what to archive, fences the trim
and merges archive and stream into one fact source (:mod:`rayorch.store.redis_archive`).
"""

from __future__ import annotations

import re
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from rayorch.core.errors import StoreError
from rayorch.core.facts import CodecError, pack_value, unpack_value
from rayorch.core.ids import DomainId
from rayorch.storage import Storage, StorageError, open_storage

ARCHIVE_VERSION = 1
SUFFIX = ".facts"
_ZSTD, _ZLIB = b"RA1z", b"RA1l"  # magic + codec of a segment's bytes
_NAME = re.compile(r"^(\d{12})-(\d{12})\.facts$")
SEGMENT_FACTS = 50_000  # facts per segment at most (a reader decodes a segment whole)
_CACHED_SEGMENTS = 8

ArchivedFact = tuple[int, DomainId, bytes]
"""``(seq, domain, fact bytes)``: one fact as its segment holds it."""


class ArchiveError(StoreError):
    """An archive segment is unreadable, or the archive cannot be reached."""


@dataclass(frozen=True, order=True)
class Segment:
    """One listed segment: the seq range it holds and its key below the archive root."""

    first: int
    last: int
    key: str


def segment_key(run_id: str, shard: int, first: int, last: int) -> str:
    return f"{run_id}/{shard}/{first:012d}-{last:012d}{SUFFIX}"


def _compress(raw: bytes) -> bytes:
    try:
        import zstandard
    except ImportError:  # zlib is always there
        return _ZLIB + zlib.compress(raw, 6)
    return _ZSTD + bytes(zstandard.ZstdCompressor(level=6).compress(raw))


def _decompress(blob: bytes, key: str) -> bytes:
    magic, body = blob[:4], blob[4:]
    try:
        if magic == _ZLIB:
            return zlib.decompress(body)
        if magic == _ZSTD:
            import zstandard
            return bytes(zstandard.ZstdDecompressor().decompress(body))
    except ImportError:
        raise ArchiveError(f"archive segment {key} is zstandard-compressed: "
                           "pip install zstandard") from None
    except Exception as exc:  # zlib.error, zstandard.ZstdError: corrupt bytes
        raise ArchiveError(f"archive segment {key} is corrupt ({type(exc).__name__})") from None
    raise ArchiveError(f"archive segment {key} is not a rayorch archive segment")


def encode_segment(run_id: str, shard: int, facts: Sequence[ArchivedFact]) -> bytes:
    first, last = facts[0][0], facts[-1][0]
    body = [ARCHIVE_VERSION, run_id, shard, first, last,
            [[seq, domain, blob] for seq, domain, blob in facts]]
    return _compress(pack_value(body))


def decode_segment(blob: bytes, key: str, run_id: str, shard: int) -> list[ArchivedFact]:
    """The facts of a segment, checked against the run, shard and range its name says."""
    try:
        body = unpack_value(_decompress(blob, key))
        version, run, k, first, last, rows = body
        facts = [(int(seq), str(domain), bytes(fact)) for seq, domain, fact in rows]
    except (CodecError, TypeError, ValueError) as exc:
        raise ArchiveError(f"archive segment {key} cannot be decoded ({exc})") from None
    if version != ARCHIVE_VERSION or run != run_id or k != shard:
        raise ArchiveError(f"archive segment {key} belongs to another run or shard, or is of "
                           f"an unknown version ({str(version)[:10]})")
    if any(not first <= seq <= last for seq, _, _ in facts):
        raise ArchiveError(f"archive segment {key} holds facts outside its range")
    return facts


@dataclass(frozen=True)
class FactPlaces:
    """Where a shard's facts live: seqs up to ``archived`` in the archive, the rest live."""

    shard: int
    archived: int
    segments: int
    live: int
    archive_url: str | None

    def describe(self) -> str:
        """One line: which seqs the archive holds, how many facts are live."""
        live = f"{self.live} live in the store"
        if not self.archived:
            return f"shard {self.shard}: {live}"
        many = "segment" if self.segments == 1 else "segments"
        return (f"shard {self.shard}: seq 1-{self.archived} archived ({self.segments} {many} "
                f"in {self.archive_url}), {live}")


class FactArchive:
    """The segments of every run below one archive location (a directory or s3:// prefix)."""

    def __init__(self, url: str, storage: Storage | None = None) -> None:
        self.url = url
        self._storage = storage
        self._lock = threading.Lock()
        self._listed: dict[tuple[str, int], list[Segment]] = {}
        self._cache: OrderedDict[str, list[ArchivedFact]] = OrderedDict()

    @property
    def storage(self) -> Storage:
        if self._storage is None:
            try:
                self._storage = open_storage(self.url)
            except StorageError as exc:
                raise ArchiveError(f"archive {self.url}: {exc}") from None
        return self._storage

    # -- listing -----------------------------------------------------------------------
    def segments(self, run_id: str, shard: int, *, fresh: bool = False) -> list[Segment]:
        """The shard's segments in seq order (a listing; cached until ``fresh``)."""
        with self._lock:
            cached = self._listed.get((run_id, shard))
        if cached is not None and not fresh:
            return cached
        found: list[Segment] = []
        try:
            for page in self.storage.walk(f"{run_id}/{shard}"):
                for info in page:
                    match = _NAME.match(info.key.rpartition("/")[2])
                    if match and info.key == segment_key(run_id, shard, int(match[1]),
                                                         int(match[2])):
                        found.append(Segment(int(match[1]), int(match[2]), info.key))
        except FileNotFoundError:
            found = []
        except StorageError as exc:
            raise ArchiveError(f"archive {self.url}: {exc}") from None
        found.sort()
        with self._lock:
            self._listed[(run_id, shard)] = found
        return found

    def watermark(self, run_id: str, shard: int, *, fresh: bool = False) -> int:
        """The last seq the shard's segments hold (0: none)."""
        listed = self.segments(run_id, shard, fresh=fresh)
        return max((s.last for s in listed), default=0)

    # -- writing -----------------------------------------------------------------------
    def write(self, run_id: str, shard: int, facts: Sequence[ArchivedFact]) -> list[Segment]:
        """Write ``facts`` (in seq order, contiguous with the watermark) as new segments.

        A segment that already exists under its name is kept as it is (an earlier try of
        the same range wrote the same facts)."""
        written: list[Segment] = []
        for at in range(0, len(facts), SEGMENT_FACTS):
            chunk = facts[at:at + SEGMENT_FACTS]
            key = segment_key(run_id, shard, chunk[0][0], chunk[-1][0])
            try:
                self.storage.create(key, encode_segment(run_id, shard, chunk))
            except StorageError as exc:
                raise ArchiveError(f"archive {self.url}: {exc}") from None
            written.append(Segment(chunk[0][0], chunk[-1][0], key))
        with self._lock:
            listed = self._listed.get((run_id, shard))
            if listed is not None:
                self._listed[(run_id, shard)] = sorted({*listed, *written})
        return written

    def delete_run(self, run_id: str) -> None:
        """Remove every segment of a run."""
        try:
            for page in self.storage.walk(run_id):
                for info in page:
                    if info.key.endswith(SUFFIX):
                        self.storage.delete(info.key)
            self.storage.remove_empty_dirs(run_id)
        except FileNotFoundError:
            pass
        except StorageError as exc:
            raise ArchiveError(f"archive {self.url}: {exc}") from None
        with self._lock:
            for key in [k for k in self._listed if k[0] == run_id]:
                del self._listed[key]

    # -- reading -----------------------------------------------------------------------
    def _load(self, run_id: str, shard: int, segment: Segment) -> list[ArchivedFact]:
        with self._lock:
            facts = self._cache.get(segment.key)
            if facts is not None:
                self._cache.move_to_end(segment.key)
                return facts
        try:
            blob = self.storage.read(segment.key)
        except FileNotFoundError:
            raise ArchiveError(f"archive segment {self.url}/{segment.key} is gone") from None
        except StorageError as exc:
            raise ArchiveError(f"archive {self.url}: {exc}") from None
        facts = decode_segment(blob, segment.key, run_id, shard)
        with self._lock:
            self._cache[segment.key] = facts
            while len(self._cache) > _CACHED_SEGMENTS:
                self._cache.popitem(last=False)
        return facts

    def facts(self, run_id: str, shard: int, after: int, upto: int,
              domains: frozenset[DomainId] | None = None) -> Iterator[ArchivedFact]:
        """The archived facts with ``after < seq <= upto`` in seq order, each seq once."""
        cursor = after
        for segment in self.segments(run_id, shard):
            if segment.last <= cursor or segment.first > upto:
                continue
            for seq, domain, blob in self._load(run_id, shard, segment):
                if cursor < seq <= upto:
                    cursor = seq
                    if domains is None or domain in domains:
                        yield seq, domain, blob
            if cursor >= upto:
                return


__all__ = ["ARCHIVE_VERSION", "ArchiveError", "ArchivedFact", "FactArchive", "FactPlaces",
           "Segment", "decode_segment", "encode_segment", "segment_key"]
