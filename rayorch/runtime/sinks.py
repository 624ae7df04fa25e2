"""File sinks: where ``rayorch driver``/``resume`` deliver outputs, as files users read.

A sink directory holds a small manifest (``_rayorch_sink.json``: run id, format, record
schema) and *part files* written whole and atomically, one per ``write_part`` call::

    part-s<shard:5>-<first index:12>-<records>[-q<seq>]-<tag>.<suffix>

``<suffix>`` is the format's (:mod:`rayorch.runtime.formats`: ``jsonl``, ``parquet``,
``jsonl.zst``, ``tar`` for ``wds``); ``<tag>`` 6 random hex, or for a part rolled by size
(``shard_size``) 16 hex of its content digest: parts then hold about ``shard_size`` bytes
each (at most 1.1x, except a writer's last of a shard), spooled locally until full
(:mod:`rayorch.runtime.formats.spool`) and published whole under that one name. Reading
and writing this layout (manifest, publish, read and list parts, claim markers) is
:mod:`rayorch.runtime.sink_layout`'s; this module re-exports its public names.

``q<seq>``: how many facts of the shard the lineage store had acknowledged to the writing
driver when it wrote the part. A store that now holds fewer lost facts it acknowledged
(a rollback); ``rayorch audit`` says so (sink_audit.py).

Each record is one source: ``{"index": i, "outcome": "present", "value": ...}`` or
``{"index": i, "outcome": "dropped"|"failed"|"suppressed", "cause": ..., "output": NAME}``.
Values are JSON by the one rule of :mod:`rayorch.core.json_values` (tuples and numpy
arrays become lists, ``bytes`` ``{"$bytes": "<base64>"}``); anything else (a set, a 65-bit
int, NaN, a dict with non-str keys) is a :class:`SinkError` naming the source, never a silent
``str()`` (on a durable store the actor already failed that record alone, by the same
rule). How a part stores its records is its format's (typed columns of a declared
:class:`~rayorch.runtime.formats.RowSchema`, or the generic record layout). A record's
*digest* is the SHA-256 of its canonical bytes: the JSONL line (keys in the order above,
no spaces), rebuilt from what any format stores.

The driver calls exactly this (docs/ARCHITECTURE.md, "File sinks")::

    sink = FileSink(out_dir, "jsonl", run_id=run)      # refuses another run's directory
    facts = sink.write_part(shard, [(index, value), ...])  # OutputEmitted, one per record
    store.append(run, shard, epoch, facts)             # fenced; on LeaseLostError:
    sink.discard(facts)                                #   remove the part again
    facts = sink.adopt(shard, indexes)                 # on taking a shard over: parts a
                                                       # dead holder wrote, claimed, not rewritten
    for record in read_outputs(out_dir): ...           # users
    check_delivery(out_dir, emitted, complete=...)     # ``rayorch audit`` (sink_audit.py)

Several driver processes, on any machines, may write one sink (different shards): nothing
is shared but the manifest, written once; names are unique per shard (random suffix,
publish by conditional create). The sink is a directory or an object store prefix
(``s3://bucket/out``): it uses only :mod:`rayorch.storage`'s create/put/read/list/delete,
never a rename. A part that a driver must take back (its fenced append was refused) and
one a shard's next holder adopts are settled by a claim marker ``.rayorch-claim-<part>``,
created once: ``adopt`` keeps the part for good, ``discard`` removes it.

A job (``rayorch run pdf|video``) delivers through the same sink: its :class:`Beside` writes
a source's own files (a ``.md``) and gives its record's value just before the part is
published. Its ``--resume`` is a new run taking the directory over
(:mod:`rayorch.runtime.sink_takeover`).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from rayorch.core.machine import OutputDelivered, OutputReady
from rayorch.runtime.formats import RowSchema, format_names, part_format
from rayorch.runtime.formats.spool import ShardSpool
from rayorch.runtime.sink_layout import (
    ADOPT,
    CLAIM_PREFIX,
    DISCARD,
    HIDDEN_PREFIX,
    LEFTOVER_RE,
    SINK_MANIFEST,
    SINK_VERSION,
    foreign_files,
    list_names,
    live_parts,
    load_manifest,
    manifest_bytes,
    part_claims,
    publish,
    read_part,
    read_parts,
    sink_parts,
    sink_url,
    write_part_file,
)
from rayorch.storage import StorageError, open_storage
from rayorch.store.records.sink import PartName, SinkError, SinkRecord, encode_record

FORMATS = format_names()
# Sinks whose OutputEmitted facts need no file: the Pipeline.run caller, older writers.
FILELESS_SINKS = ("", "caller")
_RECORD_SCHEMA = {
    "index": "int (source index)",
    "outcome": "present | dropped | failed | suppressed",
    "value": "the output as JSON, when present (several outputs: a list)",
    "cause": "why not present (str or null), otherwise",
    "output": "the output name that is not present, otherwise",
    "bytes": {"$bytes": "base64"},
}


class Beside(Protocol):
    """The files a job writes beside the part files (``patterns``: their names, fnmatch)."""

    patterns: tuple[str, ...]

    def render(self, index: int, value: Any) -> Any:
        """Write source ``index``'s files; the value its record holds (or a ``FailedResult``)."""


