"""What each shipped job writes into ``--output``, and the words its messages use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rayorch.core.errors import RayorchError


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
    line_count: str = "parts"
    """The row field that counts the source's lines."""
    folder: str | None = None
    """A folder of the sources' files (relative to ``--output``): the files its lines'
    ``"file"`` field or its ``extra_files`` name."""
    extra_files: tuple[str, ...] = ()
    """Row fields naming more of a source's files, each a name or a list of names (a row
    without the field has none): a resumed source keeps them, a stale one is removed."""



PDF_JOB = JobLayout("pdf", unit="document", part="page", rows="documents.jsonl",
                    row_defaults={"pages": 0, "markdown": None}, file_field="markdown",
                    folder="figures", extra_files=("content_list", "figures"))
VIDEO_JOB = JobLayout("video", unit="video", part="clip", rows="videos.jsonl",
                      row_defaults={"clips": 0, "duration_s": None}, lines="clips.jsonl",
                      line_count="clips", folder="clips")
JOBS = {layout.job: layout for layout in (PDF_JOB, VIDEO_JOB)}


def job_layout(job: JobLayout | str) -> JobLayout:
    """The layout of ``job`` (a layout, or the name of a shipped job)."""
    if isinstance(job, JobLayout):
        return job
    try:
        return JOBS[job]
    except KeyError:
        raise RayorchError(f"unknown job {job!r}: choose one of {', '.join(JOBS)}") from None


__all__ = ["JOBS", "PDF_JOB", "VIDEO_JOB", "JobLayout", "job_layout"]
