"""The PDF pipeline: PDF -> pages -> OCR where needed -> one Markdown document per PDF.

The public face of the PDF job. Three batched modules and the pipeline that wires them::

    pages, to_ocr, meta = render(pdfs)   # RenderPages: per PDF, every page + metadata
    page, wanted = F.expand_aligned(pages, to_ocr)   # one child Entity per page
    texts = ocr(F.filter(page, wanted))  # OcrPage: one Grain per page to OCR, batched
    docs = assemble(F.reduce(texts), meta)   # AssembleDocument: Markdown in page order

What runs inside the actors lives in :mod:`rayorch.pipelines.document` (render, OCR,
assemble); what the ``rayorch run pdf`` command writes lives in
:mod:`rayorch.pipelines.job`. The renderer turns every page with a usable text layer into
Markdown itself, so such pages never travel to an OCR actor: every page is a child in the
lineage (``rayorch show RUN N`` lists them), and a page done from its text layer is
Dropped before the OCR Call by ``F.filter`` (decided by the kernel, no dispatch). Only
pages that need OCR (all of them for ``rapidocr``/``vllm``; those without a usable text
layer for ``auto``) carry a PNG and are OCR Grains.

>>> from rayorch.pipelines.pdf import RenderPdf, OcrPage, AssembleDocument
>>> [(pages, meta)] = RenderPdf(ocr_fallback=True)(["examples/pdfs/qtree-qarrows.pdf"])
>>> pages                     # a born-digital page: nothing to OCR
[]
>>> [doc] = AssembleDocument()([OcrPage("rapidocr", lazy=True)(pages)], [meta])
>>> doc["markdown"].count("<!-- page "), doc["page_engines"]
(1, ['text'])
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import rayorch as ro
from rayorch import F
from rayorch.core.program import Replicas
from rayorch.pipelines.document.assemble import (
    AssembleDocument,
    assemble_markdown,
    document_pages,
)
from rayorch.pipelines.document.ocr import OcrEngineError, engine_needs_image
from rayorch.pipelines.document.page_ocr import AsyncOcrPage, OcrPage
from rayorch.pipelines.document.rasterize import RasterizePages
from rayorch.pipelines.document.region_assemble import (
    AssemblePage,
    AssembleRegionDocument,
    check_fallback_share,
)
from rayorch.pipelines.document.region_render import LAYOUT_DPI, RenderLayoutPages
from rayorch.pipelines.document.regions import (
    KeepRegions,
    LayoutOrFallback,
    RecogniseOrFallback,
)
from rayorch.pipelines.document.render import DEFAULT_DPI, RenderPages, RenderPdf
from rayorch.pipelines.job.pdf_outputs import PDF_WRITER, document_warnings, summary_dict
from rayorch.pipelines.limits import NATIVE_MAX_RSS, max_rss_bytes
from rayorch.pipelines.quality import add_stages, keep_documents, keep_sources
from rayorch.pipelines.quality.dedup import DEFAULT_THRESHOLD
from rayorch.pipelines.sources import Listed, failure_kind, find_files, list_inputs
from rayorch.pipelines.vllm_runtime import model_replicas, vllm_num_cpus, vllm_num_gpus

OCR_MODES = ("auto", "text", "rapidocr", "vllm", "layout", "mineru")
"""``--ocr`` choices: ``auto`` (text layer, OCR where it is missing or garbage), ``text``
(text layer only), ``rapidocr`` (CPU OCR of every page), ``vllm`` (a VLM served by vLLM: on a
GPU, or on the CPU with vLLM's CPU build, slower), ``layout`` (the region grain: layout
regions of every page, each recognised by its kind; CPU models from wheels, extra
``layout``), ``mineru`` (the region grain with MinerU2.5's two steps, layout and recognition,
on one vLLM engine: ``engine_options={"model": DIR}``)."""
REGION_ENGINES = frozenset({"layout", "mineru"})
"""The ``--ocr`` choices that run the region grain (document -> page -> region)."""
MODEL_ENGINES = frozenset({"vllm", "mineru"})
"""The ``--ocr`` choices whose actors each hold a model engine (vLLM): their pools default
to :func:`~rayorch.pipelines.vllm_runtime.model_replicas`, the others to ``"auto"``."""
FALLBACK_ENGINE = "rapidocr"
"""The engine ``auto`` uses for pages without a usable text layer."""
DEFAULT_MINERU_MODEL = "opendatalab/MinerU2.5-2509-1.2B"
MINERU_INFLIGHT = 4
"""Batches a ``mineru`` actor runs at once (``ocr_inflight``): layout and recognition batches
of many pages share its engine."""

def ocr_module_cpus(engine: str) -> float:
    """CPUs an OCR actor declares: rapidocr works all the time, ``auto`` now and then, a
    vLLM engine all the time on vLLM's CPU build."""
    if engine == "vllm":
        return vllm_num_cpus(0.25)
    return {"rapidocr": 1.0, "auto": 0.5}.get(engine, 0.25)


