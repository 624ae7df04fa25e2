"""A job's ``--output`` directory: the marker, one row per source, the files a job writes.

Rules (docs/ARCHITECTURE.md, "The job commands"): a non-empty ``--output`` from an
earlier run is refused unless ``--overwrite`` (what that run wrote is removed first) or
``--resume`` (its finished sources are kept, the rest run again); a directory without
the marker is never cleaned. No stale file survives any run.

What a job writes is data (:class:`JobLayout`): the rows file (``documents.jsonl``,
``videos.jsonl``), optionally one file per source (``NNNNN-slug.md``), a shared lines
file (``clips.jsonl``: lines per source, keyed by the source's path) and a folder of
files those lines name (``clips/``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayorch.core.errors import RayorchError

if TYPE_CHECKING:
    from rayorch.pipelines.job_cli import JobSummary

MARKER = ".rayorch-output.json"
DOCUMENT_NAME = re.compile(r"^\d{5,}-[A-Za-z0-9._-]*\.[A-Za-z0-9]{1,8}$")
"""Names of the files a job writes per source: ``<index:05d>-<slug>.<ext>``."""


class UsageError(RayorchError):
    """A command line that cannot run as given (exit code 2); the message says what to do."""


@dataclass(frozen=True)
class JobLayout:
    """What one job writes into ``--output``, and the words its messages use."""

    job: str
    """The job's name (``rayorch run <job>``), recorded in the marker."""
    unit: str
    """What one source is: ``"document"``, ``"video"``."""
    part: str
    """What a source is made of: ``"page"``, ``"clip"``."""
    rows: str
    """One row per source: ``{"id", "source", "status", "cause", ...}``."""
    row_defaults: dict[str, Any] = field(default_factory=dict)
    """Fields every row carries (a failed source keeps these values)."""
    file_field: str | None = None
    """The row field naming the source's own file (``NNNNN-slug.ext``), if it has one."""
    lines: str | None = None
    """A shared JSONL file of per-source lines, in source order."""
    line_source: str = "source"
    """The field of a line that holds its source's path (its row's ``source``)."""
    line_count: str = "parts"
    """The row field that counts the source's lines."""
    folder: str | None = None
    """A folder of files named by the lines' ``"file"`` field (relative to ``--output``)."""


PDF_JOB = JobLayout("pdf", unit="document", part="page", rows="documents.jsonl",
                    row_defaults={"pages": 0, "markdown": None}, file_field="markdown")
VIDEO_JOB = JobLayout("video", unit="video", part="clip", rows="videos.jsonl",
                      row_defaults={"clips": 0, "duration_s": None}, lines="clips.jsonl",
                      line_source="video", line_count="clips", folder="clips")
JOBS = {layout.job: layout for layout in (PDF_JOB, VIDEO_JOB)}


def job_layout(job: JobLayout | str) -> JobLayout:
    """The layout of ``job`` (a layout, or the name of a shipped job)."""
    if isinstance(job, JobLayout):
        return job
    try:
        return JOBS[job]
    except KeyError:
        raise RayorchError(f"unknown job {job!r}: choose one of {', '.join(JOBS)}") from None


