"""What every ``rayorch run <job>`` shares: output directory, progress, summary, exit code.

A job command (``pdf``, ``video``, ...) does::

    out = OutputDir.prepare(args.output, job="pdf", sources=sources, options={...},
                            overwrite=args.overwrite, resume=args.resume)
    clock = StartupClock(tty=sys.stdout.isatty())
    clock.starting_ray(); start_ray_for(plan, args.address); clock.starting_pools(plan)
    handle = pipeline.run(out.remaining(sources), ...)
    clock.running()
    summary = JobSummary(job="pdf", total=len(sources))
    with ProgressLines(summary, enabled=not tty):
        for index, value in handle:
            ... out.write_document(...) / out.add_row(...); summary.add(...)
    out.finish(summary)
    print(summary.text(...)); return summary.exit_code(allow_failures=...)

Rules (docs/ARCHITECTURE.md, "The job commands"): a non-empty ``--output`` from an
earlier run is refused unless ``--overwrite`` (its documents are removed first) or
``--resume`` (its successful documents are kept, the rest run again); no stale
document survives any run. Exit 0 only when every document succeeded, 1 when some
failed (0 with ``--allow-failures``), 2 for usage errors.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from rayorch.core.errors import RayorchError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
MARKER = ".rayorch-output.json"
ROWS = "documents.jsonl"
DOCUMENT_NAME = re.compile(r"^\d{5,}-[A-Za-z0-9._-]*\.[A-Za-z0-9]{1,8}$")
"""Names of the files a job writes per document: ``<index:05d>-<slug>.<ext>``."""
MAX_NAMED_FAILURES = 10


class UsageError(RayorchError):
    """A command line that cannot run as given (exit code 2); the message says what to do."""


def plural(count: int, noun: str) -> str:
    """``"1 document"``, ``"2 documents"``.

    >>> plural(1, "document"), plural(0, "page")
    ('1 document', '0 pages')
    """
    return f"{count} {noun}{'' if count == 1 else 's'}"


def slug(text: str) -> str:
    """A file-name-safe form of ``text`` (at most 80 characters)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:80] or "document"


def _digest(sources: list[str]) -> str:
    return hashlib.sha256("\n".join(sources).encode()).hexdigest()[:16]


