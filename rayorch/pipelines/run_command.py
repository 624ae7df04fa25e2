"""``rayorch run pdf``: the main job — PDFs in a directory to Markdown documents.

    rayorch run pdf --input DIR --output DIR [--store URL] [--ocr ENGINE]
                    [--replicas N] [--batch-size B] [--no-progress]

Prints the run id (for ``rayorch audit``/``show``) and a summary: documents, pages,
failures by cause, pages/s.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

import orjson

from rayorch.core.errors import RayorchError

PIPELINES = ("pdf", "video")


def add_run_parser(sub: Any) -> None:
    """Register ``rayorch run``."""
    parser = sub.add_parser(
        "run",
        help="run a shipped pipeline (pdf: PDFs -> per-page OCR -> Markdown; "
        "video: videos -> scene clips -> annotations)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("pipeline", choices=PIPELINES, help="which pipeline to run")
    parser.add_argument("--input", required=True, help="a PDF file or a directory of PDFs")
    parser.add_argument(
        "--output", required=True, help="directory for .md files and documents.jsonl"
    )
    parser.add_argument("--store", default="memory://", help="lineage store URL (default: memory://)")
    parser.add_argument("--ocr", default="text", help="OCR engine: text | rapidocr | vllm")
    parser.add_argument("--model", default=None, help="model name for --ocr vllm")
    parser.add_argument("--replicas", type=int, default=1, help="OCR actors (default 1)")
    parser.add_argument("--batch-size", type=int, default=16, help="pages per OCR batch")
    parser.add_argument("--dpi", type=int, default=None, help="render resolution for image OCR")
    parser.add_argument("--address", default=None, help="Ray cluster address (default: local)")
    parser.add_argument("--no-progress", action="store_true", help="no live progress table")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    # The video job: its own options and command (rayorch/pipelines/video_command.py).
    from rayorch.pipelines.video_command import add_video_arguments

    add_video_arguments(parser)
    parser.set_defaults(func=cmd_run)


def _start_ray(plan: Any, address: str | None) -> None:
    """A local Ray sized for the pipeline's declared CPUs (never fewer than the machine's)."""
    from rayorch.runtime.session import ensure_ray

    need_cpus = sum(m.options.replicas * m.options.num_cpus for m in plan.modules)
    need_gpus = sum(m.options.replicas * m.options.num_gpus for m in plan.modules)
    ensure_ray(
        address,
        num_cpus=max(os.cpu_count() or 1, math.ceil(need_cpus)),
        num_gpus=math.ceil(need_gpus) if need_gpus else None,
        log_to_driver=False,
    )


def cmd_run(args: argparse.Namespace) -> int:
    """Run the PDF pipeline over ``--input`` and write the documents to ``--output``."""
    if args.pipeline == "video":
        from rayorch.pipelines.video_command import cmd_run_video

        return cmd_run_video(args)
    from rayorch.pipelines.pdf import PdfPipeline, find_pdfs, write_outputs

    sources = find_pdfs(args.input)
    if not sources:
        raise RayorchError(f"no PDF files under {args.input}")
    options: dict[str, Any] = {"replicas": args.replicas, "batch_size": args.batch_size}
    if args.dpi is not None:
        options["dpi"] = args.dpi
    if args.model is not None:
        options["engine_options"] = {"model": args.model}
    pipeline = PdfPipeline(args.ocr, **options)
    plan = pipeline.compile()
    _start_ray(plan, args.address)
    started = time.perf_counter()
    progress = None if not args.no_progress else False
    handle = pipeline.run(sources, store=args.store, ordered=True, progress=progress,
                          address=args.address)
    summary = write_outputs(handle, args.output, sources=sources)
    elapsed = time.perf_counter() - started
    summary["elapsed_s"] = round(elapsed, 3)
    summary["pages_per_s"] = round(summary["pages"] / elapsed, 2) if elapsed > 0 else None
    summary["run_id"] = handle.run_id
    summary["engine"] = args.ocr
    if args.json:
        sys.stdout.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        failures = ", ".join(f"{k}: {v}" for k, v in summary["failures"].items()) or "none"
        print(
            f"run {handle.run_id} done: {summary['documents']} documents "
            f"({summary['succeeded']} ok, {summary['failed']} failed), {summary['pages']} pages "
            f"in {elapsed:.1f} s = {summary['pages_per_s']} pages/s (engine {args.ocr})\n"
            f"failures: {failures}\n"
            f"output: {summary['out_dir']}/documents.jsonl and one .md per document"
        )
    return 0
