"""``rayorch run video``: the video job — videos in a directory to annotated scene clips.

    rayorch run video --input DIR --output DIR [--annotate stats|ocr|vllm] [--model M]
                      [--max-clip-s S] [--min-clip-s S] [--threshold T]
                      [--keyframes first,middle,last] [--write-clips]
                      [--overwrite] [--allow-failures] [--store URL] [--replicas N]
                      [--batch-size B] [--no-progress] [--json]

Writes OUTPUT/videos.jsonl (one line per video: status, clip count, cause) and
OUTPUT/clips.jsonl (one line per clip, videos in input order, clips in time order);
--write-clips also copies each clip to OUTPUT/clips/ (stream copy, from the keyframe
at or before its start).

Annotation engines: stats (default; CPU; motion, brightness and sharpness flags, no
model), ocr (on-screen text in keyframes with RapidOCR; CPU), vllm (a captioning VLM
on a GPU; --model).

Exit status: 0 when every video succeeded; 1 when some failed (0 with
--allow-failures); 2 for a usage error, including an --output directory that holds
an earlier run's files (pass --overwrite to replace them).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from rayorch.core.errors import RayorchError

EXIT_OK, EXIT_SOME_FAILED = 0, 1
OUTPUT_NAMES = frozenset({"videos.jsonl", "clips.jsonl", "clips"})
"""What ``rayorch run video`` writes into ``--output`` (and ``--overwrite`` replaces)."""
PROGRESS_EVERY_S = 5.0
FAILED_LISTED = 10


def _add(group: Any, *names: str, **options: Any) -> None:
    """Add an option unless the ``run`` parser already has it (shared with other jobs)."""
    with contextlib.suppress(argparse.ArgumentError):
        group.add_argument(*names, **options)


def add_video_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``rayorch run video`` (grouped in ``--help``)."""
    from rayorch.pipelines.video_annotate import ANNOTATORS

    group = parser.add_argument_group("video job (rayorch run video)")
    _add(group, "--annotate", default="stats", choices=sorted(ANNOTATORS),
         help="clip annotation engine: stats (default, signals only), ocr (RapidOCR on "
              "keyframes), vllm (captions on a GPU)")
    _add(group, "--max-clip-s", type=float, default=10.0,
         help="longest clip in seconds; longer scenes are split evenly (default 10)")
    _add(group, "--min-clip-s", type=float, default=0.5,
         help="shortest scene in seconds; shorter ones merge with a neighbour (default 0.5)")
    _add(group, "--threshold", type=float, default=27.0,
         help="content-detector cut threshold (PySceneDetect's scale; default 27)")
    _add(group, "--keyframes", default="first,middle,last",
         help="keyframe positions per clip: first, middle, last or fractions (default "
              "first,middle,last)")
    _add(group, "--write-clips", action="store_true",
         help="also copy each clip to OUTPUT/clips/ (stream copy)")
    _add(group, "--decode-replicas", type=int, default=1, help="clip decoding actors")
    _add(group, "--overwrite", action="store_true",
         help="replace the outputs of an earlier run in --output")
    _add(group, "--allow-failures", action="store_true",
         help="exit 0 even when some inputs failed")


def prepare_output(out: Path, *, overwrite: bool) -> None:
    """Refuse a non-empty ``out`` unless ``overwrite``; then remove an earlier run's outputs.

    Files the job does not write are never deleted: such a directory is refused.
    """
    if out.exists() and not out.is_dir():
        raise RayorchError(f"--output {out} is a file; pass a directory")
    if not out.exists():
        return
    entries = sorted(out.iterdir())
    if not entries:
        return
    others = [p.name for p in entries if p.name not in OUTPUT_NAMES]
    if others:
        raise RayorchError(f"--output {out} holds files this job did not write "
                           f"({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}): "
                           "choose an empty or new directory")
    if not overwrite:
        raise RayorchError(f"--output {out} holds the outputs of an earlier run: pass "
                           "--overwrite to replace them, or choose another directory")
    for path in entries:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


class _ProgressLines:
    """One line on stderr every ``PROGRESS_EVERY_S`` seconds (when not on a terminal)."""

    def __init__(self, total: int, started: float, enabled: bool) -> None:
        self.total, self.started, self.enabled = total, started, enabled
        self.last = started

    def __call__(self, counts: dict[str, int]) -> None:
        now = time.perf_counter()
        if not self.enabled or now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        rate = counts["clips"] / max(now - self.started, 1e-9)
        print(f"rayorch run video: {counts['videos']}/{self.total} videos, "
              f"{_plural(counts['clips'], 'clip')} ({rate:.1f} clips/s), "
              f"{counts['failed']} failed", file=sys.stderr, flush=True)