# -- the sink -------------------------------------------------------------------------------
def _check_libraries(fmt: str, extra: str | None) -> None:
    """A :class:`SinkError` naming the extra to install when ``fmt``'s library is missing."""
    module = {"parquet": "pyarrow.parquet", "jsonl.zst": "zstandard"}.get(fmt)
    if module is None:
        return
    try:
        __import__(module)
    except ImportError:
        raise SinkError(f"{fmt} output needs {module.partition('.')[0]}: pip install "
                        f"'rayorch[{extra}]' (or use --format jsonl)") from None


def _listing(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


class FileSink:
    """A run's outputs as part files of a format (:mod:`rayorch.runtime.formats`) at
    ``out_dir`` (a directory or an object store URL); see the module doc.

    ``schema``: the declared columns of the values (a job's rows), else the generic record
    layout; ``shard_size``: bytes per part (parts roll by size), else one part per delivery.
    A sink that records a shard size keeps it for every driver that opens it.
    """

    def __init__(self, out_dir: str | Path, fmt: str = "jsonl", *, run_id: str,
                 beside: Beside | None = None, schema: RowSchema | None = None,
                 shard_size: int | None = None, render_threads: int = 1) -> None:
        self.part_format = part_format(fmt)
        if not run_id:
            raise SinkError("a file sink needs the run id")
        _check_libraries(fmt, self.part_format.needs)
        try:
            self.storage = open_storage(out_dir)
            self.storage.make_dir()
        except StorageError as exc:
            raise SinkError(f"cannot use the output location: {exc}") from None
        self.url = sink_url(out_dir)
        self.format = fmt
        self.schema = schema
        # Per shard, which parts hold each source (read at its first delivery; see deliver).
        self._on_disk: dict[int, dict[int, set[str]]] = {}
        self.run_id = run_id
        self.beside = beside
        # ``beside``'s files of one part written by this many threads (object store PUTs)
        self._renders = (ThreadPoolExecutor(render_threads, thread_name_prefix="rayorch-files")
                         if beside is not None and render_threads > 1 else None)
        self._adopt_claim = ADOPT + b" " + secrets.token_hex(8).encode()
        patterns = list(beside.patterns) if beside is not None else []
        meta = load_manifest(self.storage)
        if meta is None:
            odd = foreign_files(self.storage, None, patterns)
            if odd:
                raise SinkError(
                    f"the output directory {self.url} holds files that are not rayorch "
                    f"part files ({_listing(odd)}); use an empty or new directory")
            meta = {"rayorch_sink": SINK_VERSION, "run": run_id, "format": fmt,
                    "record": _RECORD_SCHEMA}
            if schema is not None:
                meta["schema"] = schema.describe()
            if shard_size is not None:
                meta["shard_size"] = shard_size
            if patterns:
                meta["beside"] = patterns
            try:
                publish(self.storage, SINK_MANIFEST, manifest_bytes(meta),
                        rename_on_clash=False)
            except FileExistsError:  # another driver wrote it first: check theirs
                meta = load_manifest(self.storage) or meta
        if meta["run"] != run_id:
            raise SinkError(f"the output directory {self.url} holds the outputs of run "
                            f"{meta['run']!r}, not {run_id!r}; use another directory")
        if meta["format"] != fmt:
            raise SinkError(f"the output directory {self.url} is the {meta['format']} "
                            f"sink of run {run_id}; pass --format {meta['format']} (or another "
                            "directory)")
        odd = foreign_files(self.storage, fmt, [*meta.get("beside", ()), *patterns])
        if odd:
            raise SinkError(f"the output directory {self.url} holds files that are not "
                            f"{fmt} part files of run {run_id} ({_listing(odd)}); move them "
                            "away")
        size = meta.get("shard_size")
        self.spool = ShardSpool(size) if isinstance(size, int) and size > 0 else None

    def sink_of(self, name: str) -> str:
        """The ``OutputEmitted.sink`` of a part of this sink."""
        return f"{self.format}:{name}"

    def _encode(self, records: Sequence[SinkRecord]) -> bytes:
        return self.part_format.encode(records, self.schema)

    def _write(self, name: str, records: Sequence[SinkRecord]) -> str:
        return publish(self.storage, name, self._encode(records))

    def _facts(self, name: str, records: Iterable[tuple[SinkRecord, str]]
               ) -> list[OutputDelivered]:
        now, sink = time.time(), self.sink_of(name)
        return [OutputDelivered(rec.index, rec.outcome, sink, digest, ts=now)
                for rec, digest in records]

    # -- the driver's sink port (rayorch/runtime/ports.py) ----------------------------------
    def reset(self, shard: int) -> None:
        """``shard`` was (re)built from the store: read what its parts hold again (and
        forget what is spooled: those sources are offered again)."""
        self._on_disk.pop(shard, None)
        if self.spool is not None:
            self.spool.drop(shard)

    def deliver(self, shard: int, ready: Sequence[OutputReady], *, acked: int = 0
                ) -> list[OutputDelivered]:
        """Write ``ready`` as one part, adopting first the sources a part holds already (a
        dead holder's, or written before a store rollback): no source is in two parts."""
        on_disk = self._on_disk.get(shard)
        if on_disk is None:
            on_disk = self._on_disk[shard] = self.parts_by_index(shard)
        delivered: list[OutputDelivered] = []
        todo = list(ready)
        if hits := [r.index for r in ready if r.index in on_disk]:
            parts = set().union(*(on_disk.pop(i) for i in hits))
            delivered = self.adopt(shard, hits, among=parts)
            adopted = {d.index for d in delivered}
            todo = [r for r in ready if r.index not in adopted]
        if todo:
            delivered += self.write_part(shard, [(r.index, r.value) for r in todo], acked=acked)
        return delivered

    def write_part(self, shard: int, records: Sequence[tuple[int, Any]], *,
                   acked: int = 0) -> list[OutputDelivered]:
        """Write these sources' records as one new part file; their deliveries, in order.

        They are not yet delivery: the driver appends their ``OutputEmitted`` fenced (and on
        a refusal calls :meth:`discard`). ``SinkError`` names the source whose value JSON
        cannot hold. ``acked``: how many facts of the shard the store has acknowledged to
        the driver (in the part's name, for the audit's rollback check).
        """
        if not records:
            return []
        render = self.beside.render if self.beside is not None else None
        if render is not None and self._renders is not None and len(records) > 1:
            values = list(self._renders.map(lambda r: render(*r), records))
        else:
            values = [v if render is None else render(i, v) for i, v in records]
        encoded = [encode_record(index, value) for (index, _), value in zip(records, values)]
        if len({r.index for r in encoded}) != len(encoded):
            raise SinkError(f"write_part got a source twice: {[r.index for r in encoded]}")
        if self.spool is not None:
            self.spool.add(shard, encoded)
            return self._roll(shard, acked, final=False)
        name = self._write(PartName.new(shard, encoded, self.part_format.suffix, acked),
                           encoded)
        return self._facts(name, [(r, r.digest) for r in encoded])

    def seal(self, shard: int, *, acked: int = 0) -> list[OutputDelivered]:
        """Publish what ``shard``'s spool holds (the writer's last part of the shard: the
        shard has nothing more to deliver here); its deliveries."""
        return self._roll(shard, acked, final=True)

    def spooled(self, shard: int) -> int:
        """How many of ``shard``'s sources wait in the spool for their part."""
        return 0 if self.spool is None else self.spool.pending(shard)

    def _roll(self, shard: int, acked: int, *, final: bool) -> list[OutputDelivered]:
        """Publish the spool's full parts (``final``: and the rest) under their content's
        name; a name that exists holds these very records (a retried publish)."""
        spool = self.spool
        facts: list[OutputDelivered] = []
        while spool is not None and spool.pending(shard) and (final or spool.full(shard)):
            cut = spool.take(shard, self._encode, final=final)
            if cut is None:
                break
            records, data = cut
            name = PartName.new(shard, records, self.part_format.suffix, acked, by_content=True)
            with contextlib.suppress(FileExistsError):
                publish(self.storage, name, data, rename_on_clash=False)
            facts.extend(self._facts(name, [(r, r.digest) for r in records]))
        return facts

    def _claim(self, name: str, body: bytes) -> bytes:
        """Claim part ``name`` for ``body`` (ADOPT or DISCARD) by creating its marker; the
        claim that stands (this one, or the one another driver made first)."""
        marker = CLAIM_PREFIX + name
        try:
            for _ in range(3):
                if self.storage.create(marker, body):
                    return body
                try:
                    return self.storage.read(marker).strip()
                except FileNotFoundError:
                    continue  # its discarder finished and removed it: claim again
        except StorageError as exc:
            raise SinkError(f"cannot claim part {name} in {self.url}: {exc}") from None
        return DISCARD  # pragma: no cover - a marker created and removed three times

    def discard(self, facts: Sequence[OutputDelivered]) -> None:
        """The fenced append of ``facts`` was refused: remove the part files they name,
        unless another driver adopted one first (its claim marker says so)."""
        names = {f.sink.partition(":")[2] for f in facts if f.sink.startswith(f"{self.format}:")}
        for name in sorted(names):
            if PartName.parse(name) is None or self._claim(name, DISCARD) != DISCARD:
                continue  # claimed for adoption by the shard's new holder: it stays
            try:
                self.storage.delete(name)
                self.storage.delete(CLAIM_PREFIX + name)
            except StorageError as exc:
                raise SinkError(f"cannot remove part {name} from {self.url}: {exc}") from None

    def parts_by_index(self, shard: int) -> dict[int, set[str]]:
        """Which part files of ``shard`` hold each source's record (read once when a driver
        takes the shard: the sources it finds ready again are :meth:`adopt`-ed from just
        those parts); the temp files and discarded parts its deposed writers left are
        removed first."""
        self._remove_leftovers(shard)
        found: dict[int, set[str]] = {}
        for name in live_parts(self.storage, f"part-s{shard:05d}-"):
            part = PartName.parse(name)
            if part is None or part.shard != shard or part.suffix != self.part_format.suffix:
                continue
            try:
                for rec, _ in read_part(self.storage, name):
                    found.setdefault(rec.index, set()).add(name)
            except FileNotFoundError:
                continue  # discarded by its writer meanwhile
        return found

    def adopt(self, shard: int, indexes: Collection[int],
              among: Collection[str] | None = None) -> list[OutputDelivered]:
        """Facts for sources of ``shard`` a previous holder wrote but never recorded.

        Each part holding some of ``indexes`` (looked for ``among`` these part names when
        given, else in every part of the shard) is claimed by creating its marker
        ``adopt <this sink's token>``, so a deposed writer's :meth:`discard` (which creates
        it with ``discard``) and this adoption cannot both win; a part claimed for adoption
        is never discarded. A part this sink claimed whose every record is wanted is
        delivered as it is: the facts name the part itself (no copy, no rename). Otherwise
        (some records are not wanted, or a deposed driver's adoption claimed it and was
        never recorded, since this driver holds the lease) the wanted records are published
        again under a new name, byte for byte (same digests), and the old part is removed.
        Sources found in no part are not returned.
        """
        wanted = set(indexes)
        found: list[OutputDelivered] = []
        names = sorted(live_parts(self.storage, f"part-s{shard:05d}-")
                       if among is None else among)
        for name in names:
            part = PartName.parse(name)
            if not wanted or part is None or part.shard != shard or \
                    part.suffix != self.part_format.suffix:
                continue
            try:
                records = read_part(self.storage, name)
            except FileNotFoundError:
                continue  # discarded by its writer meanwhile
            hits = [(rec, digest) for rec, digest in records if rec.index in wanted]
            claim = self._claim(name, self._adopt_claim) if hits else DISCARD
            if not claim.startswith(ADOPT):
                continue  # its writer discarded it first: those sources get written anew
            try:
                if self.storage.head(name) is None:  # discarded before this claim
                    self.storage.delete(CLAIM_PREFIX + name)
                    continue
                if claim == self._adopt_claim and len(hits) == len(records):
                    found.extend(self._facts(name, hits))
                else:
                    kept = [rec for rec, _ in hits]
                    new = self._write(PartName.new(shard, kept, self.part_format.suffix,
                                                   part.acked), kept)
                    found.extend(self._facts(new, hits))
                    self.storage.delete(name)
                    self.storage.delete(CLAIM_PREFIX + name)
            except StorageError as exc:
                raise SinkError(f"cannot adopt part {name} in {self.url}: {exc}") from None
            wanted -= {rec.index for rec, _ in hits}
        return found

    def _remove_leftovers(self, shard: int) -> None:
        """Temp files of ``shard``'s parts that a killed writer left, and parts claimed for
        discarding whose writer died before removing them: this driver holds the shard's
        lease, so their writer was deposed (a deposed writer still going finds its temp
        file gone and stops with a SinkError; its facts were fenced anyway)."""
        prefix = f"part-s{shard:05d}-"
        try:
            for name in list_names(self.storage, HIDDEN_PREFIX):
                leftover = LEFTOVER_RE.match(name)
                part = PartName.parse(leftover["part"]) if leftover else None
                if part is not None and part.shard == shard:
                    self.storage.delete(name)
            for name, body in part_claims(self.storage, prefix).items():
                if body == DISCARD:
                    self.storage.delete(name)
                    self.storage.delete(CLAIM_PREFIX + name)
        except StorageError as exc:
            raise SinkError(f"cannot clean up {self.url}: {exc}") from None


def sink_for_run(run_id: str, recorded_dir: str | None, recorded_format: str,
                 out_dir: str | Path | None, out_format: str | None) -> FileSink | None:
    """The file sink a driver of ``run_id`` writes to: the run's own, else ``out_dir``.

    A directory or format given for a run that records its own is refused when it differs
    (the outputs of one run stay in one place).
    """
    if recorded_dir is not None:
        if out_dir is not None and sink_url(out_dir) != sink_url(recorded_dir):
            raise SinkError(f"run {run_id} writes its outputs to {recorded_dir} (recorded with "
                            f"the run), not {out_dir}; drop --out-dir")
        if out_format is not None and out_format != recorded_format:
            raise SinkError(f"run {run_id} writes {recorded_format} outputs (recorded with the "
                            f"run), not {out_format}; drop --format")
        return FileSink(recorded_dir, recorded_format, run_id=run_id)
    if out_dir is None:
        if out_format is not None:
            raise SinkError("--format needs --out-dir (where to write the outputs)")
        return None
    return FileSink(out_dir, out_format or "jsonl", run_id=run_id)


# -- readers -----------------------------------------------------------------------------------
def read_outputs(out_dir: str | Path, *, check_twice: bool = True
                 ) -> Iterator[dict[str, Any]]:
    """Every record of a sink (a directory or an object store URL), part by part;
    :class:`SinkError` on a source twice. ``check_twice=False``: the caller checks that
    (the check keeps each id seen: ~100 B per source, 100 MB over a million).

    >>> for record in read_outputs("out/"):                # doctest: +SKIP
    ...     print(record["index"], record["outcome"], record.get("value"))
    """
    storage, _, names = sink_parts(out_dir)
    seen: dict[int, str] = {}
    for name, records in read_parts(storage, names):
        for rec, _ in records:
            if not check_twice:
                yield rec.as_dict()
                continue
            if rec.index in seen:
                raise SinkError(
                    f"source {rec.index} is in two part files of {storage.url} "
                    f"({seen[rec.index]}, {name}): one was left by a driver that died while "
                    "deposed; `rayorch audit RUN --out-dir DIR` names the part no fact "
                    "references")
            seen[rec.index] = name
            yield rec.as_dict()


def delivered_count(out_dir: str | Path) -> int:
    """How many records the part files of ``out_dir`` hold (from their names; no reads)."""
    try:
        names = list_names(open_storage(out_dir), "part-")
    except (SinkError, StorageError):
        return 0
    return sum(p.count for n in names if (p := PartName.parse(n)) is not None)


__all__ = ["ADOPT", "CLAIM_PREFIX", "DISCARD", "FILELESS_SINKS", "FORMATS", "SINK_MANIFEST",
           "Beside", "FileSink", "PartName", "SinkError", "SinkRecord", "delivered_count",
           "encode_record", "list_names", "live_parts", "load_manifest", "manifest_bytes",
           "publish", "read_outputs", "read_part", "read_parts", "sink_for_run", "sink_parts",
           "sink_url", "write_part_file"]
