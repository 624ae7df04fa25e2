"""File sinks: where ``rayorch driver``/``resume`` deliver outputs, as files users read.

A sink directory holds a small manifest (``_rayorch_sink.json``: run id, format, record
schema) and *part files* written whole and atomically, one per ``write_part`` call::

    part-s<shard:5>-<first index:12>-<records>[-q<seq>]-<6 hex>.jsonl | .parquet

``q<seq>``: how many facts of the shard the lineage store had acknowledged to the writing
driver when it wrote the part. A store that now holds fewer lost facts it acknowledged
(a rollback); ``rayorch audit`` says so (sink_audit.py).

Each record is one source: ``{"index": i, "outcome": "present", "value": ...}`` or
``{"index": i, "outcome": "dropped"|"failed"|"suppressed", "cause": ..., "output": NAME}``.
Values are JSON by the one rule of :mod:`rayorch.core.json_values` (tuples and numpy
arrays become lists, ``bytes`` ``{"$bytes": "<base64>"}``); anything else (a set, a 65-bit
int, NaN, a dict with non-str keys) is a :class:`SinkError` naming the source, never a silent
``str()`` (on a durable store the actor already failed that record alone, by the same
rule). Parquet parts have the columns ``index:int64, outcome, value_json, cause, output``
(strings). A record's *digest* is the SHA-256 of its canonical bytes: the JSONL
line (keys in the order above, no spaces), rebuilt from the columns for Parquet.

The driver calls exactly this (docs/ARCHITECTURE.md, "File sinks")::

    sink = FileSink(out_dir, "jsonl", run_id=run)      # refuses another run's directory
    facts = sink.write_part(shard, [(index, value), ...])  # OutputEmitted, one per record
    store.append(run, shard, epoch, facts)             # fenced; on LeaseLostError:
    sink.discard(facts)                                #   remove the part again
    facts = sink.adopt(shard, indexes)                 # on taking a shard over: parts a
                                                       # dead holder wrote, claimed, not rewritten
    for record in read_outputs(out_dir): ...           # users
    check_delivery(out_dir, emitted, complete=...)     # ``rayorch audit`` (sink_audit.py)

Several driver processes may write one directory (different shards): nothing is shared
but the manifest, written once; names are unique per shard (random suffix, no-replace
publish).

A job (``rayorch run pdf|video``) delivers through the same sink: its :class:`Beside` writes
a source's own files (a ``.md``) and gives its record's value just before the part is
published. Its ``--resume`` is a new run taking the directory over
(:mod:`rayorch.runtime.sink_takeover`).
"""

from __future__ import annotations

import fnmatch
import os
import re
import secrets
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import orjson

from rayorch.core.machine import OutputDelivered, OutputReady
from rayorch.runtime.sink_records import (
    PartName,
    SinkError,
    SinkRecord,
    encode_record,
    read_part,
)

SINK_MANIFEST = "_rayorch_sink.json"
SINK_VERSION = 1
FORMATS = ("jsonl", "parquet")
HIDDEN_PREFIX = ".rayorch-"  # in-progress and claimed files: ignored by readers
# A part's temp file (being written) or claim (being adopted): "<prefix>tmp-<part>-<8 hex>".
LEFTOVER_RE = re.compile(rf"^{re.escape(HIDDEN_PREFIX)}(?:tmp|claim)-(?P<part>.+)-[0-9a-f]{{8}}$")
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


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _link_free(tmp: Path, target: Path, rename_on_clash: bool) -> str:
    """Link ``tmp`` to ``target``'s name, or (on a clash) to one with another random suffix."""
    name = target.name
    for _ in range(8):
        try:
            os.link(tmp, target.with_name(name))
            return name
        except FileExistsError:
            if not rename_on_clash:
                raise
            stem, _, ext = name.rpartition("-")
            name = f"{stem}-{secrets.token_hex(3)}.{ext.partition('.')[2]}"
    raise SinkError(f"cannot find a free part name in {target.parent}")  # pragma: no cover


