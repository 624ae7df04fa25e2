"""What ``rayorch run video`` writes: ``videos.jsonl``, ``clips.jsonl``, the clip files.

The rules for the output directory, the run's file sink, the summary and the exit code
are the job commands' (:mod:`rayorch.pipelines.job.cli`); :data:`VIDEO_WRITER` fills them
for videos.
"""

from __future__ import annotations

from typing import Any

from rayorch.core.words import plural
from rayorch.pipelines.job.layouts import VIDEO_JOB
from rayorch.pipelines.job.output import LINES_KEY, JobWriter, OutputDir
from rayorch.pipelines.job.shard_rows import video_row, video_rows
from rayorch.pipelines.job.summary import JobSummary


def _finished(value: Any) -> bool:
    return isinstance(value, dict) and "clips" in value


def _write_clips(out: OutputDir, index: int, value: dict[str, Any]) -> dict[str, Any]:
    """A video's row and its clip lines (a clip file under ``--output`` named relative to it)."""
    root = f"{out.path.resolve()}/" if out.path is not None else f"{out.url.rstrip('/')}/"
    lines = []
    for clip in value["clips"]:
        line = {"video": value["path"], **{k: v for k, v in clip.items() if k != "video"}}
        if isinstance(line.get("file"), str) and line["file"].startswith(root):
            line["file"] = line["file"][len(root):]
        lines.append(line)
    return {"source": value["path"], "clips": len(lines), "duration_s": value["duration_s"],
            "fps": value["fps"], "width": value["width"], "height": value["height"],
            "cuts": value["cuts"], LINES_KEY: lines}


def _count_clips(summary: JobSummary, value: dict[str, Any]) -> None:
    summary.add_ok(len(value["clips"]))


VIDEO_WRITER = JobWriter(_finished, _write_clips, _count_clips, video_rows, video_row)
"""A video's ``videos.jsonl`` row and its ``clips.jsonl`` lines (one per clip, in time
order; the clip files ``--write-clips`` copies are made by ``ProbeVideo``). Results are
``AssembleVideo`` dicts, else failed videos."""


def outputs_text(out: OutputDir, summary: JobSummary) -> str:
    """What a video run left in ``--output``, for the summary."""
    clips = out.lines_written
    written = [f"{out.url}/videos.jsonl (one line per video)",
               f"{out.url}/clips.jsonl " + (f"({plural(clips, 'line')}, one per clip)" if clips
                                             else "(empty: no clip was made)")]
    files = sum(len(page) for page in out.storage.walk(str(VIDEO_JOB.folder)))
    if files:
        written.append(f"{out.url.rstrip('/')}/{VIDEO_JOB.folder}/ "
                       f"({plural(files, 'clip file')})")
    return ", ".join(written)


__all__ = ["VIDEO_WRITER", "outputs_text"]
