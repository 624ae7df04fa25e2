"""rayorch run video: the video job, videos in a directory to annotated scene clips.

    rayorch run video --input DIR --output DIR [--annotate stats|ocr|vllm] [--model M]
                      [--max-clip-s S] [--min-clip-s S] [--threshold T]
                      [--keyframes first,middle,last] [--write-clips]
                      [--store URL] [--overwrite | --resume] [--allow-failures]

Writes OUTPUT/videos.jsonl (one line per video: status, clip count, cause) and
OUTPUT/clips.jsonl (one line per clip, videos in input order, clips in time order);
--write-clips also copies each clip to OUTPUT/clips/ (stream copy, from the keyframe
at or before its start).

Annotation engines (--annotate):
  stats  the default: motion, brightness and sharpness flags on the CPU, no model.
  ocr    on-screen text in the keyframes with RapidOCR (CPU): for filtering videos
         full of text.
  vllm   a captioning vision-language model served by vLLM (--model NAME): on a GPU,
         or slower on the CPU with vLLM's CPU build (pip install 'rayorch[model]').

Output directory, exit code and Ray are as for every job: a non-empty --output from
an earlier run is refused unless --overwrite (replace it) or --resume (keep its
finished videos, run the rest); exit 0 when every video succeeded, 1 when some failed
(0 with --allow-failures), 2 for usage errors.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from rayorch.pipelines.job.cli import (
    add_job_parser,
    given_options,
    input_spec,
    native_limits,
    replicas_type,
    require_positive,
    run_job,
)
from rayorch.pipelines.job.layouts import VIDEO_JOB
from rayorch.pipelines.job.output import UsageError


def add_video_parser(jobs: Any) -> None:
    """Register ``rayorch run video``: the options every job takes, then its own."""
    from rayorch.pipelines.video_annotate import ANNOTATORS

    group = add_job_parser(
        jobs, VIDEO_JOB, help="videos -> scene clips -> keyframes, signals, annotations",
        description=__doc__, input_help="a video file or a directory of videos",
        func=cmd_run_video)
    group.add_argument("--annotate", default="stats", choices=sorted(ANNOTATORS),
                       help="clip annotation engine (default: stats; see above)")
    group.add_argument("--model", default=None, help="model name for --annotate vllm")
    group.add_argument("--max-clip-s", type=float, default=10.0,
                       help="longest clip in seconds; longer scenes are split evenly "
                       "(default 10)")
    group.add_argument("--min-clip-s", type=float, default=0.5,
                       help="shortest scene in seconds; shorter ones merge with a neighbour "
                       "(default 0.5)")
    group.add_argument("--threshold", type=float, default=27.0,
                       help="content-detector cut threshold (PySceneDetect's scale; "
                       "default 27)")
    group.add_argument("--keyframes", default="first,middle,last",
                       help="keyframe positions per clip: first, middle, last or fractions "
                       "(default first,middle,last)")
    group.add_argument("--write-clips", action="store_true",
                       help="also copy each clip to OUTPUT/clips/ (stream copy)")
    group.add_argument("--replicas", type=replicas_type, default=None,
                       help="annotation actors: N, a range MIN-MAX or auto (sized by backlog "
                       "and free resources). Default auto; --annotate vllm: auto with GPUs, "
                       "1 on vLLM's CPU build")
    group.add_argument("--decode-replicas", type=replicas_type, default=None,
                       help="clip decoding actors: N, MIN-MAX or auto (default auto)")
    group.add_argument("--batch-size", type=int, default=8, help="clips per batch (default 8)")


def output_url(output: str) -> str:
    """``--output`` as the clips' targets name it: an absolute local directory or a URL."""
    from rayorch.storage import StorageError, open_storage

    try:
        storage = open_storage(output)
    except StorageError as exc:
        raise UsageError(f"--output {output}: {exc}") from None
    local = storage.local_path("")
    return str(local.resolve()) if local is not None else storage.url.rstrip("/")


def video_pipeline(args: argparse.Namespace) -> Any:
    """The video pipeline the options describe (pools that size themselves unless a size
    is given: VideoPipeline's defaults)."""
    from rayorch.pipelines.video import VideoPipeline

    require_positive(args, "max_clip_s", "batch_size")  # (replicas_type checked the replicas)
    clips_dir = f"{output_url(args.output)}/{VIDEO_JOB.folder}"
    options: dict[str, Any] = {
        "max_clip_s": args.max_clip_s, "min_clip_s": args.min_clip_s,
        "threshold": args.threshold, "keyframes": args.keyframes,
        "batch_size": args.batch_size,
        "clips_dir": clips_dir if args.write_clips else None,
        **given_options(args, "replicas", "decode_replicas"),  # else the default: auto
        **native_limits(args),
    }
    if args.model is not None:
        options["engine_options"] = {"model": args.model}
    return VideoPipeline(args.annotate, **options)


def cmd_run_video(args: argparse.Namespace) -> int:
    """Run the video pipeline over ``--input``; write clips and videos to ``--output``."""
    from rayorch.pipelines.job.video_outputs import VIDEO_WRITER, outputs_text
    from rayorch.pipelines.video import VIDEO_SUFFIXES

    spec = input_spec(args, tuple(sorted(VIDEO_SUFFIXES)), "video")
    pipeline = video_pipeline(args)
    if args.annotate == "vllm" and not (args.address or os.environ.get("RAY_ADDRESS")):
        from rayorch.pipelines.video_annotate import require_vllm_runtime

        require_vllm_runtime()  # a local run: say so now, not from inside an actor
    same = {"annotate": args.annotate, "model": args.model, "max_clip_s": args.max_clip_s,
            "min_clip_s": args.min_clip_s, "threshold": args.threshold,
            "keyframes": args.keyframes, "write_clips": args.write_clips}
    return run_job(args, job=VIDEO_JOB, spec=spec, pipeline=pipeline, options=same,
                   writer=VIDEO_WRITER, engine=("--annotate", args.annotate),
                   outputs=outputs_text)