def publish(directory: Path, name: str, data: bytes | None, table: Any = None, *,
             rename_on_clash: bool = True, replace: bool = False) -> str:
    """Write ``name`` whole or not at all: hidden temp file, fsync, no-replace link, fsync dir.

    Returns the name used: a clash with an existing part (random suffix) picks another
    name; without ``rename_on_clash`` it raises :class:`FileExistsError`; ``replace``
    replaces an existing file instead (a run taking a sink directory over).
    """
    tmp = directory / f"{HIDDEN_PREFIX}tmp-{name}-{secrets.token_hex(4)}"
    try:
        with open(tmp, "xb") as f:
            if table is not None:
                import pyarrow.parquet as pq

                pq.write_table(table, f)
            else:
                assert data is not None
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, directory / name)
        else:
            name = _link_free(tmp, directory / name, rename_on_clash)
    except FileExistsError:
        raise
    except OSError as exc:
        raise SinkError(f"cannot write part file {name} in {directory}: "
                        f"{exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(directory)
    return name


def _parquet_table(records: Sequence[SinkRecord]) -> Any:
    import pyarrow as pa

    return pa.table({
        "index": pa.array([r.index for r in records], pa.int64()),
        "outcome": pa.array([r.outcome for r in records], pa.string()),
        "value_json": pa.array([None if r.value_json is None else r.value_json.decode()
                                for r in records], pa.string()),
        "cause": pa.array([r.cause for r in records], pa.string()),
        "output": pa.array([r.output for r in records], pa.string()),
    })


def write_part_file(directory: Path, fmt: str, name: str, records: Sequence[SinkRecord]) -> str:
    if fmt == "parquet":
        return publish(directory, name, None, _parquet_table(records))
    return publish(directory, name, b"".join(r.line + b"\n" for r in records))


# -- the sink -------------------------------------------------------------------------------
def load_manifest(directory: Path) -> dict[str, Any] | None:
    path = directory / SINK_MANIFEST
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SinkError(f"{path} cannot be read: {exc.strerror or exc}") from None
    try:
        meta = orjson.loads(blob)
    except orjson.JSONDecodeError:
        meta = None
    if not (isinstance(meta, dict) and meta.get("rayorch_sink") == SINK_VERSION
            and isinstance(meta.get("run"), str) and meta.get("format") in FORMATS):
        raise SinkError(f"{path} is not a rayorch sink manifest (version {SINK_VERSION}); "
                        "use another directory")
    return meta


def manifest_bytes(meta: dict[str, Any]) -> bytes:
    return orjson.dumps(meta, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)


def _foreign_files(directory: Path, fmt: str | None, beside: Sequence[str] = ()) -> list[str]:
    odd = []
    for entry in os.scandir(directory):
        if entry.name == SINK_MANIFEST or entry.name.startswith(HIDDEN_PREFIX) or any(
                fnmatch.fnmatchcase(entry.name, pattern) for pattern in beside):
            continue
        part = PartName.parse(entry.name)
        if part is None or not entry.is_file() or (fmt is not None and part.fmt != fmt):
            odd.append(entry.name)
    return sorted(odd)


class FileSink:
    """A run's outputs as JSONL or Parquet part files in ``out_dir``; see the module doc."""

    def __init__(self, out_dir: str | Path, fmt: str = "jsonl", *, run_id: str,
                 beside: Beside | None = None) -> None:
        if fmt not in FORMATS:
            raise SinkError(f"unknown output format {fmt!r}: use one of {', '.join(FORMATS)}")
        if not run_id:
            raise SinkError("a file sink needs the run id")
        if fmt == "parquet":
            try:
                import pyarrow.parquet  # noqa: F401
            except ImportError:
                raise SinkError("Parquet output needs pyarrow: pip install 'rayorch[parquet]' "
                                "(or use --format jsonl)") from None
        self.directory = Path(out_dir)
        self.format = fmt
        # Per shard, which parts hold each source (read at its first delivery; see deliver).
        self._on_disk: dict[int, dict[int, set[str]]] = {}
        self.run_id = run_id
        self.beside = beside
        patterns = list(beside.patterns) if beside is not None else []
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SinkError(f"cannot create the output directory {self.directory}: "
                            f"{exc.strerror or exc}") from None
        meta = load_manifest(self.directory)
        if meta is None:
            odd = _foreign_files(self.directory, None, patterns)
            if odd:
                raise SinkError(
                    f"the output directory {self.directory} holds files that are not rayorch "
                    f"part files ({', '.join(odd[:3])}{', ...' if len(odd) > 3 else ''}); "
                    "use an empty or new directory")
            meta = {"rayorch_sink": SINK_VERSION, "run": run_id, "format": fmt,
                    "record": _RECORD_SCHEMA}
            if patterns:
                meta["beside"] = patterns
            try:
                publish(self.directory, SINK_MANIFEST, manifest_bytes(meta),
                         rename_on_clash=False)
            except FileExistsError:  # another driver wrote it first: check theirs
                meta = load_manifest(self.directory) or meta
        if meta["run"] != run_id:
            raise SinkError(f"the output directory {self.directory} holds the outputs of run "
                            f"{meta['run']!r}, not {run_id!r}; use another directory")
        if meta["format"] != fmt:
            raise SinkError(f"the output directory {self.directory} is the {meta['format']} "
                            f"sink of run {run_id}; pass --format {meta['format']} (or another "
                            "directory)")
        odd = _foreign_files(self.directory, fmt, [*meta.get("beside", ()), *patterns])
        if odd:
            raise SinkError(f"the output directory {self.directory} holds files that are not "
                            f"{fmt} part files of run {run_id} ({', '.join(odd[:3])}"
                            f"{', ...' if len(odd) > 3 else ''}); move them away")

    def sink_of(self, name: str) -> str:
        """The ``OutputEmitted.sink`` of a part of this sink."""
        return f"{self.format}:{name}"

    def _write(self, name: str, records: Sequence[SinkRecord]) -> str:
        return write_part_file(self.directory, self.format, name, records)

    def _facts(self, name: str, records: Iterable[tuple[SinkRecord, str]]
               ) -> list[OutputDelivered]:
        now, sink = time.time(), self.sink_of(name)
        return [OutputDelivered(rec.index, rec.outcome, sink, digest, ts=now)
                for rec, digest in records]

    # -- the driver's sink port (rayorch/runtime/ports.py) ----------------------------------
    def reset(self, shard: int) -> None:
        """``shard`` was (re)built from the store: read what its parts hold again."""
        self._on_disk.pop(shard, None)

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
        encoded = [encode_record(index, value if render is None else render(index, value))
                   for index, value in records]
        if len({r.index for r in encoded}) != len(encoded):
            raise SinkError(f"write_part got a source twice: {[r.index for r in encoded]}")
        name = self._write(PartName.new(shard, encoded, self.format, acked), encoded)
        return self._facts(name, [(r, r.digest) for r in encoded])

    def discard(self, facts: Sequence[OutputDelivered]) -> None:
        """The fenced append of ``facts`` was refused: remove the part files they name."""
        names = {f.sink.partition(":")[2] for f in facts if f.sink.startswith(f"{self.format}:")}
        removed = False
        for name in names:
            if PartName.parse(name) is not None:
                (self.directory / name).unlink(missing_ok=True)  # adopted meanwhile: gone
                removed = True
        if removed:
            fsync_dir(self.directory)

    def parts_by_index(self, shard: int) -> dict[int, set[str]]:
        """Which part files of ``shard`` hold each source's record (read once when a driver
        takes the shard: the sources it finds ready again are :meth:`adopt`-ed from just
        those parts); the temp and claim files its killed writers left are removed first."""
        self._remove_leftovers(shard)
        found: dict[int, set[str]] = {}
        for name in os.listdir(self.directory):
            part = PartName.parse(name)
            if part is None or part.shard != shard or part.fmt != self.format:
                continue
            try:
                for rec, _ in read_part(self.directory / name):
                    found.setdefault(rec.index, set()).add(name)
            except SinkError:
                if (self.directory / name).exists():
                    raise
                # discarded by its writer meanwhile
        return found

    def adopt(self, shard: int, indexes: Collection[int],
              among: Collection[str] | None = None) -> list[OutputDelivered]:
        """Facts for sources of ``shard`` a previous holder wrote but never recorded.

        Each part holding some of ``indexes`` (looked for ``among`` these part names when
        given, else in every part of the shard) is claimed by an atomic rename (so a deposed
        holder's :meth:`discard` and this adoption cannot both win) and published again
        under a new name with just those records, byte for byte: same digests, no second
        copy. Sources found in no part are not returned.
        """
        wanted = set(indexes)
        found: list[OutputDelivered] = []
        names = sorted(os.listdir(self.directory) if among is None else among)
        for name in names:
            part = PartName.parse(name)
            if not wanted or part is None or part.shard != shard or part.fmt != self.format:
                continue
            try:
                records = read_part(self.directory / name)
            except SinkError:
                if (self.directory / name).exists():
                    raise
                continue  # discarded by its writer meanwhile
            hits = [(rec, digest) for rec, digest in records if rec.index in wanted]
            if not hits:
                continue
            claim = self.directory / f"{HIDDEN_PREFIX}claim-{name}-{secrets.token_hex(4)}"
            try:
                os.rename(self.directory / name, claim)
            except FileNotFoundError:
                continue  # its writer discarded it first: those sources get written anew
            kept = [rec for rec, _ in hits]
            name = PartName.new(shard, kept, self.format, part.acked)
            if len(hits) == len(records) and self.format == "jsonl":
                new = publish(self.directory, name, claim.read_bytes())
            else:
                new = self._write(name, kept)
            claim.unlink()
            found.extend(self._facts(new, hits))
            wanted -= {rec.index for rec in kept}
        return found


    def _remove_leftovers(self, shard: int) -> None:
        """Temp and claim files of ``shard``'s parts that a killed writer left: this driver
        holds the shard's lease, so their writer was deposed (a deposed writer still going
        finds its temp file gone and stops with a SinkError; its facts were fenced anyway)."""
        for name in os.listdir(self.directory):
            leftover = LEFTOVER_RE.match(name)
            part = PartName.parse(leftover["part"]) if leftover else None
            if part is not None and part.shard == shard:
                (self.directory / name).unlink(missing_ok=True)


def sink_for_run(run_id: str, recorded_dir: str | None, recorded_format: str,
                 out_dir: str | Path | None, out_format: str | None) -> FileSink | None:
    """The file sink a driver of ``run_id`` writes to: the run's own, else ``out_dir``.

    A directory or format given for a run that records its own is refused when it differs
    (the outputs of one run stay in one place).
    """
    if recorded_dir is not None:
        if out_dir is not None and Path(out_dir).resolve() != Path(recorded_dir).resolve():
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
def sink_parts(directory: Path) -> tuple[dict[str, Any], list[str]]:
    if not directory.is_dir():
        raise SinkError(f"{directory} is not a directory")
    meta = load_manifest(directory)
    if meta is None:
        raise SinkError(f"{directory} is not a rayorch output directory (no {SINK_MANIFEST})")
    odd = _foreign_files(directory, meta["format"], meta.get("beside", ()))
    if odd:
        raise SinkError(f"{directory} holds files that are not {meta['format']} part files "
                        f"({', '.join(odd[:3])})")
    names = sorted(n for n in os.listdir(directory) if PartName.parse(n) is not None)
    return meta, names


def read_outputs(out_dir: str | Path) -> Iterator[dict[str, Any]]:
    """Every record of a sink directory, part by part; :class:`SinkError` on a source twice.

    >>> for record in read_outputs("out/"):                # doctest: +SKIP
    ...     print(record["index"], record["outcome"], record.get("value"))
    """
    directory = Path(out_dir)
    _, names = sink_parts(directory)
    seen: dict[int, str] = {}
    for name in names:
        for rec, _ in read_part(directory / name):
            if rec.index in seen:
                raise SinkError(
                    f"source {rec.index} is in two part files of {directory} ({seen[rec.index]}"
                    f", {name}): one was left by a driver that died while deposed; "
                    "`rayorch audit RUN --out-dir DIR` names the part no fact references")
            seen[rec.index] = name
            yield rec.as_dict()


def delivered_count(out_dir: str | Path) -> int:
    """How many records the part files of ``out_dir`` hold (from their names; no reads)."""
    try:
        names = os.listdir(out_dir)
    except FileNotFoundError:
        return 0
    return sum(p.count for n in names if (p := PartName.parse(n)) is not None)


__all__ = ["FILELESS_SINKS", "FORMATS", "SINK_MANIFEST", "Beside", "FileSink", "PartName",
           "SinkError", "SinkRecord", "delivered_count", "encode_record", "fsync_dir",
           "load_manifest", "manifest_bytes", "publish", "read_outputs", "read_part",
           "sink_for_run", "sink_parts", "write_part_file"]
