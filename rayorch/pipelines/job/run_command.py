"""rayorch run pdf: the main job, the PDFs in a directory to Markdown documents.

    rayorch run pdf --input DIR --output DIR [--ocr auto|text|rapidocr|vllm|layout]
                    [--store URL] [--overwrite | --resume] [--allow-failures]
                    [--reuse RUN|latest [--no-reuse CALL]]

--reuse RUN (a run of the same --store, or 'latest') takes every Grain whose Call (code,
arguments, result-affecting options) and inputs (for a PDF: its bytes) are unchanged from
that run instead of running it: new PDFs are rendered and OCR'd, old ones are not; a changed
assemble option (--no-page-markers) re-assembles without rendering or OCR.

OCR engines (--ocr):
  auto      the default: each page's text layer where it is usable; pages without
            one (scans) or with a garbage one are OCR'd with rapidocr on the CPU.
            Right for almost every corpus: born-digital pages stay exact and fast.
  text      the text layer only, never OCR: fastest; scanned pages come out empty
            (a warning names them).
  rapidocr  OCR every page on the CPU (PP-OCRv4): for PDFs whose text layer cannot
            be trusted at all; about 3 s per page per core.
  vllm      a vision-language model served by vLLM transcribes every page (--model NAME,
            a hub id or a local directory): best for complex layouts, tables and
            formulas; on a GPU (pip install 'rayorch[gpu]'), or slower on the CPU with
            vLLM's CPU build (pip install 'rayorch[model]').
  layout    every page image is cut into layout regions (CDLA model), each read by
            its kind: text from the text layer inside the box or OCR of the crop,
            tables by their structure (SLANet) as pipe tables or HTML, figures as
            image files under figures/, titles as headings; headers, footers and page
            numbers dropped. Scanned pages keep their structure. Beside each .md a
            NNNNN-<stem>.content_list.json lists its blocks (MinerU's shape). CPU
            models from wheels (pip install 'rayorch[layout]').

Each page's engine is recorded in documents.jsonl (page_engines) and in the .md
(<!-- page N engine=E -->). Exit code: 0 when every document succeeded, 1 when some
failed (0 with --allow-failures), 2 for usage errors.

Ray: --address or $RAY_ADDRESS attaches to that cluster; otherwise a private local
Ray is started on 127.0.0.1 (dashboard off), even when another cluster runs here.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from rayorch.pipelines.job.cli import add_job_parser, replicas_type, require_positive, run_job
from rayorch.pipelines.job.layouts import PDF_JOB
from rayorch.pipelines.job.output import UsageError


def add_run_parser(sub: Any) -> None:
    """Register ``rayorch run`` and its jobs, ``rayorch run pdf`` and ``rayorch run video``."""
    from rayorch.pipelines.job.video_command import add_video_parser

    parser = sub.add_parser(
        "run",
        help="run a shipped job (pdf: PDFs -> per-page OCR -> Markdown; "
        "video: videos -> scene clips -> annotations)",
        description="Run a shipped job. Each job has its own options: "
        "rayorch run pdf --help, rayorch run video --help.",
    )
    jobs = parser.add_subparsers(dest="job", required=True, metavar="JOB")
    add_pdf_parser(jobs)
    add_video_parser(jobs)


def add_pdf_parser(jobs: Any) -> None:
    """Register ``rayorch run pdf``: the options every job takes, then its own."""
    from rayorch.pipelines.pdf import OCR_MODES

    group = add_job_parser(
        jobs, PDF_JOB, help="PDFs -> per-page text (OCR where needed) -> Markdown",
        description=__doc__, input_help="a PDF file or a directory of PDFs", func=cmd_run_pdf)
    group.add_argument("--ocr", default="auto", choices=OCR_MODES,
                       help="OCR engine (default: auto; see above)")
    group.add_argument("--model", default=None, help="model name for --ocr vllm")
    group.add_argument("--tables", action="store_true",
                       help="also turn ruled tables into pipe tables")
    group.add_argument("--replicas", type=replicas_type, default=1,
                       help="OCR actors: N, a range MIN-MAX or auto (sized by backlog; "
                       "default 1)")
    group.add_argument("--render-replicas", type=replicas_type, default=None,
                       help="render actors: N, MIN-MAX or auto (default: one per CPU core, "
                       "at most 8)")
    group.add_argument("--batch-size", type=int, default=16, help="pages per OCR batch")
    group.add_argument("--dpi", type=int, default=None, help="render resolution for OCR")
    group.add_argument("--no-page-markers", action="store_true",
                       help="leave the <!-- page N engine=E --> markers out of the Markdown")
    group.add_argument("--layout-batch-size", type=int, default=4,
                       help="pages per layout batch (--ocr layout; --batch-size is then "
                       "regions per recognition batch)")
    group.add_argument("--max-fallback-share", type=float, default=1.0, metavar="SHARE",
                       help="--ocr layout: fail a document when more than this share of "
                       "its blocks fell back (text layer, OCR of a crop or of the page); "
                       "default 1.0 = never")


def _pipeline(args: argparse.Namespace) -> Any:
    from rayorch.pipelines.pdf import PdfPipeline

    require_positive(args, "batch_size", "dpi", "layout_batch_size")
    if not 0.0 <= args.max_fallback_share <= 1.0:
        raise UsageError(f"--max-fallback-share is a share from 0 to 1, not "
                         f"{args.max_fallback_share}")
    render = args.render_replicas or max(1, min(8, os.cpu_count() or 1))
    options: dict[str, Any] = {"replicas": args.replicas, "batch_size": args.batch_size,
                               "render_replicas": render, "tables": args.tables,
                               "page_markers": not args.no_page_markers,
                               "layout_batch_size": args.layout_batch_size,
                               "max_fallback_share": args.max_fallback_share}
    if args.dpi is not None:
        options["dpi"] = args.dpi
    if args.model is not None:
        options["engine_options"] = {"model": args.model}
    return PdfPipeline(args.ocr, **options)


def cmd_run_pdf(args: argparse.Namespace) -> int:
    """Run the PDF pipeline over ``--input``; write the documents to ``--output``."""
    from rayorch.pipelines.job.pdf_outputs import PDF_WRITER, outputs_text
    from rayorch.pipelines.pdf import list_pdfs

    same: dict[str, Any] = {"ocr": args.ocr, "tables": args.tables,
                            "page_markers": not args.no_page_markers}
    if args.ocr == "layout":
        same["max_fallback_share"] = args.max_fallback_share
    sizes = dict(list_pdfs(args.input))
    sources = sorted(sizes)
    if not sources:
        raise UsageError(f"no PDF files under {args.input}")
    return run_job(args, job=PDF_JOB, sources=sources, pipeline=_pipeline(args),
                   options=same, writer=PDF_WRITER,
                   engine=("--ocr", args.ocr), outputs=outputs_text, big_first=True,
                   sizes=sizes)
