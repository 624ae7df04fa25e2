"""The Redis store's archive of finished lineage: one fact source over segments and streams.

With ``archive=URL`` on the store URL (or a run archived by ``rayorch archive``), a shard's
facts go to compressed segments on object storage (:mod:`rayorch.store.archive`) and are then
trimmed from its streams:

* when the shard is done (``mark_shard_done``), and earlier, every ``archive_every`` facts
  its driver appends (immutable facts are safe to move at any time: every reader reads the
  archive and the streams as one source);
* by a background thread of the process that wrote them, so no call of the driver's loop
  waits on the object store; an unreachable archive leaves the facts in Redis (said once on
  stderr) and the run goes on; ``close()`` waits a while for what is queued.

Fenced: the trim (``lua/trim-archived-3.lua``) runs only if nobody acquired the shard's
lease since its facts were read and the store still holds them all. A crash between the
segment and the trim leaves the facts in both places; readers take each seq once. A store
that went back behind its archive (a restore, a promoted replica) catches up before it
writes again (``lua/restore-archived-2.lua``: the seq counter and the Grain table), so a
new fact never reuses an archived seq. The run's archive URL is kept in its meta hash, so
every reader finds it without being told.
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rayorch.core.errors import StoreError
from rayorch.core.facts import OutputEmitted
from rayorch.core.ids import DomainId
from rayorch.store.archive import (
    SEGMENT_FACTS,
    ArchivedFact,
    ArchiveError,
    FactArchive,
    FactPlaces,
)
from rayorch.store.base import StoredFact
from rayorch.store.gate import split_field
from rayorch.store.keys import GrainKeys, KeyIndex, ShardKeys, done_key, meta_key
from rayorch.store.layout import RunLayout, grain_entry_after
from rayorch.store.records.facts import decode_fact
from rayorch.store.redis_claims import RedisAccess
from rayorch.store.redis_support import decode_text, seq_of
from rayorch.store.scripts import RESTORE_ARCHIVED, TRIM_ARCHIVED, TRIM_FENCED

DEFAULT_EVERY = 20_000  # facts a driver appends to a shard between two archives of it
_TRIM_KEYS = 1000  # Grain buckets per trim call (a trim again with the same upto changes
# no stream: the next call only drops more buckets)
CLOSE_WAIT_S = 60.0  # how long close() waits for queued archives
_NO_ARCHIVE_RECHECK_S = 5.0


class RedisArchiving(RedisAccess):
    """Archiving and the merged read of a Redis-backed store (a mixin of ``RedisStore``)."""

    safe_url: str
    archive_every: int

    # -- given by the store ----------------------------------------------------------------
    def _layout(self, run_id: str) -> RunLayout:
        raise NotImplementedError

    def _grain_keys(self, run_id: str, shard: int) -> GrainKeys:
        raise NotImplementedError

    def _read_live(self, run_id: str, shard: int, after: int, *, limit: int,
                   block_s: float | None, domain: DomainId | None, payloads: bool
                   ) -> list[StoredFact]:
        raise NotImplementedError

    def _stored(self, seq: int, domain: DomainId, blob: bytes, payloads: bool) -> StoredFact:
        raise NotImplementedError

    # -- setup -------------------------------------------------------------------------------
    def _init_archive(self, url: str | None, every: int) -> None:
        self.archive_url = url
        self.archive_every = every
        self._archives: dict[str, FactArchive] = {}
        self._no_archive: dict[str, float] = {}
        self._appended: Counter[tuple[str, int]] = Counter()
        self._queue: queue.Queue[tuple[str, int, bool]] | None = None
        self._queued: set[tuple[str, int, bool]] = set()
        self._queue_lock = threading.Lock()
        self._said_down = False

    def _archive_of(self, run_id: str) -> FactArchive | None:
        """The run's archive: the one its meta hash names (the first one a writer was told,
        ``archive=`` on its URL), else None."""
        archive = self._archives.get(run_id)
        if archive is not None:
            return archive
        if time.monotonic() < self._no_archive.get(run_id, 0.0):
            return None
        with self._errors():
            raw = self._client().hget(meta_key(run_id), "archive")
            if not raw and self.archive_url and self._client().exists(meta_key(run_id)):
                # told an archive (archive= on the URL): the run archives there from now on
                self._client().hsetnx(meta_key(run_id), "archive", self.archive_url)
                raw = self._client().hget(meta_key(run_id), "archive")
        if not raw:
            self._no_archive[run_id] = time.monotonic() + _NO_ARCHIVE_RECHECK_S
            return None
        archive = self._archives[run_id] = FactArchive(decode_text(raw))
        return archive

    def set_archive(self, run_id: str, url: str) -> str:
        """Name the run's archive (first write wins; returns the one kept)."""
        self._layout(run_id)
        with self._errors():
            self._client().hsetnx(meta_key(run_id), "archive", url)
        self._archives.pop(run_id, None)
        self._no_archive.pop(run_id, None)
        archive = self._archive_of(run_id)
        assert archive is not None
        return archive.url

    # -- the one fact source -----------------------------------------------------------------
    def _marks(self, keys: ShardKeys) -> tuple[int, int]:
        """``(archived watermark, seq counter)`` as Redis holds them."""
        with self._errors():
            pipe = self._client().pipeline(transaction=False)
            pipe.get(keys.archived)
            pipe.get(keys.seq)
            archived, seq = pipe.execute()
        return int(archived or 0), int(seq or 0)

    def _read_merged(self, archive: FactArchive, run_id: str, shard: int, after: int, *,
                     limit: int, block_s: float | None, domain: DomainId | None,
                     payloads: bool) -> list[StoredFact]:
        keys = ShardKeys(run_id, shard)
        redis_mark, held = self._marks(keys)
        fresh = after == 0 or redis_mark > archive.watermark(run_id, shard)
        try:
            mark = archive.watermark(run_id, shard, fresh=fresh)
        except ArchiveError:
            if redis_mark > after:
                raise  # the facts asked for are only in the archive
            mark = redis_mark
        if held < mark:  # the store went back behind its archive: it catches up first
            self._restore(archive, run_id, shard, held, mark)
        out: list[StoredFact] = []
        if after < mark:
            domains = None if domain is None else frozenset((domain,))
            for seq, dom, blob in archive.facts(run_id, shard, after, mark, domains):
                out.append(self._stored(seq, dom, blob, payloads))
                if len(out) >= limit:
                    return out
            after, block_s = mark, (None if out else block_s)
        live = self._read_live(run_id, shard, after, limit=limit - len(out), block_s=block_s,
                               domain=domain, payloads=payloads)
        if self._marks(keys)[0] > after:  # archived and trimmed while this read ran
            return out + self._read_merged(archive, run_id, shard, after, limit=limit - len(out),
                                           block_s=None, domain=domain, payloads=payloads)
        return out + live

    def _restore(self, archive: FactArchive, run_id: str, shard: int, held: int,
                 mark: int) -> None:
        """Raise the shard's seq counter to the archive's watermark, with the Grain table
        as the archived facts past it leave it (``lua/restore-archived-2.lua``)."""
        entries: dict[str, str] = {}
        for _, _, blob in archive.facts(run_id, shard, held, mark):
            entry = grain_entry_after(decode_fact(blob))
            if entry is not None:
                entries.pop(entry[0], None)  # keep seq order: the last fact wins
                entries[entry[0]] = entry[1]
        keys, grains = ShardKeys(run_id, shard), self._grain_keys(run_id, shard)
        buckets = KeyIndex()
        args: list[Any] = [mark]
        for field, value in entries.items():
            args += [buckets.index(grains.of(split_field(field)[1])), field, value]
        with contextlib.suppress(StoreError):  # a read-only replica: the next writer does it
            self._eval(RESTORE_ARCHIVED, [keys.seq, keys.archived, *buckets], args)

    def fact_places(self, run_id: str) -> list[FactPlaces]:
        """Where each shard's facts live (``rayorch audit`` says it)."""
        layout = self._layout(run_id)
        archive = self._archive_of(run_id)
        places = []
        for shard in range(layout.info.shards):
            keys = ShardKeys(run_id, shard)
            with self._errors():
                pipe = self._client().pipeline(transaction=False)
                for domain in layout.domains:
                    pipe.xlen(keys.facts(domain))
                live = sum(int(n) for n in pipe.execute())
            segments = archive.segments(run_id, shard, fresh=True) if archive else []
            places.append(FactPlaces(shard, max((s.last for s in segments), default=0),
                                     len(segments), live, archive.url if archive else None))
        return places

    # -- archiving ---------------------------------------------------------------------------
    def archive_shard(self, run_id: str, shard: int, *, done: bool) -> int:
        """Archive the shard's live facts and trim them from Redis; returns how many moved.

        ``done``: the shard is done, so its Grain table goes too (every bucket). Raises
        :class:`~rayorch.store.archive.ArchiveError` when the archive cannot be written
        (the facts stay in Redis) and ``StoreError`` when the trim was fenced.
        """
        archive = self._archive_of(run_id)
        if archive is None:
            raise ArchiveError(f"run {run_id} has no archive: pass --archive URL")
        layout = self._layout(run_id)
        keys, grains = ShardKeys(run_id, shard), self._grain_keys(run_id, shard)
        with self._errors():
            holder = self._client().get(keys.holder)  # read before the facts: the fence
        holder_text = decode_text(holder) if holder is not None else ""
        mark = archive.watermark(run_id, shard, fresh=True)
        _, held = self._marks(keys)
        if held < mark:
            self._restore(archive, run_id, shard, held, mark)
        moved = 0
        # the shard's buckets, scanned once: a delivered source gets no new one (its Grains
        # were dispatched before its delivery), nor does a done shard
        found: list[str] | None = None
        while True:
            upto = min(held, mark + SEGMENT_FACTS)
            facts = self._range(layout, keys, mark, upto) if upto > mark else []
            if facts:
                archive.write(run_id, shard, facts)
                moved += len(facts)
            final = upto >= held
            top = max(upto, mark)
            streams = [keys.facts(d) for d in layout.domains]
            wipe = done and final
            sources = set() if done else _delivered(facts)
            if grains.bucketed and found is None and (sources or wipe):
                found = self._scan(keys.grain_buckets, near=keys.grains)
            for buckets, entries in self._grains_of(grains, sources, found or [], every=wipe):
                result = self._eval(TRIM_ARCHIVED, [keys.holder, keys.seq, keys.archived,
                                                    *streams, *buckets],
                                    [holder_text, top, "1" if wipe else "0", len(streams),
                                     *entries])
                if int(result[0]) != 1:
                    why = ("its lease was taken since" if int(result[0]) == TRIM_FENCED
                           else "the store holds fewer facts than the archive")
                    raise StoreError(f"run {run_id} shard {shard}: archived up to seq {top}, "
                                     f"not trimmed from Redis: {why}")
            mark = top
            if final:
                return moved

    def _grains_of(self, grains: GrainKeys, sources: set[int], found: list[str], *,
                   every: bool) -> list[tuple[list[str], list[Any]]]:
        """The trims' Grain arguments, in calls of at most ``_TRIM_KEYS`` buckets (always
        one call): ``(bucket keys, [bucket index, field, ...])``. ``every``: every bucket of
        the shard (``found``: all of them) goes whole; else the entries of ``sources``'
        buckets (or, in a run's one hash from before buckets, its fields of those sources:
        one scan of the hash)."""
        if not grains.bucketed:
            return [([grains.shard.grains], self._fields_of(grains, sources))]
        if not every:
            found = [key for key in found if grains.source_of(key) in sources]
        calls: list[tuple[list[str], list[Any]]] = []
        for at in range(0, len(found), _TRIM_KEYS):
            chunk = found[at:at + _TRIM_KEYS]
            entries: list[Any] = []
            if not every:
                with self._errors():
                    pipe = self._client().pipeline(transaction=False)
                    for key in chunk:
                        pipe.hkeys(key)
                    for index, fields in enumerate(pipe.execute(), 1):
                        for field in fields:
                            entries += [index, decode_text(field)]
            calls.append((chunk, entries))
        return calls or [([], [])]

    def _fields_of(self, grains: GrainKeys, sources: set[int]) -> list[Any]:
        """``[1, field, ...]``: the fields of ``sources`` in a run's one Grain hash."""
        entries: list[Any] = []
        if not sources:
            return entries
        with self._errors():
            for raw, _ in self._client().hscan_iter(grains.shard.grains, count=1000):
                field = decode_text(raw)
                root = field.partition("|")[2].partition(".")[0]
                if root.isdigit() and int(root) in sources:
                    entries += [1, field]
        return entries

    def _range(self, layout: RunLayout, keys: ShardKeys, after: int, upto: int
               ) -> list[ArchivedFact]:
        """The shard's facts with ``after < seq <= upto`` from its streams, in seq order."""
        facts: list[ArchivedFact] = []
        client = self._client()
        for domain in layout.domains:
            start = f"{after + 1}-0"
            while True:
                with self._errors():
                    entries = client.xrange(keys.facts(domain), start, f"{upto}-0", count=10_000)
                for entry_id, fields in entries:
                    facts.append((seq_of(entry_id), domain, bytes(fields[b"f"])))
                if len(entries) < 10_000:
                    break
                start = f"({decode_text(entries[-1][0])}"
        facts.sort(key=lambda f: f[0])
        return facts

    def archive_run(self, run_id: str) -> dict[int, int]:
        """Archive every shard of a run now (``rayorch archive``): done shards whole."""
        layout = self._layout(run_id)
        with self._errors():
            done = {int(m) for m in self._client().smembers(done_key(run_id))}
        return {shard: self.archive_shard(run_id, shard, done=shard in done)
                for shard in range(layout.info.shards)}

    # -- in the background -------------------------------------------------------------------
    def _count_appended(self, run_id: str, shard: int, n: int) -> None:
        if self.archive_url is None:
            return
        key = (run_id, shard)
        self._appended[key] += n
        if self._appended[key] >= self.archive_every:
            self._appended[key] = 0
            self._schedule(run_id, shard, done=False)

    def _schedule(self, run_id: str, shard: int, *, done: bool) -> None:
        if self.archive_url is None or self._archive_of(run_id) is None:
            return
        with self._queue_lock:
            if (run_id, shard, done) in self._queued:
                return
            self._queued.add((run_id, shard, done))
            if self._queue is None:
                self._queue = queue.Queue()
                threading.Thread(target=self._work, args=(self._queue,), daemon=True,
                                 name="rayorch-archive").start()
                atexit.register(self.wait_archived)  # a process leaving lets them finish
            self._queue.put((run_id, shard, done))

    def _work(self, tasks: queue.Queue[tuple[str, int, bool]]) -> None:
        while True:
            task = tasks.get()
            try:
                self.archive_shard(task[0], task[1], done=task[2])
                self._said_down = False
            except Exception as exc:  # the facts stay in Redis: the run goes on
                if not self._said_down:
                    self._said_down = True
                    print(f"rayorch: archive of run {task[0]} shard {task[1]} not done, its "
                          f"facts stay in Redis ({str(exc)[:300]})", file=sys.stderr, flush=True)
            finally:
                with self._queue_lock:
                    self._queued.discard(task)
                tasks.task_done()

    def wait_archived(self, timeout_s: float = CLOSE_WAIT_S) -> bool:
        """Wait up to ``timeout_s`` for queued archives; True when none is left."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._queue_lock:
                if not self._queued:
                    return True
            time.sleep(0.05)
        return False


def _delivered(facts: Sequence[ArchivedFact]) -> set[int]:
    """The sources whose delivery (``OutputEmitted``) is among ``facts``."""
    out = set()
    for _, _, blob in facts:
        fact = decode_fact(blob)
        if isinstance(fact, OutputEmitted):
            out.add(fact.index)
    return out


__all__ = ["DEFAULT_EVERY", "RedisArchiving"]