def slug(text: str) -> str:
    """A file-name-safe form of ``text`` (at most 80 characters)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:80] or "document"


def _digest(sources: list[str]) -> str:
    return hashlib.sha256("\n".join(sources).encode()).hexdigest()[:16]


class OutputDir:
    """A job's output directory: the marker, the rows, and what each source wrote."""

    def __init__(self, path: Path, layout: JobLayout, marker: dict[str, Any],
                 kept: dict[int, dict[str, Any]], kept_lines: int) -> None:
        self.path = path
        self.layout = layout
        self.marker = marker
        self.kept = kept
        """Rows of sources an earlier run finished and ``--resume`` keeps, by id."""
        self.lines_written = kept_lines
        """Lines in ``layout.lines`` (kept ones included)."""
        self._rows = (path / layout.rows).open("a", encoding="utf-8")
        self._lines = (path / layout.lines).open("a", encoding="utf-8") if layout.lines else None
        self.written: list[str] = []
        self.started = False
        """Whether a run began here (:meth:`note_run`) or wrote anything."""

    @classmethod
    def prepare(cls, out: str | Path, *, job: JobLayout | str, sources: list[str],
                options: dict[str, Any], overwrite: bool = False, resume: bool = False
                ) -> OutputDir:
        """Check ``out`` against the rules above and make it ready for this run."""
        layout = job_layout(job)
        if overwrite and resume:
            raise UsageError("--overwrite and --resume exclude each other: choose one")
        path = Path(out)
        if path.exists() and not path.is_dir():
            raise UsageError(f"--output {path} is a file; give a directory")
        path.mkdir(parents=True, exist_ok=True)
        marker_path = path / MARKER
        earlier: dict[str, Any] | None = None
        if marker_path.exists():
            try:
                earlier = json.loads(marker_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                earlier = {}
        elif (path / layout.rows).exists():
            earlier = {}  # written before the marker existed: still an earlier run
        entries = [p.name for p in path.iterdir()]
        marker = {"job": layout.job, "sources": len(sources), "digest": _digest(sources),
                  "options": options, "status": "running", "runs": []}
        kept: dict[int, dict[str, Any]] = {}
        lines: dict[str, list[dict[str, Any]]] = {}
        if earlier is None and entries:
            raise UsageError(
                f"--output {path} is not empty and holds no earlier rayorch run; "
                "choose an empty or new directory")
        if earlier is not None:
            if not (overwrite or resume):
                status = earlier.get("status", "unknown")
                raise UsageError(
                    f"--output {path} holds an earlier run ({status}); pass --overwrite to "
                    "replace it or --resume to continue it")
            if resume:
                what = {"job": "the job", "digest": "the --input files",
                        "options": "the options"}
                mismatch = [what[k] for k in what if earlier.get(k) != marker[k]]
                if mismatch:
                    raise UsageError(
                        f"--resume needs the same job, --input files and options as the "
                        f"earlier run in {path} ({' and '.join(mismatch)} changed); "
                        "use --overwrite to start afresh")
                kept, lines = _finished(path, layout, len(sources))
                marker["runs"] = list(earlier.get("runs", []))
            _remove_outputs(path, layout, keep=_owned_files(layout, kept, lines))
        _write_json(marker_path, marker)
        ordered = sorted(kept.items())
        _write_lines(path / layout.rows, [row for _, row in ordered])
        kept_lines = [line for _, row in ordered for line in lines.get(row["source"], ())]
        if layout.lines:
            _write_lines(path / layout.lines, kept_lines)
        return cls(path, layout, marker, kept, len(kept_lines))

    def remaining(self, sources: list[str]) -> list[int]:
        """Ids of the sources this run must (re)do."""
        return [i for i in range(len(sources)) if i not in self.kept]

    def note_run(self, run_id: str) -> None:
        self.started = True
        self.marker["runs"].append(run_id)
        _write_json(self.path / MARKER, self.marker)

    def write_document(self, index: int, stem: str, suffix: str, content: str) -> str:
        """Write one source's file atomically; returns its name."""
        name = f"{index:05d}-{slug(stem)}{suffix}"
        self.started = True
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(content, encoding="utf-8")
        os.replace(tmp, self.path / name)
        self.written.append(name)
        return name

    def add_lines(self, lines: list[dict[str, Any]]) -> None:
        """Append one source's lines to ``layout.lines`` (before its row: see ``_finished``)."""
        if self._lines is None:
            raise RayorchError(f"the {self.layout.job} job writes no lines file")
        self.started = True
        self._lines.write("".join(json.dumps(line, ensure_ascii=False) + "\n"
                                  for line in lines))
        self._lines.flush()
        self.lines_written += len(lines)

    def add_row(self, row: dict[str, Any]) -> None:
        """Append one row to the rows file (flushed: a resume reads it back)."""
        self.started = True
        self._rows.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._rows.flush()

    def finish(self, complete: bool) -> None:
        """Sort the rows by id (and the lines by their source's id); record the run's end.

        A run that never started (Ray or the store failed first) and keeps nothing leaves
        no marker: a retry is not refused as if an earlier run were there.
        """
        self.close()
        if not complete and not self.started and not self.kept:
            for name in (MARKER, self.layout.rows, self.layout.lines):
                if name:
                    (self.path / name).unlink(missing_ok=True)
            return
        rows: dict[int, dict[str, Any]] = {}
        for row in _read_rows(self.path / self.layout.rows):
            rows[int(row["id"])] = row
        ordered = [row for _, row in sorted(rows.items())]
        _write_lines(self.path / self.layout.rows, ordered)
        if self.layout.lines:
            position = {row["source"]: n for n, row in enumerate(ordered)}
            lines = [line for line in _read_jsonl(self.path / self.layout.lines)
                     if line.get(self.layout.line_source) in position]
            lines.sort(key=lambda line: position[line[self.layout.line_source]])  # stable
            _write_lines(self.path / self.layout.lines, lines)
        self.marker["status"] = "complete" if complete else "incomplete"
        _write_json(self.path / MARKER, self.marker)

    def close(self) -> None:
        for stream in (self._rows, self._lines):
            if stream is not None and not stream.closed:
                stream.close()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _write_lines(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                   encoding="utf-8")
    os.replace(tmp, path)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if not path.exists():
        return found
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash: that source runs again
        if isinstance(value, dict):
            found.append(value)
    return found


def _read_rows(path: Path) -> list[dict[str, Any]]:
    return [row for row in _read_jsonl(path) if isinstance(row.get("id"), int)]


def _finished(path: Path, layout: JobLayout, count: int
              ) -> tuple[dict[int, dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Rows of sources that succeeded and whose outputs are all still there, and their lines.

    A source's lines are written before its row, so an ok row whose lines are not all
    there (a crash in between, or a damaged file) is not finished.
    """
    by_source: dict[str, list[dict[str, Any]]] = {}
    if layout.lines:
        for line in _read_jsonl(path / layout.lines):
            by_source.setdefault(str(line.get(layout.line_source)), []).append(line)
    kept: dict[int, dict[str, Any]] = {}
    for row in _read_rows(path / layout.rows):
        if row.get("status") != "ok" or not 0 <= row["id"] < count:
            continue
        if layout.file_field is not None:
            name = row.get(layout.file_field)
            if not (isinstance(name, str) and DOCUMENT_NAME.match(name)
                    and (path / name).is_file()):
                continue
        if layout.lines:
            mine = by_source.get(str(row.get("source")), [])
            if len(mine) != row.get(layout.line_count) or not all(
                    _inside(path, line["file"]) for line in mine if "file" in line):
                continue
        kept[row["id"]] = row
    return kept, {str(row["source"]): by_source.get(str(row["source"]), [])
                  for row in kept.values()}


def _inside(root: Path, name: Any) -> bool:
    """Whether ``name`` is a file under ``root`` (names read back are untrusted)."""
    if not isinstance(name, str):
        return False
    target = (root / name).resolve()
    return target.is_relative_to(root.resolve()) and target.is_file()


def _owned_files(layout: JobLayout, kept: dict[int, dict[str, Any]],
                 lines: dict[str, list[dict[str, Any]]]) -> set[str]:
    names = {str(row.get(layout.file_field)) for row in kept.values()} if layout.file_field \
        else set()
    names |= {str(line["file"]) for mine in lines.values() for line in mine if "file" in line}
    return names


def _remove_outputs(path: Path, layout: JobLayout, keep: set[str]) -> None:
    """Remove what an earlier run wrote (files, rows, lines, temp files), except ``keep``."""
    for entry in path.iterdir():
        name = entry.name
        ours = (layout.file_field and DOCUMENT_NAME.match(name)) or (
            name.startswith(".") and name.endswith(".tmp"))
        if ours and name not in keep and entry.is_file():
            entry.unlink()
    for shared in (layout.rows, layout.lines):
        if shared:
            (path / shared).unlink(missing_ok=True)
    folder = path / layout.folder if layout.folder else None
    if folder is None or not folder.is_dir() or folder.is_symlink():
        return
    kept = {(path / name).resolve() for name in keep}
    for entry in sorted(folder.rglob("*"), reverse=True):  # files before their folders
        if entry.is_dir() and not entry.is_symlink():
            if not any(entry.iterdir()):
                entry.rmdir()
        elif entry.resolve() not in kept:
            entry.unlink()
    if not any(folder.iterdir()):
        folder.rmdir()


def write_rows(
    results: Iterable[tuple[int, Any]],
    out_dir: str | Path | OutputDir,
    *,
    job: JobLayout,
    sources: list[str] | None,
    summary: JobSummary,
    write_ok: Callable[[OutputDir, JobSummary, int, Any], dict[str, Any] | None],
) -> JobSummary:
    """One row per ``(id, value)`` result, written as it comes; returns the counts.

    ``write_ok(out, summary, id, value)`` writes a finished source's outputs, counts it
    and returns its row fields, or returns ``None`` when ``value`` is not a finished
    source (a :class:`~rayorch.FailedResult` or a ``RecordFailure``): that source is
    failed, with the same cause in its row and in ``summary``. A plain path is (re)made
    as an output directory whose earlier outputs are replaced.
    """
    sources = sources or []
    out = out_dir if isinstance(out_dir, OutputDir) else OutputDir.prepare(
        out_dir, job=job, sources=sources, options={}, overwrite=True)
    try:
        for index, value in results:
            source = sources[index] if 0 <= index < len(sources) else None
            row: dict[str, Any] = {"id": index, "source": source, "status": "ok",
                                   "cause": None, **job.row_defaults}
            fields = write_ok(out, summary, index, value)
            if fields is not None:
                row.update(fields)
            else:
                cause = getattr(value, "cause", None) or f"unexpected result {value!r:.80}"
                row.update(status="failed", cause=cause)
                summary.add_failed(str(source), cause)
            out.add_row(row)
    finally:
        out.close()
    return summary


__all__ = ["DOCUMENT_NAME", "JOBS", "MARKER", "PDF_JOB", "VIDEO_JOB", "JobLayout", "OutputDir",
           "UsageError", "job_layout", "slug", "write_rows"]
