"""A job's ``--output`` directory: the marker, the run's file sink, the files beside it.

A job delivers through the same sink as ``rayorch driver`` (:mod:`rayorch.runtime.sinks`,
docs/topics/JOBS.md "The job commands"): for each finished source, :meth:`OutputDir.render`
writes its human-facing files (``NNNNN-slug.md``) and gives its row, which the sink writes
to a part file; the driver then records the fenced ``OutputEmitted``. The part files and
their manifest are the record of delivery: exactly once, adopted after a crash,
:func:`~rayorch.runtime.sinks.read_outputs` reads them and ``rayorch audit`` checks them.
The rows file (``documents.jsonl``, ``videos.jsonl``) and the lines file (``clips.jsonl``)
are written from those records, in id order, when a run ends.

Rules: a non-empty ``--output`` from an earlier run is refused unless ``--overwrite``
(what that run wrote is removed first) or ``--resume`` (the sources its part files hold ok
with their files all there are kept, the rest run again in a new run that takes the
directory over); a directory without the marker is never cleaned. No stale file survives
any run.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from rayorch.core.errors import RayorchError
from rayorch.core.outcome import FailedResult, Outcome
from rayorch.pipelines.job.layouts import JobLayout, job_layout
from rayorch.pipelines.job.shard_rows import slim_row
from rayorch.pipelines.job.summary import JobSummary
from rayorch.pipelines.job.views import LINES_KEY, write_views
from rayorch.pipelines.sources import slug
from rayorch.runtime.delivery_writer import RENDER_THREADS
from rayorch.runtime.formats import RowSchema
from rayorch.runtime.formats.card import CARD_NAME, write_card
from rayorch.runtime.formats.index import INDEX_NAME, write_index
from rayorch.runtime.id_spill import IdSpill, NameSet, SpilledRows
from rayorch.runtime.sink_takeover import prune_parts, remove_sink, take_over
from rayorch.runtime.sinks import SINK_MANIFEST, FileSink, SinkRecord, read_outputs
from rayorch.storage import Storage, StorageError, check_key, open_storage

MARKER = ".rayorch-output.json"
FILES = "files"
"""The default ``--format``: a file per source (``.md``...) beside the run's part files."""
DOCUMENT_NAME = re.compile(r"^\d{5,}-[A-Za-z0-9._-]*\.[A-Za-z0-9]{1,8}$")
"""Names of the files a job writes per source: ``<index:05d>-<slug>.<ext>``."""
DROPPED_NAME = "dropped.jsonl"
"""One line per document a data-quality stage dropped, and why (``job/drops.py``)."""


class UsageError(RayorchError):
    """A command line that cannot run as given (exit code 2); the message says what to do."""


@dataclass(frozen=True)
class JobWriter:
    """How a job writes and counts one finished source; the rest is the same for every job."""

    finished: Callable[[Any], bool]
    """Whether a result is a finished source (else, a ``FailedResult`` or a value no
    source should give, it is a failed one)."""
    render: Callable[[OutputDir, int, Any], dict[str, Any]]
    """``render(out, id, value)``: write a finished source's files; its row fields."""
    count: Callable[[JobSummary, Any], None]
    """``count(summary, value)``: add a finished source to the summary."""
    rows: Callable[[], RowSchema] | None = None
    """The declared columns of the job's rows in a shard format (``--format parquet``...)."""
    shard_row: Callable[[int, Any, str | None, str, str], dict[str, Any]] | None = None
    """``shard_row(id, value, source, run_id, config)``: a finished source's typed row."""

    def delivered(self, summary: JobSummary, source: str | None, value: Any) -> None:
        """Count one delivered result: finished, dropped (by a data-quality stage), or
        failed with its row's cause."""
        if self.finished(value):
            self.count(summary, value)
        elif isinstance(value, FailedResult) and value.outcome is Outcome.DROPPED:
            summary.add_dropped()
        else:
            summary.add_failed(str(source), failure_cause(value))


def failure_cause(value: Any) -> str:
    """The cause a source that did not make it has in its row and in the summary."""
    return getattr(value, "cause", None) or f"unexpected result {value!r:.80}"


