"""rayorch run pdf: the main job, the PDFs in a directory to Markdown documents.

    rayorch run pdf --input DIR --output DIR [--ocr auto|text|rapidocr|vllm]
                    [--store URL] [--overwrite | --resume] [--allow-failures]

OCR engines (--ocr):
  auto      the default: each page's text layer where it is usable; pages without
            one (scans) or with a garbage one are OCR'd with rapidocr on the CPU.
            Right for almost every corpus: born-digital pages stay exact and fast.
  text      the text layer only, never OCR: fastest; scanned pages come out empty
            (a warning names them).
  rapidocr  OCR every page on the CPU (PP-OCRv4): for PDFs whose text layer cannot
            be trusted at all; about 3 s per page per core.
  vllm      a vision-language model on a GPU transcribes every page (--model NAME):
            best for complex layouts, tables and formulas; needs vLLM and a GPU.

Each page's engine is recorded in documents.jsonl (page_engines) and in the .md
(<!-- page N engine=E -->). Exit code: 0 when every document succeeded, 1 when some
failed (0 with --allow-failures), 2 for usage errors.

Ray: --address or $RAY_ADDRESS attaches to that cluster; otherwise a private local
Ray is started on 127.0.0.1 (dashboard off), even when another cluster runs here.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from rayorch.pipelines.job_cli import (
    OutputDir,
    ProgressLines,
    StartupClock,
    UsageError,
    add_job_options,
    format_seconds,
    iter_with_ids,
    plural,
    start_ray_for,
)

PIPELINES = ("pdf", "video")


def add_run_parser(sub: Any) -> None:
    """Register ``rayorch run``."""
    from rayorch.pipelines.pdf import OCR_MODES

    parser = sub.add_parser(
        "run",
        help="run a shipped pipeline (pdf: PDFs -> per-page OCR -> Markdown; "
        "video: videos -> scene clips -> annotations)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("pipeline", choices=PIPELINES, help="which pipeline to run")
    parser.add_argument("--input", required=True, help="a PDF file or a directory of PDFs")
    parser.add_argument("--output", required=True,
                        help="directory for the .md files and documents.jsonl")
    parser.add_argument("--store", default="memory://",
                        help="lineage store URL (default: memory://)")
    parser.add_argument("--ocr", default="auto", choices=OCR_MODES,
                        help="OCR engine (default: auto; see above)")
    parser.add_argument("--model", default=None, help="model name for --ocr vllm")
    parser.add_argument("--tables", action="store_true",
                        help="also look for ruled tables (PyMuPDF find_tables; slow)")
    parser.add_argument("--replicas", type=int, default=1, help="OCR actors (default 1)")
    parser.add_argument("--render-replicas", type=int, default=None,
                        help="render actors (default: one per CPU core, at most 8)")
    parser.add_argument("--batch-size", type=int, default=16, help="pages per OCR batch")
    parser.add_argument("--dpi", type=int, default=None, help="render resolution for OCR")
    add_job_options(parser)
    # The video job: its own options and command (rayorch/pipelines/video_command.py).
    from rayorch.pipelines.video_command import add_video_arguments

    add_video_arguments(parser)
    parser.set_defaults(func=cmd_run)


def _pipeline(args: argparse.Namespace) -> Any:
    import os

    from rayorch.pipelines.pdf import PdfPipeline

    for name in ("replicas", "batch_size", "render_replicas", "dpi"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, not {value}")
    render = args.render_replicas or max(1, min(8, os.cpu_count() or 1))
    options: dict[str, Any] = {"replicas": args.replicas, "batch_size": args.batch_size,
                               "render_replicas": render, "tables": args.tables}
    if args.dpi is not None:
        options["dpi"] = args.dpi
    if args.model is not None:
        options["engine_options"] = {"model": args.model}
    return PdfPipeline(args.ocr, **options)


def cmd_run(args: argparse.Namespace) -> int:
    """Run the PDF (or video) pipeline over ``--input``; write the results to ``--output``."""
    if args.pipeline == "video":
        from rayorch.pipelines.video_command import cmd_run_video

        return cmd_run_video(args)
    from rayorch.pipelines.pdf import find_pdfs, summary_dict, write_outputs

    sources = find_pdfs(args.input)
    if not sources:
        raise UsageError(f"no PDF files under {args.input}")
    pipeline = _pipeline(args)
    plan = pipeline.compile()
    out = OutputDir.prepare(args.output, job="pdf", sources=sources,
                            options={"ocr": args.ocr, "tables": args.tables},
                            overwrite=args.overwrite, resume=args.resume)
    ids = out.remaining(sources)
    tty = sys.stdout.isatty()
    clock = StartupClock(quiet=args.no_progress and not tty)
    from rayorch.pipelines.job_cli import JobSummary

    summary = JobSummary(job="pdf", total=len(sources), kept=len(out.kept))
    complete = False
    run_id = None
    try:
        if ids:
            clock.starting_ray()
            start_ray_for(plan, args.address)
            clock.starting_pools(plan)
            progress = False if args.no_progress or not tty else None
            handle = pipeline.run([sources[i] for i in ids], store=args.store, ordered=True,
                                  progress=progress, address=args.address)
            run_id = handle.run_id
            out.note_run(run_id)
            summary.run_started = clock.running()
            lines = ProgressLines(summary, enabled=not tty and not args.no_progress,
                                  every_s=args.progress_every)
            with lines:
                write_outputs(iter_with_ids(handle, ids), out, sources=sources,
                              summary=summary)
        else:
            summary.run_started = clock.running()
            out.close()
        complete = True
    finally:
        clock.done()
        out.finish(complete)
    result = {**summary_dict(summary, out), **clock.times(), "run_id": run_id,
              "engine": args.ocr}
    run_s = result["run_s"]
    result["pages_per_s"] = round(summary.pages / run_s, 2) if run_s > 0 else None
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(_summary_text(result, summary, out))
    return summary.exit_code(allow_failures=args.allow_failures)


def _summary_text(result: dict[str, Any], summary: Any, out: OutputDir) -> str:
    done = result["documents"]
    if result["run_id"] is None:
        return (f"nothing to run: all {plural(done, 'document')} were done by the earlier "
                f"run\noutput: {out.path}/documents.jsonl and {plural(done, '.md file')}")
    head = (f"run {result['run_id']} done: {plural(done, 'document')} "
            f"({result['succeeded']} ok, {result['failed']} failed")
    head += f", {result['kept']} kept from the earlier run)" if result["kept"] else ")"
    engines = ", ".join(f"{n} {e}" for e, n in result["page_engines"].items())
    lines = [
        head,
        f"{plural(result['pages'], 'page')} in {format_seconds(result['run_s'])} = "
        f"{result['pages_per_s']} pages/s (--ocr {result['engine']}"
        + (f"; pages by engine: {engines})" if engines else ")"),
        f"start-up {format_seconds(result['startup_s'])} (Ray "
        f"{format_seconds(result['ray_start_s'])}, pools "
        f"{format_seconds(result['pools_start_s'])}); wall {format_seconds(result['wall_s'])}",
    ]
    if summary.failures:
        lines.append(f"failed ({plural(summary.failed, 'document')}):")
        lines.extend(summary.failure_lines())
    else:
        lines.append("failures: none")
    if summary.warnings:
        lines.append(f"warnings ({len(summary.warnings)}):")
        lines.extend(f"  {w}" for w in summary.warnings[:10])
        if len(summary.warnings) > 10:
            lines.append(f"  ... and {len(summary.warnings) - 10} more")
    files = len(out.written) + result["kept"]
    what = f"documents.jsonl and {plural(files, '.md file')}" if files else (
        "documents.jsonl (no .md written)")
    lines.append(f"output: {out.path}/{what}")
    return "\n".join(lines)