class PdfPipeline(ro.Pipeline):
    """PDF -> pages -> OCR where needed -> Markdown; engine, replicas and batch sizes as options.

    ``engine`` (``--ocr``) is one of :data:`OCR_MODES`: ``"auto"`` (the default: the
    text layer where usable, rapidocr for pages without one or with a garbage one),
    ``"text"`` (text layer only, no OCR), ``"rapidocr"`` (CPU OCR of every page) or
    ``"vllm"`` (a VLM served by vLLM, ``engine_options={"model": ...}``: one GPU per replica,
    none with vLLM's CPU build). Each result is the
    ``AssembleDocument`` dict of one PDF, or a failed result with its cause.
    ``ocr_inflight`` > 1 lets each OCR actor run that many batches at once
    (:class:`AsyncOcrPage`: a vLLM engine then batches the pages of all of them).

    ``"layout"`` runs the region grain (:meth:`regions`): ``batch_size`` and ``replicas``
    are then the recognition stage's (regions per batch), ``layout_batch_size`` and
    ``layout_replicas`` the layout stage's (pages per batch), ``dpi`` defaults to 144, and
    ``max_fallback_share`` fails a document past that share of fallback blocks. Its result
    is the ``AssembleRegionDocument`` dict (with ``content_list`` and ``figures``).
    ``"mineru"`` runs the same grain with one module for both steps
    (:class:`~rayorch.pipelines.document.mineru.MineruEngine`: ``engine_options`` are its
    options, ``model`` first): ``replicas`` actors, each one engine, ``batch_size`` pages or
    regions per batch, ``ocr_inflight`` (default 4) batches at once.

    Every stage's pool sizes itself by default (``replicas="auto"``: from one actor up to
    what its backlog needs and the cluster has free; docs/topics/POOL-SIZING.md, "Pools that size
    themselves"): render, OCR (``auto``, ``rapidocr``, ``text``), layout and recognition.
    A model engine (``vllm``, ``mineru``) is ``"auto"`` with GPUs (one engine per GPU) and
    one actor on vLLM's CPU build (:func:`~rayorch.pipelines.vllm_runtime.model_replicas`).
    A number (``replicas=2``) is exactly that many actors; ``(min, max)`` a range.

    Data-quality stages (:func:`rayorch.pipelines.quality.stage_modules`): ``dedup``
    (``"exact"``: byte copies dropped before rendering, text copies after; ``"near"``:
    also MinHash near-copies at ``near_threshold``), ``languages`` (ISO codes to keep),
    ``quality="default"`` (Gopher/C4/FineWeb rules); ``claims`` is the store URL of the
    dedup index and ``dedup_scope`` its name (give it to share the index across runs).

    ``spread_pages`` renders page images in a pool of their own
    (:class:`~rayorch.pipelines.document.rasterize.RasterizePages`, after the pages expand):
    the pages of a document of thousands of pages spread over that pool, and no render
    actor holds a document's images. It costs one more Grain per page that is imaged.

    >>> plan = PdfPipeline().compile()
    """

    def __init__(
        self,
        engine: str = "auto",
        *,
        replicas: Replicas | None = None,
        batch_size: int = 16,
        dpi: int | None = None,
        render_replicas: Replicas = "auto",
        render_batch_size: int = 2,
        tables: bool = False,
        engine_options: dict[str, Any] | None = None,
        ocr_num_cpus: float | None = None,
        ocr_num_gpus: float | None = None,
        ocr_inflight: int | None = None,
        page_markers: bool = True,
        layout_batch_size: int = 4,
        layout_replicas: Replicas = "auto",
        max_fallback_share: float = 1.0,
        actor_max_rss: int | str | None = NATIVE_MAX_RSS,
        dedup: str | None = None,
        languages: Sequence[str] = (),
        quality: str = "off",
        claims: str = "memory://",
        dedup_scope: str | None = None,
        near_threshold: float = DEFAULT_THRESHOLD,
        dedup_against: Sequence[str] = (),
        spread_pages: bool = False,
    ) -> None:
        super().__init__()
        rss = max_rss_bytes(actor_max_rss)  # native-memory stages (pipelines/limits.py)
        # The data-quality stages (rayorch.pipelines.quality): byte copies dropped before
        # rendering, the documents' text judged after assembly.
        add_stages(self, dedup=dedup, languages=languages, quality=quality, claims=claims,
                   dedup_scope=dedup_scope, near_threshold=near_threshold,
                   dedup_against=dedup_against, of_files=True)
        if engine not in OCR_MODES:
            valid = ", ".join(repr(m) for m in OCR_MODES)
            raise OcrEngineError(f"unknown OCR engine {engine!r}: choose one of {valid}")
        self.engine = engine
        if replicas is None and engine not in MODEL_ENGINES:
            replicas = "auto"  # a model engine's default depends on its GPUs (below)
        if engine in REGION_ENGINES:
            self._region_modules(
                dpi=dpi or LAYOUT_DPI, render_replicas=render_replicas,
                render_batch_size=render_batch_size, layout_batch_size=layout_batch_size,
                layout_replicas=layout_replicas, region_batch_size=batch_size,
                region_replicas=replicas, max_fallback_share=max_fallback_share,
                page_markers=page_markers, engine_options=engine_options or {},
                inflight=ocr_inflight or MINERU_INFLIGHT, max_rss=rss, spread=spread_pages)
            self._rasterizer(spread_pages, dpi or LAYOUT_DPI, render_replicas, rss,
                             grayscale=False)
            return
        ocr_inflight = ocr_inflight or 1
        ocr_gpus = ocr_num_gpus if ocr_num_gpus is not None else (
            vllm_num_gpus() if engine == "vllm" else 0.0)
        auto = engine == "auto"
        ocr_options: dict[str, Any] = {"lazy": True} if auto else {}
        ocr_options.update(engine_options or {})
        ocr_cpus = ocr_num_cpus if ocr_num_cpus is not None else ocr_module_cpus(engine)
        ocr_replicas = model_replicas(ocr_gpus) if replicas is None else replicas
        if (FALLBACK_ENGINE if auto else engine) == "rapidocr" \
                and not isinstance(ocr_replicas, int):
            # A pool that sizes itself fills the CPUs its actors declare: each actor's ONNX
            # Runtime uses as many threads (its default, every core of the node, would
            # oversubscribe the node as the pool grows).
            ocr_options.setdefault("intra_op_num_threads", max(1, math.ceil(ocr_cpus)))
            ocr_options.setdefault("inter_op_num_threads", 1)
        self.render = ro.RayModule(
            RenderPages,
            needs_image=not auto and engine_needs_image(engine),
            ocr_fallback=auto,
            tables=tables,
            dpi=dpi or DEFAULT_DPI,
            num_outputs=3,
            batch_size=render_batch_size,
            replicas=render_replicas,
            num_cpus=1.0,
            max_rss=rss,
            **_deferred(spread_pages and engine != "text"),
        )
        if engine != "text":  # the text engine reads no image
            self._rasterizer(spread_pages, dpi or DEFAULT_DPI, render_replicas, rss)
        # The engine's options are constructor arguments (.pre_init), never execution
        # options: an engine's own timeout_s must not become the batch timeout.
        self.ocr = ro.RayModule(
            OcrPage if ocr_inflight == 1 else AsyncOcrPage,
            max_inflight=ocr_inflight,
            batch_size=batch_size,
            replicas=ocr_replicas, num_cpus=ocr_cpus, num_gpus=ocr_gpus,
            max_rss=None if engine in MODEL_ENGINES else rss,
        ).pre_init(FALLBACK_ENGINE if auto else engine, **ocr_options)
        self.assemble = ro.RayModule(AssembleDocument, page_markers=page_markers,
                                     batch_size=8, num_cpus=0.25)

    def _rasterizer(self, spread: bool, dpi: int, replicas: Replicas, max_rss: int | None,
                    *, grayscale: bool = True) -> None:
        """``self.rasterize`` when ``spread``: the pool that renders the page images."""
        if spread:
            self.rasterize = ro.RayModule(
                RasterizePages, dpi=dpi, grayscale=grayscale, batch_size=4,
                replicas=replicas, num_cpus=1.0, max_rss=max_rss)

    def _images(self, pages: Any) -> Any:
        """``pages`` with their images: rendered by the rasterizers (``spread_pages``), or
        already by the render actor."""
        rasterize = getattr(self, "rasterize", None)
        return pages if rasterize is None else rasterize(pages)

    def _region_modules(self, *, dpi: int, render_replicas: Replicas,
                        render_batch_size: int, layout_batch_size: int,
                        layout_replicas: Replicas, region_batch_size: int,
                        region_replicas: Replicas | None, max_fallback_share: float,
                        page_markers: bool, engine_options: dict[str, Any],
                        inflight: int, max_rss: int | None, spread: bool) -> None:
        """The region grain's modules: render, the model modules, keep, assemble_page,
        assemble. For ``layout`` ``engine_options`` may hold ``layout`` and ``recognise``
        (each a dict of its model's constructor options); for ``mineru`` they are
        :class:`MineruEngine`'s, one module (``mineru``) serving both steps."""
        check_fallback_share(max_fallback_share)  # here, before any actor starts
        # Declared CPUs sum to under 2, so the default runs on a two-core machine through
        # the API too (the CLI sizes its Ray to the plan); the models' ONNX threads use
        # what is free.
        self.render = ro.RayModule(
            RenderLayoutPages, dpi=dpi, num_outputs=3, **_deferred(spread),
            batch_size=render_batch_size, replicas=render_replicas, num_cpus=0.5,
            max_rss=max_rss)
        if self.engine == "mineru":
            self._mineru_module(engine_options, region_replicas, region_batch_size, inflight)
        else:
            from rayorch.pipelines.document.layout import DetectLayout
            from rayorch.pipelines.document.recognise import RecogniseRegion

            self.layout = ro.RayModule(
                LayoutOrFallback, batch_size=layout_batch_size, replicas=layout_replicas,
                num_cpus=0.5, max_rss=max_rss,
            ).pre_init(DetectLayout, **engine_options.get("layout", {}))
            self.recognise = ro.RayModule(
                RecogniseOrFallback, batch_size=region_batch_size,
                replicas="auto" if region_replicas is None else region_replicas,
                num_cpus=0.5, max_rss=max_rss,
            ).pre_init(RecogniseRegion, **engine_options.get("recognise", {}))
        self.keep = ro.RayModule(KeepRegions, num_outputs=2, batch_size=64, num_cpus=0.1)
        self.assemble_page = ro.RayModule(AssemblePage, batch_size=16, num_cpus=0.1)
        engine: dict[str, Any] = {"engine": "mineru"} if self.engine == "mineru" else {}
        self.assemble = ro.RayModule(AssembleRegionDocument, batch_size=4, num_cpus=0.25,
                                     max_fallback_share=max_fallback_share,
                                     page_markers=page_markers, **engine)

    def _mineru_module(self, options: dict[str, Any], replicas: Replicas | None,
                       batch_size: int, inflight: int) -> None:
        """``self.mineru``: one :class:`MineruEngine` pool for both steps (one engine per
        actor); its options are checked here, before any actor starts."""
        from rayorch.pipelines.document.mineru import MineruEngine, check_sampling
        from rayorch.pipelines.document.mineru_blocks import prompts_for

        options = {"model": DEFAULT_MINERU_MODEL, **options}
        check_sampling(options.get("max_tokens"), options.get("temperature", 0.0),
                       options.get("retries", 1))
        prompts_for(options.get("prompts"))  # and mineru-vl-utils is there
        gpus = vllm_num_gpus()
        self.mineru = ro.RayModule(
            MineruEngine, batch_size=batch_size, max_inflight=inflight,
            replicas=model_replicas(gpus) if replicas is None else replicas,
            num_cpus=vllm_num_cpus(0.25), num_gpus=gpus,
        ).pre_init(**options)

    def forward(self, pdfs: Any) -> Any:
        return keep_documents(self, self.documents(keep_sources(self, pdfs)))

    def documents(self, pdfs: Any) -> Any:
        """PDFs -> their documents, by the engine's grain."""
        if self.engine == "mineru":  # one module, two Calls: one pool, one engine
            return self.regions(pdfs, functools.partial(self.mineru, step="layout"),
                                functools.partial(self.mineru, step="recognise"))
        if self.engine in REGION_ENGINES:
            return self.regions(pdfs, self.layout, self.recognise)
        pages, to_ocr, meta = self.render(pdfs)
        page, wanted = F.expand_aligned(pages, to_ocr)
        texts = self.ocr(self._images(F.filter(page, wanted)))
        return self.assemble(F.reduce(texts), meta)


    def regions(self, pdfs: Any, layout: Any, recognise: Any) -> Any:
        """The region grain, document -> page -> region, with ``layout`` (page items ->
        per page its region items) and ``recognise`` (region item -> block): one module may
        serve both (two Calls, one pool). Regions of many pages and documents batch
        together per stage; each page is reduced in reading order, each document from its
        pages. The running page furniture is Dropped before recognition."""
        pages, numbers, meta = self.render(pdfs)
        page, number = F.expand_aligned(pages, numbers)
        regions, wanted = self.keep(layout(self._images(page)))
        region, kept = F.expand_aligned(regions, wanted)
        blocks = recognise(F.filter(region, kept))
        done = self.assemble_page(F.reduce(blocks), number, F.broadcast(meta, like=number))
        return self.assemble(F.reduce(done), meta)


def _deferred(spread: bool) -> dict[str, Any]:
    """The render module's ``defer_images`` when pages spread (only then: a render Call's
    options are part of what ``--reuse`` compares)."""
    return {"defer_images": True} if spread else {}


def find_pdfs(source: str | Path) -> list[str]:
    """The PDF paths under a directory or an object store prefix (recursive, sorted), or
    the file itself."""
    return find_files(source, {".pdf"}, "PDF")


def list_pdfs(source: str | Path) -> list[Listed]:
    """:func:`find_pdfs` with each file's size and identity (from the listing: no request
    per file)."""
    return [item for page in list_inputs(source, {".pdf"}, "PDF") for item in page]


__all__ = [
    "DEFAULT_MINERU_MODEL", "OCR_MODES", "PDF_WRITER", "REGION_ENGINES", "AssembleDocument",
    "AsyncOcrPage", "OcrPage", "PdfPipeline",
    "RenderPages", "RenderPdf", "assemble_markdown", "document_pages", "document_warnings",
    "failure_kind", "find_pdfs", "list_pdfs", "summary_dict",
]