def _summary_text(summary: dict[str, Any], run_id: str, engine: str) -> str:
    lines = [
        f"run {run_id} done: {_plural(summary['videos'], 'video')} ({summary['succeeded']} ok,"
        f" {summary['failed']} failed), {_plural(summary['clips'], 'clip')} in "
        f"{summary['elapsed_s']:.1f} s (start-up {summary['startup_s']:.1f} s) = "
        f"{summary['clips_per_s']} clips/s (annotate {engine})"
    ]
    failed = summary["failed_files"]
    if failed:
        lines.append(f"failed ({len(failed)}):")
        lines += [f"  {f['source']}: {f['cause']}" for f in failed[:FAILED_LISTED]]
        if len(failed) > FAILED_LISTED:
            lines.append(f"  ... and {len(failed) - FAILED_LISTED} more (see videos.jsonl)")
    out = summary["out_dir"]
    written = [f"{out}/videos.jsonl (one line per video)"]
    if summary["clips"]:
        written.append(f"{out}/clips.jsonl (one line per clip)")
    else:
        written.append(f"{out}/clips.jsonl (empty: no clip was made)")
    if summary.get("clip_files"):
        written.append(f"{out}/clips/ ({_plural(summary['clip_files'], 'clip file')})")
    lines.append("output: " + ", ".join(written))
    return "\n".join(lines)


def cmd_run_video(args: argparse.Namespace) -> int:
    """Run the video pipeline over ``--input`` and write clips and videos to ``--output``."""
    from rayorch.pipelines.job_cli import start_ray_for
    from rayorch.pipelines.video import VideoPipeline, find_videos, write_outputs

    sources = find_videos(args.input)
    if not sources:
        raise RayorchError(f"no video files under {args.input} (looked for .mp4, .mkv, "
                           ".webm, .mov, .avi, .ogv, ...)")
    for name in ("max_clip_s", "replicas", "batch_size", "decode_replicas"):
        if getattr(args, name) <= 0:
            raise RayorchError(f"--{name.replace('_', '-')} must be positive")
    out = Path(args.output).resolve()
    prepare_output(out, overwrite=args.overwrite)
    options: dict[str, Any] = {
        "max_clip_s": args.max_clip_s, "min_clip_s": args.min_clip_s,
        "threshold": args.threshold, "keyframes": args.keyframes,
        "replicas": args.replicas, "batch_size": args.batch_size,
        "decode_replicas": args.decode_replicas,
        "clips_dir": str(out / "clips") if args.write_clips else None,
    }
    if args.model is not None:
        options["engine_options"] = {"model": args.model}
    pipeline = VideoPipeline(args.annotate, **options)
    if args.annotate == "vllm" and not (args.address or os.environ.get("RAY_ADDRESS")):
        from rayorch.pipelines.video_annotate import require_vllm_runtime

        require_vllm_runtime()  # a local run: say so now, not from inside an actor
    plan = pipeline.compile()
    on_terminal = sys.stderr.isatty()
    show = not args.no_progress
    if show:
        print(f"rayorch run video: {_plural(len(sources), 'video')}; starting Ray and "
              f"{len(plan.modules)} actor pools ...", file=sys.stderr, flush=True)
    start_ray_for(plan, args.address)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    handle = pipeline.run(sources, store=args.store, ordered=True,
                          progress=None if show and on_terminal else False, address=args.address)
    startup = time.perf_counter() - started  # the actor pools are up
    progress = _ProgressLines(len(sources), started, show and not on_terminal)
    summary = write_outputs(handle, out, sources=sources, on_video=progress)
    elapsed = time.perf_counter() - started
    summary["elapsed_s"] = round(elapsed, 3)
    summary["startup_s"] = round(startup, 3)
    summary["clips_per_s"] = round(summary["clips"] / elapsed, 2) if elapsed > 0 else None
    summary["run_id"] = handle.run_id
    summary["annotate"] = args.annotate
    if args.write_clips:
        summary["clip_files"] = sum(1 for p in (out / "clips").rglob("*") if p.is_file())
    if args.json:
        sys.stdout.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(_summary_text(summary, handle.run_id, args.annotate))
    if summary["failed"] and not args.allow_failures:
        return EXIT_SOME_FAILED
    return EXIT_OK