class OutputDir:
    """A job's output directory: the marker, ``documents.jsonl`` and one file per document."""

    def __init__(self, path: Path, marker: dict[str, Any], kept: dict[int, dict[str, Any]]
                 ) -> None:
        self.path = path
        self.marker = marker
        self.kept = kept
        """Rows of documents an earlier run finished and ``--resume`` keeps, by id."""
        self._rows = (path / ROWS).open("a", encoding="utf-8")
        self.written: list[str] = []

    @classmethod
    def prepare(cls, out: str | Path, *, job: str, sources: list[str],
                options: dict[str, Any], overwrite: bool = False, resume: bool = False
                ) -> OutputDir:
        """Check ``out`` against the rules above and make it ready for this run."""
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
        elif (path / ROWS).exists():
            earlier = {}  # written before the marker existed: still an earlier run
        entries = [p.name for p in path.iterdir()]
        marker = {"job": job, "sources": len(sources), "digest": _digest(sources),
                  "options": options, "status": "running", "runs": []}
        kept: dict[int, dict[str, Any]] = {}
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
                kept = _finished_rows(path, len(sources))
                marker["runs"] = list(earlier.get("runs", []))
            _remove_documents(path, keep={row["markdown"] for row in kept.values()})
        _write_json(marker_path, marker)
        (path / ROWS).write_text(
            "".join(json.dumps(row, ensure_ascii=False) + "\n" for _, row in sorted(kept.items())),
            encoding="utf-8")
        return cls(path, marker, kept)

    def remaining(self, sources: list[str]) -> list[int]:
        """Ids of the sources this run must (re)do."""
        return [i for i in range(len(sources)) if i not in self.kept]

    def note_run(self, run_id: str) -> None:
        self.marker["runs"].append(run_id)
        _write_json(self.path / MARKER, self.marker)

    def write_document(self, index: int, stem: str, suffix: str, content: str) -> str:
        """Write one document atomically; returns its file name."""
        name = f"{index:05d}-{slug(stem)}{suffix}"
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(content, encoding="utf-8")
        os.replace(tmp, self.path / name)
        self.written.append(name)
        return name

    def add_row(self, row: dict[str, Any]) -> None:
        """Append one row to ``documents.jsonl`` (flushed: a resume reads it back)."""
        self._rows.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._rows.flush()

    def finish(self, complete: bool) -> None:
        """Sort ``documents.jsonl`` by id and record the run's end in the marker."""
        self._rows.close()
        rows: dict[int, dict[str, Any]] = {}
        for row in _read_rows(self.path / ROWS):
            rows[int(row["id"])] = row
        tmp = self.path / f".{ROWS}.tmp"
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n"
                               for _, r in sorted(rows.items())), encoding="utf-8")
        os.replace(tmp, self.path / ROWS)
        self.marker["status"] = "complete" if complete else "incomplete"
        _write_json(self.path / MARKER, self.marker)

    def close(self) -> None:
        if not self._rows.closed:
            self._rows.close()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _read_rows(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if not path.exists():
        return rows
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash: that document runs again
        if isinstance(row, dict) and isinstance(row.get("id"), int):
            rows.append(row)
    return rows


def _finished_rows(path: Path, count: int) -> dict[int, dict[str, Any]]:
    """Rows of documents that succeeded and whose file is still there."""
    kept = {}
    for row in _read_rows(path / ROWS):
        name = row.get("markdown")
        if (row.get("status") == "ok" and 0 <= row["id"] < count and isinstance(name, str)
                and DOCUMENT_NAME.match(name) and (path / name).is_file()):
            kept[row["id"]] = row
    return kept


def _remove_documents(path: Path, keep: set[str]) -> None:
    """Remove what an earlier run wrote (document files, rows, temp files), except ``keep``."""
    for entry in path.iterdir():
        name = entry.name
        ours = DOCUMENT_NAME.match(name) or (name.startswith(".") and name.endswith(".tmp"))
        if ours and name not in keep and entry.is_file():
            entry.unlink()
    (path / ROWS).unlink(missing_ok=True)


# -- summary ------------------------------------------------------------------------------
@dataclass
class JobSummary:
    """Counts of a job run, its failures and warnings, and its clock."""

    job: str
    total: int
    documents: int = 0
    succeeded: int = 0
    pages: int = 0
    kept: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    """``(source, cause)`` of each failed document, in the words of ``documents.jsonl``."""
    warnings: list[str] = field(default_factory=list)
    engines: Counter[str] = field(default_factory=Counter)
    run_started: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_ok(self, pages: int) -> None:
        with self.lock:
            self.documents += 1
            self.succeeded += 1
            self.pages += pages

    def add_failed(self, source: str, cause: str) -> None:
        with self.lock:
            self.documents += 1
            self.failures.append((source, cause))

    @property
    def failed(self) -> int:
        return len(self.failures)

    def exit_code(self, *, allow_failures: bool = False) -> int:
        """0 when every document succeeded (or ``allow_failures``), else 1."""
        return EXIT_OK if not self.failures or allow_failures else EXIT_FAILED

    def failure_kinds(self) -> dict[str, int]:
        from rayorch.pipelines.pdf import failure_kind

        return dict(sorted(Counter(failure_kind(c) for _, c in self.failures).items()))

    def progress_line(self) -> str:
        with self.lock:
            elapsed = time.monotonic() - (self.run_started or time.monotonic())
            rate = self.pages / elapsed if elapsed > 0 else 0.0
            done = self.documents + self.kept
            return (f"rayorch: {done}/{self.total} documents, {plural(self.pages, 'page')}, "
                    f"{rate:.1f} pages/s, {plural(self.failed, 'failure')}")

    def failure_lines(self) -> list[str]:
        lines = [f"  {source}: {cause}" for source, cause in self.failures[:MAX_NAMED_FAILURES]]
        more = len(self.failures) - MAX_NAMED_FAILURES
        if more > 0:
            lines.append(f"  ... and {more} more (see documents.jsonl)")
        return lines


def format_seconds(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 600 else f"{seconds / 60:.1f} min"


# -- Ray start-up and progress -----------------------------------------------------------
def start_ray_for(plan: Any, address: str | None) -> str:
    """Attach or start a private local Ray sized for ``plan``'s pools (see ``ray_cluster``)."""
    from rayorch.runtime.ray_cluster import ensure_ray

    need_cpus = sum(m.options.replicas * m.options.num_cpus for m in plan.modules)
    need_gpus = sum(m.options.replicas * m.options.num_gpus for m in plan.modules)
    return ensure_ray(address, num_cpus=max(os.cpu_count() or 1, math.ceil(need_cpus)),
                      num_gpus=math.ceil(need_gpus) if need_gpus else None,
                      log_to_driver=False)


class StartupClock:
    """Start-up lines on stderr and the times of each phase (Ray, pools, run)."""

    def __init__(self, *, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.t0 = time.monotonic()
        self.t_ray: float | None = None
        self.t_pools: float | None = None
        self.t_end: float | None = None

    def say(self, line: str) -> None:
        if not self.quiet:
            print(line, file=self.stream, flush=True)

    def starting_ray(self) -> None:
        self.say("rayorch: starting Ray...")

    def starting_pools(self, plan: Any) -> None:
        self.t_ray = time.monotonic()
        pools = ", ".join(f"{m.name} x{m.options.replicas}" for m in plan.modules)
        self.say(f"rayorch: starting {plural(len(plan.modules), 'pool')} ({pools})...")

    def running(self) -> float:
        self.t_pools = time.monotonic()
        return self.t_pools

    def done(self) -> None:
        self.t_end = time.monotonic()

    def times(self) -> dict[str, float]:
        """``ray_start_s``, ``pools_start_s``, ``startup_s``, ``run_s``, ``wall_s``."""
        end = self.t_end or time.monotonic()
        ray_at = self.t_ray or self.t0
        pools_at = self.t_pools or ray_at
        return {"ray_start_s": round(ray_at - self.t0, 3),
                "pools_start_s": round(pools_at - ray_at, 3),
                "startup_s": round(pools_at - self.t0, 3),
                "run_s": round(end - pools_at, 3),
                "wall_s": round(end - self.t0, 3)}


class ProgressLines:
    """One progress line every ``every_s`` seconds on stderr (a background thread)."""

    def __init__(self, summary: JobSummary, *, enabled: bool, every_s: float = 5.0,
                 stream: TextIO | None = None) -> None:
        self.summary = summary
        self.enabled = enabled and every_s > 0
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            print(self.summary.progress_line(), file=self.stream, flush=True)

    def __enter__(self) -> ProgressLines:
        if self.enabled:
            self._thread = threading.Thread(target=self._loop, name="rayorch-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)


def add_job_options(parser: Any) -> None:
    """The options every job command takes (output handling, exit code, progress)."""
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the documents of an earlier run in --output")
    parser.add_argument("--resume", action="store_true",
                        help="continue an earlier run in --output: keep its finished "
                        "documents, run the rest")
    parser.add_argument("--allow-failures", action="store_true",
                        help="exit 0 even when some documents failed")
    parser.add_argument("--address", default=None,
                        help="Ray cluster to attach to (default: $RAY_ADDRESS, else a "
                        "private local Ray on 127.0.0.1)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no live table or progress lines")
    parser.add_argument("--progress-every", type=float, default=5.0, metavar="SECONDS",
                        help="seconds between progress lines when stdout is not a "
                        "terminal (default 5)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def iter_with_ids(results: Iterable[tuple[int, Any]], ids: list[int]
                  ) -> Iterable[tuple[int, Any]]:
    """Map a run's source positions back to the job's document ids (after ``--resume``)."""
    for position, value in results:
        yield ids[position], value


__all__ = [
    "EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "JobSummary", "OutputDir", "ProgressLines",
    "StartupClock", "UsageError", "add_job_options", "format_seconds", "iter_with_ids",
    "plural", "slug", "start_ray_for",
]