class OutputDir:
    """A job's output directory: the marker, the run's sink, and what each source wrote."""

    def __init__(self, storage: Storage, layout: JobLayout, marker: dict[str, Any],
                 kept: Mapping[int, dict[str, Any]]) -> None:
        self.storage = storage
        self.url = storage.url
        """Where the outputs are, as printed: a directory or ``s3://bucket/prefix``."""
        self.path = storage.local_path("")
        """The local directory (None on an object store)."""
        self.layout = layout
        self.marker = marker
        self.kept = kept
        """Rows of sources an earlier run finished and ``--resume`` keeps, by id (on a local
        spill: :class:`~rayorch.runtime.id_spill.SpilledRows`)."""
        self.files_written = 0
        """Files of ``layout.file_field`` the rows name (kept ones included)."""
        self.lines_written = 0
        """Lines in ``layout.lines`` (kept ones included)."""
        self.sink: FileSink | None = None
        self._writer: JobWriter | None = None
        self.drops: list[dict[str, Any]] | None = None
        """The ``dropped.jsonl`` rows of this run (None: the run has no quality stage)."""
        self.started = False
        """Whether a run began here (:meth:`note_run`)."""
        self.stream: Any = None
        """The run's :class:`~rayorch.pipelines.inputs.InputStream` (the source of each id
        and its manifest columns), once the run has one."""
        self._failed: IdSpill | None = None
        """The source and manifest columns of each source that failed or was dropped, for
        its row (:meth:`keep_failed`): on local disk, not in the stream's memory."""
        self.format: str = marker.get("options", {}).get("format", FILES)
        """``files`` (a file per source beside the parts) or a shard format's name."""
        self.shard_size: int | None = marker.get("options", {}).get("shard_size")
        self.run_id = ""
        self.config = hashlib.sha256(orjson.dumps(marker.get("options", {}),
                                                  option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
        """The fingerprint of the job's options (each shard row's ``config``)."""

    def source_name(self, index: int) -> str | None:
        """The source of id ``index``: the stream's, else the kept row's (or the failed
        one's, :meth:`keep_failed`)."""
        return self._entry(index)[0]

    def keep_failed(self, index: int) -> None:
        """Source ``index`` failed or was dropped: keep its source and manifest columns for
        its row (on local disk), so that the stream forgets it as it does a finished one."""
        if self.stream is None:
            return
        if self._failed is None:
            self._failed = IdSpill()
        self._failed.add(index, orjson.dumps([self.stream.name(index),
                                              self.stream.metadata(index)]))

    def _entry(self, index: int) -> tuple[str | None, dict[str, Any] | None]:
        """``(source, manifest columns)`` of id ``index``, wherever they are kept."""
        if self.stream is not None:
            name = self.stream.name(index)
            if name is not None:
                return name, self.stream.metadata(index)
            body = None if self._failed is None else self._failed.get(index)
            if body is not None:
                name, metadata = orjson.loads(body)
                return name, metadata
            return None, None
        row = self.kept.get(index)
        return (None if row is None else row.get("source")), None

    @property
    def sharded(self) -> bool:
        return self.format != FILES

    @classmethod
    def prepare(cls, out: str | Path, *, job: JobLayout | str,
                input: dict[str, Any] | None = None, sources: Sequence[str] | None = None,
                options: dict[str, Any], overwrite: bool = False, resume: bool = False
                ) -> OutputDir:
        """Check ``out`` against the rules above and make it ready for this run; ``input``
        is the run's input spec (:meth:`~rayorch.pipelines.inputs.InputSpec.record`): a
        ``--resume`` needs the same (the listing itself is checked as it is read again).
        ``sources`` instead: a list of sources known up front (recorded by digest)."""
        fixed = None
        if sources is not None:
            from rayorch.pipelines.inputs import FixedSources

            fixed = FixedSources(list(sources))
            input = fixed.record()
        if input is None:
            raise UsageError("OutputDir.prepare needs input= (a spec) or sources= (a list)")
        layout = job_layout(job)
        if overwrite and resume:
            raise UsageError("--overwrite and --resume exclude each other: choose one")
        try:
            storage = open_storage(out)
            path = storage.local_path("")
            if path is not None and path.exists() and not path.is_dir():
                raise UsageError(f"--output {path} is a file; give a directory")
            storage.make_dir()
            earlier: dict[str, Any] | None = None
            try:
                earlier = json.loads(storage.read(MARKER).decode("utf-8"))
            except FileNotFoundError:
                if storage.head(layout.rows) or storage.head(SINK_MANIFEST):
                    earlier = {}  # its marker is gone: still an earlier run
            except ValueError:
                earlier = {}
            entries = next(iter(storage.names("")), []) if path is None \
                else [p.name for p in path.iterdir()]
        except StorageError as exc:
            raise UsageError(f"--output {out}: {exc}") from None
        path_text = storage.url
        marker = {"job": layout.job, "input": input, "options": options,
                  "status": "running", "runs": []}
        kept: Mapping[int, dict[str, Any]] = {}
        if earlier is None and entries:
            raise UsageError(
                f"--output {path_text} is not empty and holds no earlier rayorch run; "
                "choose an empty or new directory")
        if earlier is not None:
            if not (overwrite or resume):
                status = earlier.get("status", "unknown")
                raise UsageError(
                    f"--output {path_text} holds an earlier run ({status}); pass --overwrite to "
                    "replace it or --resume to continue it")
            if resume:
                what = {"job": "the job", "input": "the --input", "options": "the options"}
                mismatch = [what[k] for k in what if earlier.get(k) != marker[k]]
                if mismatch:
                    raise UsageError(
                        f"--resume needs the same job, --input and options as the "
                        f"earlier run in {path_text} ({' and '.join(mismatch)} changed); "
                        "use --overwrite to start afresh")
                kept = _finished(storage, layout, options.get("format", FILES) != FILES)
                marker["runs"] = list(earlier.get("runs", []))
                if isinstance(earlier.get("dedup_scope"), str):  # the same dedup index
                    marker["dedup_scope"] = earlier["dedup_scope"]
            else:
                remove_sink(storage.url)
            with _owned_files(layout, kept) as owned:
                _remove_outputs(storage, layout, keep=owned)
        _write_json(storage, MARKER, marker)
        result = cls(storage, layout, marker, kept)
        result.stream = fixed
        result._write_views(kept.items())
        return result

    @property
    def dedup_scope(self) -> str:
        """The dedup index of this output (kept by ``--resume``, new otherwise)."""
        scope = self.marker.get("dedup_scope")
        if not isinstance(scope, str):
            from rayorch.pipelines.quality import new_scope

            scope = self.marker["dedup_scope"] = new_scope()
            _write_json(self.storage, MARKER, self.marker)
        return scope

    def sink_for(self, run_id: str, writer: JobWriter) -> FileSink:
        """The file sink run ``run_id`` delivers to here, ``writer`` writing each source's
        files beside its part; an earlier run's directory (``--resume``) is taken over
        (its kept parts stay)."""
        self._writer = writer
        self.run_id = run_id
        take_over(self.url, run_id, self.patterns)
        if not self.sharded:
            self.sink = FileSink(self.url, "jsonl", run_id=run_id, beside=self,
                                 render_threads=RENDER_THREADS)
        else:
            self.sink = FileSink(self.url, self.format, run_id=run_id, beside=self,
                                 schema=writer.rows() if writer.rows else None,
                                 shard_size=self.shard_size, render_threads=RENDER_THREADS)
        return self.sink

    patterns: tuple[str, ...] = ("*",)
    """Names the sink lets stand beside its parts: the job's files and the user's own (a
    directory with the marker may hold them; it is never cleaned of them)."""

    def render(self, index: int, value: Any) -> Any:
        """Write source ``index``'s files; its row, or a ``FailedResult`` (the sink's
        :class:`~rayorch.runtime.sinks.Beside`: called just before its part is written)."""
        if isinstance(value, FailedResult):
            return value
        if self._writer is None or not self._writer.finished(value):
            return FailedResult(index, Outcome.FAILED, failure_cause(value))
        source = self.source_name(index)
        if self.sharded and self._writer.shard_row is not None:
            return self._writer.shard_row(index, value, source, self.run_id, self.config)
        fields = self._writer.render(self, index, value)
        row = {"id": index, "source": source, "status": "ok", "cause": None,
               **self.layout.row_defaults, **fields}
        metadata = self._entry(index)[1]
        if metadata is not None:  # the manifest's other columns (--input-list)
            row["metadata"] = metadata
        return row

    def note_run(self, run_id: str) -> None:
        self.started = True
        self.marker["runs"].append(run_id)
        _write_json(self.storage, MARKER, self.marker)

    def write_document(self, index: int, stem: str, suffix: str, content: str) -> str:
        """Write one source's file whole (one atomic write); returns its name."""
        name = f"{index:05d}-{slug(stem)}{suffix}"
        _put(self.storage, name, content.encode("utf-8"))
        return name

    def write_in_folder(self, name: str, data: bytes) -> str:
        """Write one of a source's files into the job's folder whole (one atomic write);
        ``name`` is relative to ``--output`` and lies in ``layout.folder``. Returns it."""
        folder = self.layout.folder
        try:
            key = check_key(name)
        except StorageError as exc:
            raise UsageError(f"--output {self.url}: {exc}") from None
        if folder is None or not key.startswith(f"{folder}/"):
            raise UsageError(f"--output {self.url}: {name!r} is not in the job's folder "
                             f"{folder!r}")
        _put(self.storage, key, data)
        return key

    def finish(self, complete: bool) -> None:
        """Write the rows (and lines) of every delivered source in id order; record the
        run's end.

        A run that never started (Ray or the store failed first) and keeps nothing leaves
        no marker: a retry is not refused as if an earlier run were there.
        """
        if not complete and not self.started and not self.kept:
            try:
                for name in (MARKER, self.layout.rows, self.layout.lines):
                    if name:
                        self.storage.delete(name)
            except StorageError as exc:
                raise UsageError(f"--output {self.url}: {exc}") from None
            remove_sink(self.url)
            return
        try:
            self._write_views(self.rows())
        finally:
            if self._failed is not None:
                self._failed.close()
                self._failed = None
        if self.sharded and _exists(self.storage, SINK_MANIFEST):
            write_index(self.storage)
            if self._writer is not None and self._writer.rows is not None:  # for `datasets`
                write_card(self.storage, self._writer.rows(), self.format)
        if self.drops is not None:
            _write_lines(self.storage, DROPPED_NAME, self.drops)
        self.marker["status"] = "complete" if complete else "incomplete"
        _write_json(self.storage, MARKER, self.marker)

    def rows(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(id, row)`` of every source the part files hold, part by part (a failed one's
        from its record; a value that is not a row, written by ``rayorch resume RUN``, has
        none). A source in two parts is not checked here: :func:`write_views` refuses it."""
        if not _exists(self.storage, SINK_MANIFEST):
            yield from self.kept.items()
            return
        drop_causes = self._drop_causes()
        for record in read_outputs(self.url, check_twice=False):
            index, value = record["index"], record.get("value")
            if record["outcome"] == Outcome.PRESENT.value:
                if isinstance(value, dict) and value.get("id") == index:
                    yield index, slim_row(value) if self.sharded else value
                continue
            source, metadata = self._entry(index)
            cause = record["cause"]
            status = "failed"
            if record["outcome"] == Outcome.DROPPED.value:
                status, cause = "dropped", drop_causes.get(index, cause)
            row = {"id": index, "source": source, "status": status, "cause": cause,
                   **self.layout.row_defaults}
            if metadata is not None:
                row["metadata"] = metadata
            yield index, row

    def ids_of(self, sources: set[str]) -> dict[str, int]:
        """The id of each of ``sources`` the part files hold (one pass over the parts)."""
        return {source: index for index, row in self.rows()
                if (source := str(row.get("source"))) in sources}

    def _write_views(self, rows: Iterable[tuple[int, dict[str, Any]]]) -> None:
        try:
            counts = write_views(self.storage, self.layout, rows)
        except StorageError as exc:
            raise UsageError(f"--output {self.url}: {exc}") from None
        self.lines_written, self.files_written = counts.lines, counts.files

    def _drop_causes(self) -> dict[int, str]:
        """``stage: reason`` of each document this run dropped (``dropped.jsonl``)."""
        return {int(row["id"]): f"{row['stage']}: {row['reason']}" for row in self.drops or ()}


def _put(storage: Storage, name: str, data: bytes) -> None:
    try:
        storage.put(name, data)
    except StorageError as exc:
        raise UsageError(f"--output {storage.url}: {exc}") from None


def _exists(storage: Storage, name: str) -> bool:
    try:
        return storage.head(name) is not None
    except StorageError as exc:
        raise UsageError(f"--output {storage.url}: {exc}") from None


def _write_json(storage: Storage, name: str, data: dict[str, Any]) -> None:
    _put(storage, name, (json.dumps(data, indent=1) + "\n").encode("utf-8"))


def _write_lines(storage: Storage, name: str, rows: list[dict[str, Any]]) -> None:
    _put(storage, name, "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                for r in rows).encode("utf-8"))


def _finished(storage: Storage, layout: JobLayout, sharded: bool = False
              ) -> SpilledRows:
    """Rows of the sources the part files hold ok whose files are all still there (a shard
    format's rows slimmed: they hold their content); the part files keep only those records
    (everything else runs again)."""
    rows = SpilledRows()
    if not _exists(storage, SINK_MANIFEST):
        return rows

    def whole(record: SinkRecord) -> bool:
        if record.value_json is None or record.index < 0:
            return False
        row = orjson.loads(record.value_json)
        if not (isinstance(row, dict) and row.get("id") == record.index
                and row.get("status") == "ok"):
            return False
        if sharded:
            return True
        if layout.file_field is not None:
            name = row.get(layout.file_field)
            if not (isinstance(name, str) and DOCUMENT_NAME.match(name)
                    and _exists(storage, name)):
                return False
        mine = row.get(LINES_KEY, [])
        return isinstance(mine, list) and len(mine) == row.get(layout.line_count, len(mine)) \
            and all(_inside(storage, line["file"]) for line in mine
                    if isinstance(line, dict) and "file" in line) \
            and all(_inside(storage, name) for name in _extra_files(layout, row))

    from rayorch.pipelines.job.shard_rows import job_rows

    schema = job_rows(layout.job) if sharded else None

    def kept(record: SinkRecord) -> None:
        row = orjson.loads(record.value_json or b"null")
        rows.add(record.index, slim_row(row) if sharded else row)

    prune_parts(storage.url, whole, kept, schema)
    return rows


def _inside(storage: Storage, name: Any) -> bool:
    """Whether ``name`` is a file under the output (names read back are untrusted)."""
    if not isinstance(name, str):
        return False
    root = storage.local_path("")
    if root is None:
        try:
            return _exists(storage, check_key(name))
        except StorageError:
            return False
    target = (root / name).resolve()
    return target.is_relative_to(root.resolve()) and target.is_file()


def _extra_files(layout: JobLayout, row: dict[str, Any]) -> list[Any]:
    """The names a row's ``layout.extra_files`` fields hold (unchecked: read back rows are
    untrusted)."""
    names: list[Any] = []
    for field_name in layout.extra_files:
        value = row.get(field_name)
        if value is not None:
            names.extend(value if isinstance(value, list) else [value])
    return names


def _owned_files(layout: JobLayout, kept: Mapping[int, dict[str, Any]]) -> NameSet:
    """The files the kept rows name (on a local spill)."""
    names = NameSet()
    for _, row in kept.items():
        if layout.file_field:
            names.add(str(row.get(layout.file_field)))
        for line in row.get(LINES_KEY, ()):
            if "file" in line:
                names.add(str(line["file"]))
        for name in _extra_files(layout, row):
            names.add(str(name))
    return names


def _remove_outputs(storage: Storage, layout: JobLayout, keep: NameSet) -> None:
    """Remove what an earlier run wrote (files, rows, lines, temp files), except ``keep``."""
    try:
        for page in storage.names(""):
            for name in page:
                ours = (layout.file_field and DOCUMENT_NAME.match(name)) or (
                    name.startswith(".") and name.endswith(".tmp"))
                if ours and name not in keep:
                    storage.delete(name)
        for shared in (layout.rows, layout.lines, DROPPED_NAME, INDEX_NAME, CARD_NAME):
            if shared:
                storage.delete(shared)
    except StorageError as exc:
        raise UsageError(f"--output {storage.url}: {exc}") from None
    if layout.folder:
        _remove_folder(storage, layout.folder, keep)


def _remove_folder(storage: Storage, folder: str, keep: NameSet) -> None:
    """Remove the files in ``folder`` except ``keep``, then its empty folders (a symlinked
    folder is the user's: left alone)."""
    path = storage.local_path(folder)
    if path is not None and path.is_symlink():
        return
    try:
        for page in storage.walk(folder):
            for info in page:
                if info.key not in keep:
                    storage.delete(info.key)
        storage.remove_empty_dirs(folder)
    except StorageError as exc:
        raise UsageError(f"--output {storage.url}: {exc}") from None


__all__ = ["DOCUMENT_NAME", "DROPPED_NAME", "LINES_KEY", "MARKER", "JobWriter", "OutputDir",
           "UsageError", "failure_cause"]
