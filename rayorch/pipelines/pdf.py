"""The PDF pipeline: PDF -> pages -> OCR where needed -> one Markdown document per PDF.

Three batched modules and the pipeline that wires them::

    pages, to_ocr, meta = render(pdfs)   # RenderPages: per PDF, every page + metadata
    page, wanted = F.expand_aligned(pages, to_ocr)   # one child Entity per page
    texts = ocr(F.filter(page, wanted))  # OcrPage: one Grain per page to OCR, batched
    docs = assemble(F.reduce(texts), meta)   # AssembleDocument: Markdown in page order

The renderer turns every page with a usable text layer into Markdown itself
(:mod:`rayorch.pipelines.pdf_markdown`), so such pages never travel to an OCR actor:
every page is a child in the lineage (``rayorch show RUN N`` lists them), and a page
done from its text layer is Dropped before the OCR Call by ``F.filter`` (decided by
the kernel, no dispatch). Only pages that need OCR (all of them for ``rapidocr``/
``vllm``; those without a usable text layer for ``auto``) carry a PNG and are OCR Grains.

Bad input (missing, empty, non-PDF, encrypted, truncated, damaged, zero pages, absurd
page sizes) becomes ``ro.RecordFailure("<kind>: <detail>")`` for that document only.

>>> from rayorch.pipelines.pdf import RenderPdf, OcrPage, AssembleDocument
>>> [(pages, meta)] = RenderPdf(ocr_fallback=True)(["examples/pdfs/qtree-qarrows.pdf"])
>>> pages                     # a born-digital page: nothing to OCR
[]
>>> [doc] = AssembleDocument()([OcrPage("rapidocr", lazy=True)(pages)], [meta])
>>> doc["markdown"].count("<!-- page "), doc["page_engines"]
(1, ['text'])
"""

from __future__ import annotations

import gc
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

import rayorch as ro
from rayorch import F, RecordFailure
from rayorch.core.program import Replicas
from rayorch.pipelines.ocr import OcrEngineError, Page, engine_needs_image
from rayorch.pipelines.pdf_markdown import (
    DocumentWords,
    Line,
    font_scale,
    import_pymupdf,
    normalise_ligatures,
    page_lines,
    page_markdown,
    size_chars,
    text_layer_quality,
    textpage_lines,
)
from rayorch.pipelines.pdf_ocr import AsyncOcrPage, OcrPage, PageText
from rayorch.pipelines.pdf_structure import byline_lines, title_lines
from rayorch.pipelines.pdf_tables import Table, page_tables
from rayorch.pipelines.sources import (
    InputFile,
    check_file,
    failure_kind,
    find_files,
    list_inputs,
)
from rayorch.pipelines.sources import refuse as _refuse
from rayorch.pipelines.vllm_runtime import vllm_num_cpus, vllm_num_gpus

DEFAULT_DPI = 110
MAX_PAGE_SIDE_PT = 14_400.0
"""The PDF implementation limit for a page side (200 inches); larger pages are refused."""
MIN_PAGE_SIDE_PT = 3.0
"""The PDF minimum page side; smaller (or empty) pages are refused."""
DEFAULT_MAX_PAGE_PIXELS = 16_000_000
"""Pixel cap per rendered page: above it the page is rendered at a lower dpi."""

OCR_MODES = ("auto", "text", "rapidocr", "vllm")
"""``--ocr`` choices: ``auto`` (text layer, OCR where it is missing or garbage), ``text``
(text layer only), ``rapidocr`` (CPU OCR of every page), ``vllm`` (a VLM served by vLLM: on a
GPU, or on the CPU with vLLM's CPU build, slower)."""
FALLBACK_ENGINE = "rapidocr"
"""The engine ``auto`` uses for pages without a usable text layer."""
TEXT_FLAGS = 2 | 64
"""``TEXT_PRESERVE_WHITESPACE | TEXT_MEDIABOX_CLIP``: ligatures expanded by MuPDF,
unknown glyphs as U+FFFD (which is how a garbage layer is recognised), no images."""

DocumentMeta = dict[str, Any]
"""``{"path", "title", "page_count", "pages": [PageRecord]}``; a PageRecord is
``{"page", "engine", "layer", "markdown"}`` with ``engine`` ``"text"`` (done by the
renderer), ``"blank"`` (no ink at all) or ``None`` (sent to OCR)."""
RenderedDocument = tuple[list[Page], DocumentMeta]


_DAMAGE_WARNINGS = ("syntax error", "format error", "zlib error", "cannot load object",
                    "repairing PDF document")


def _damage_warning(warnings: str) -> str | None:
    """The first MuPDF warning line that means the file is damaged (font quirks are not)."""
    for line in warnings.splitlines():
        if any(marker in line for marker in _DAMAGE_WARNINGS):
            return repr(line.strip()[:120])
    return None


@contextmanager
def _cycle_collector_paused() -> Iterator[None]:
    """Pause Python's cycle collector while a document's pages are read.

    ``get_text("dict")`` builds thousands of dicts and lists per page; they hold no
    cycles and reference counting frees them, but each page triggers several
    collections that re-walk them (and, in an actor, every object Ray imported):
    ~10% of a text page's time (docs/ARCHITECTURE.md, "PDF text path speed").
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_JUNK_TITLE = re.compile(r"(\.(dvi|tex|pdf|doc|docx)$)|[\\/]|^untitled$", re.IGNORECASE)


def _metadata_title(doc: Any) -> str:
    title = " ".join(str((doc.metadata or {}).get("title") or "").split())
    return title[:200] if title and not _JUNK_TITLE.search(title) else ""


def _comparable(text: str) -> str:
    return " ".join(re.sub(r"[\W_]+", " ", text.casefold()).split())


def _page_title(doc: Any, lines: list[Line], body: float, width: float
                ) -> tuple[str, list[int], list[int]]:
    """Page 1's title (its largest lines together), the indices of the lines it takes off
    the page (none when the metadata gives another title) and of the byline under it."""
    chosen = title_lines(lines, body)
    if not chosen:
        return "", [], []
    title = normalise_ligatures(" ".join(" ".join(lines[i].text.split()) for i in chosen))
    metadata = _metadata_title(doc)
    byline = byline_lines(lines, chosen, body, width)
    if metadata and _comparable(metadata) != _comparable(title):
        return title[:200], [], byline
    return title[:200], chosen, byline


def _document_title(doc: Any, path: str, page_title: str | None) -> str:
    """The metadata title when it looks like one, else page 1's title, else the stem."""
    title = _metadata_title(doc)
    if title:
        return title
    if page_title is None and doc.page_count > 0:  # page 1 went to OCR: read its text layer
        lines = page_lines(doc[0].get_text("dict", flags=TEXT_FLAGS))
        page_title, _, _ = _page_title(doc, lines, font_scale([lines]).body, 612.0)
    return page_title or PurePosixPath(path).stem


class RenderPdf:
    """Open each PDF: Markdown of its text-layer pages, the pages to OCR, and metadata.

    Batched: called with a list of paths, returns per path either ``(pages, meta)``
    (a module with ``num_outputs=2``) or a ``RecordFailure`` for that document.
    ``pages`` are the pages an OCR engine must read, each with a PNG rendered at
    ``dpi`` (grayscale by default, lowered per page so no page exceeds
    ``max_page_pixels``): every page when ``needs_image``; with ``ocr_fallback`` the
    pages whose text layer is empty or garbage (and that show any ink); otherwise none.
    Every other page becomes Markdown here (``meta["pages"]``); ``tables`` also turns
    ruled tables into pipe tables (:mod:`rayorch.pipelines.pdf_tables`).
    A document that MuPDF had to repair, or whose objects or streams it could not
    parse, is refused unless ``allow_damaged`` (MuPDF would silently return partial pages).
    """

    def __init__(
        self,
        *,
        needs_image: bool = False,
        ocr_fallback: bool = False,
        tables: bool = False,
        dpi: int = DEFAULT_DPI,
        max_page_pixels: int = DEFAULT_MAX_PAGE_PIXELS,
        max_pages: int | None = None,
        grayscale: bool = True,
        allow_damaged: bool = False,
    ) -> None:
        # Any: PyMuPDF's own annotations are partial; this class checks its inputs itself.
        pymupdf: Any = import_pymupdf()
        if dpi <= 0 or max_page_pixels <= 0:
            raise ro.RayorchError(f"dpi ({dpi}) and max_page_pixels must be positive")
        self._pymupdf = pymupdf
        # MuPDF prints repair warnings on stderr; they are read back per document instead.
        pymupdf.TOOLS.mupdf_display_errors(False)
        self.needs_image = needs_image
        self.ocr_fallback = ocr_fallback
        self.tables = tables
        self.dpi = dpi
        self.max_page_pixels = max_page_pixels
        self.max_pages = max_pages
        self.colorspace = pymupdf.csGRAY if grayscale else pymupdf.csRGB
        self.allow_damaged = allow_damaged

    def __call__(self, paths: list[Any]) -> list[RenderedDocument | RecordFailure]:
        results: list[RenderedDocument | RecordFailure] = []
        for path in paths:
            try:
                results.append(self.render(path))
            except RecordFailure as failure:
                results.append(failure)
            except Exception as exc:  # one bad document must never fail the batch
                results.append(_refuse("unreadable", f"{path}: {type(exc).__name__}: {exc}"))
        return results

    def render(self, source: Any) -> RenderedDocument:
        """One document's pages and metadata; raises ``RecordFailure`` for bad input."""
        file = self._check_file(source)
        path = file.name
        pymupdf = self._pymupdf
        pymupdf.TOOLS.reset_mupdf_warnings()
        try:  # a local file is mapped; an object is read whole (MuPDF takes no ranged reader)
            doc = (pymupdf.open(file.path, filetype="pdf") if file.path is not None
                   else pymupdf.open(stream=file.read(), filetype="pdf"))
        except RecordFailure:
            raise
        except Exception as exc:
            raise self._damaged(file, f"MuPDF cannot open it ({exc})") from None
        with doc:
            if doc.needs_pass:
                raise _refuse(
                    "encrypted",
                    f"{path} is password-protected; decrypt it first "
                    "(e.g. qpdf --decrypt --password=... in.pdf out.pdf)",
                )
            if doc.is_repaired and not self.allow_damaged:
                raise self._damaged(file, "MuPDF had to repair its cross-reference table")
            if doc.page_count == 0:
                raise _refuse("no pages", f"{path} is a valid PDF with zero pages")
            if self.max_pages is not None and doc.page_count > self.max_pages:
                raise _refuse(
                    "too many pages",
                    f"{path} has {doc.page_count} pages, more than max_pages={self.max_pages}",
                )
            try:
                with _cycle_collector_paused():
                    pages, records, first_page = self._pages(doc, path)
            except RecordFailure:
                raise
            except Exception as exc:
                if doc.is_repaired or _damage_warning(pymupdf.TOOLS.mupdf_warnings()):
                    raise self._damaged(file, f"reading its pages failed ({exc})") from None
                raise
            if not self.allow_damaged:
                damage = _damage_warning(pymupdf.TOOLS.mupdf_warnings())
                if doc.is_repaired or damage:
                    raise self._damaged(file, f"MuPDF reported {damage or 'a repair'} on reading")
            meta = {"path": path, "title": _document_title(doc, path, first_page),
                    "page_count": doc.page_count, "pages": records}
        return pages, meta

    @staticmethod
    def _check_file(source: Any) -> InputFile:
        file = check_file(source, "PDF", 1024, whole=True)
        if b"%PDF-" not in file.head:
            raise _refuse("not a PDF", f"{file.name} has no %PDF- header in its first 1024 "
                          "bytes")
        return file

    @staticmethod
    def _damaged(file: InputFile, why: str) -> RecordFailure:
        if b"%%EOF" not in file.tail(2048):
            return _refuse("truncated", f"{file.name} ends before its %%EOF marker; {why}")
        return _refuse("damaged", f"{file.name} is corrupt; {why}")

    def _pages(self, doc: Any, path: str
               ) -> tuple[list[Page], list[dict[str, Any]], str | None]:
        """The pages to OCR, one record per page, and page 1's title (``None``: not read)."""
        to_ocr: list[Page] = []
        records: list[dict[str, Any]] = []
        text_pages: list[tuple[dict[str, Any], list[Line], float, float, list[Table]]] = []
        first_page: str | None = None
        for index in range(doc.page_count):
            page = doc.load_page(index)
            width, height = float(page.rect.width), float(page.rect.height)
            if not (min(width, height) >= MIN_PAGE_SIDE_PT
                    and max(width, height) <= MAX_PAGE_SIDE_PT):
                raise _refuse(
                    "page size",
                    f"{path} page {index + 1} is {width:g} x {height:g} pt; pages must be "
                    f"{MIN_PAGE_SIDE_PT:g} to {MAX_PAGE_SIDE_PT:g} pt a side",
                )
            record: dict[str, Any] = {"page": index + 1, "engine": None, "layer": None,
                                      "markdown": ""}
            records.append(record)
            if self.needs_image:
                to_ocr.append(self._image_page(page, index, page.get_text()))
                continue
            textpage = page.get_textpage(flags=TEXT_FLAGS)
            lines = textpage_lines(textpage)
            if lines is None:  # MuPDF's JSON and HTML did not line up: PyMuPDF's dict
                lines = page_lines(textpage.extractDICT())
            layer = text_layer_quality("".join(line.text for line in lines))
            record["layer"] = layer
            # Ruled tables read their words from this TextPage: no second one for the page.
            tables = page_tables(page, textpage) if self.tables and layer == "usable" else []
            del textpage
            if layer != "usable" and self.ocr_fallback and (layer == "garbage"
                                                            or _has_ink(page)):
                to_ocr.append(self._image_page(page, index, ""))
            elif layer == "empty" and not _has_ink(page):
                record["engine"] = "blank"
            else:
                record["engine"] = "text"
                text_pages.append((record, lines, width, height, tables))
        chars = size_chars([lines for _, lines, _, _, _ in text_pages])
        scale = font_scale(chars)
        if text_pages and text_pages[0][0]["page"] == 1:
            # The title is the document's "#" (assemble_markdown), not a heading of page 1.
            record, lines, width, height, tables = text_pages[0]
            first_page, taken, byline = _page_title(doc, lines, scale.body, width)
            if taken or byline:  # the byline (authors, date) is text: sized as the body
                gone, plain = set(taken), set(byline)
                text_pages[0] = (record, [replace(line, size=scale.body) if i in plain else line
                                          for i, line in enumerate(lines) if i not in gone],
                                 width, height, tables)
                chars.subtract(size_chars([[lines[i] for i in taken + byline]]))
                scale = font_scale(chars)
        words = DocumentWords([lines for _, lines, _, _, _ in text_pages])
        for record, lines, width, height, tables in text_pages:
            record["markdown"] = page_markdown(lines, width, height, scale, tables, words)
        return to_ocr, records, first_page

    def _image_page(self, page: Any, index: int, text: str) -> Page:
        width, height = float(page.rect.width), float(page.rect.height)
        record: Page = {"page": index + 1, "width": width, "height": height, "text": text}
        zoom = min(self.dpi / 72.0, math.sqrt(self.max_page_pixels / (width * height)))
        # MuPDF rounds the pixel box outwards: shrink until the rounded box fits the cap.
        while math.ceil(width * zoom) * math.ceil(height * zoom) > self.max_page_pixels:
            zoom *= 0.995
        pixmap = page.get_pixmap(
            matrix=self._pymupdf.Matrix(zoom, zoom), colorspace=self.colorspace, alpha=False
        )
        record["png"] = pixmap.tobytes("png")
        record["dpi"] = round(zoom * 72.0, 2)
        return record


def _has_ink(page: Any) -> bool:
    """Whether a page without text shows anything (an image or vector drawing) to OCR."""
    return bool(page.get_images(full=False)) or bool(page.get_cdrawings())


def _clean_text(text: str) -> str:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def document_pages(page_texts: list[PageText], meta: DocumentMeta) -> list[dict[str, Any]]:
    """Every page of a document in order: ``{"page", "engine", "text"}``.

    Text-layer and blank pages come from ``meta["pages"]``, OCR'd pages from
    ``page_texts``; a document rendered without page records (older runs) is all OCR.
    """
    ocr = {int(t["page"]): t for t in page_texts}
    records = meta.get("pages")
    if records is None:
        records = [{"page": n, "engine": None, "markdown": ""} for n in sorted(ocr)]
    pages = []
    for record in records:
        number = int(record["page"])
        done = ocr.get(number)
        if record.get("engine") is None and done is not None:
            engine = str(done.get("engine") or "ocr")
            text = _clean_text(str(done.get("text", "")))
        else:
            engine = str(record.get("engine") or "missing")
            text = str(record.get("markdown") or "")
        pages.append({"page": number, "engine": engine, "text": text,
                      "layer": record.get("layer"),
                      "garbage": engine == "text" and record.get("layer") == "garbage"})
    return pages


def assemble_markdown(pages: list[dict[str, Any]], meta: DocumentMeta, *,
                      page_markers: bool = True) -> str:
    """A Markdown document: the title, then each page after ``<!-- page N engine=E -->``
    (without those markers when ``page_markers`` is False)."""
    parts = [f"# {meta['title']}", f"<!-- source: {meta['path']} -->"]
    for page in pages:
        if page_markers:
            parts.append(f"<!-- page {page['page']} engine={page['engine']} -->")
        if page["text"]:
            parts.append(page["text"])
    return "\n\n".join(parts) + "\n"


def _empty(page: dict[str, Any]) -> bool:
    """A page that shows ink yet ended without text (a summary warning)."""
    if page["text"].strip() or page["engine"] == "blank":
        return False
    return not (page["engine"] == "text" and page["layer"] == "usable")


class AssembleDocument:
    """OCR'd page texts plus the document's metadata -> one Markdown document.

    Returns per document ``{"path", "title", "pages", "markdown", "page_engines",
    "empty_pages", "garbage_pages"}``: ``page_engines[i]`` says what produced page
    ``i + 1`` (``text``, an OCR engine, or ``blank`` for a page without ink),
    ``empty_pages`` the page numbers that show ink but ended without text (not a page
    whose usable text layer held only running page or line numbers, which the Markdown
    drops), ``no_layer_pages`` those of them kept from an empty text layer (``--ocr text``:
    not OCR'd),
    ``garbage_pages`` the pages whose garbage text layer was kept (``--ocr text``);
    both are summary warnings. ``page_markers=False`` leaves the page markers out.
    """

    def __init__(self, page_markers: bool = True) -> None:
        self.page_markers = page_markers

    def __call__(
        self, page_texts: list[list[PageText]], metas: list[DocumentMeta]
    ) -> list[dict[str, Any]]:
        documents = []
        for texts, meta in zip(page_texts, metas, strict=True):
            pages = document_pages(texts, meta)
            documents.append({
                "path": meta["path"],
                "title": meta["title"],
                "pages": len(pages),
                "markdown": assemble_markdown(pages, meta, page_markers=self.page_markers),
                "page_engines": [p["engine"] for p in pages],
                "empty_pages": [p["page"] for p in pages if _empty(p)],
                "no_layer_pages": [p["page"] for p in pages
                                   if _empty(p) and p["engine"] == "text"],
                "garbage_pages": [p["page"] for p in pages if p["garbage"]],
            })
        return documents


class RenderPages(RenderPdf):
    """:class:`RenderPdf` with every page as a child: ``(pages, to_ocr, meta)`` per PDF.

    ``pages[i]`` is page ``i + 1``: the page to OCR (with its PNG) when ``to_ocr[i]``,
    else ``{"page": n, "engine": "text"|"blank"}`` (its Markdown is in ``meta``).
    """

    def __call__(self, paths: list[Any]) -> list[Any]:
        out: list[Any] = []
        for result in super().__call__(paths):
            if isinstance(result, RecordFailure):
                out.append(result)
                continue
            to_ocr, meta = result
            ocr = {page["page"]: page for page in to_ocr}
            pages = [ocr.get(r["page"]) or {"page": r["page"], "engine": r["engine"]}
                     for r in meta["pages"]]
            out.append((pages, [r["page"] in ocr for r in meta["pages"]], meta))
        return out


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

    >>> plan = PdfPipeline().compile()
    """

    def __init__(
        self,
        engine: str = "auto",
        *,
        replicas: Replicas = 1,
        batch_size: int = 16,
        dpi: int = DEFAULT_DPI,
        render_replicas: Replicas = 1,
        render_batch_size: int = 2,
        tables: bool = False,
        engine_options: dict[str, Any] | None = None,
        ocr_num_cpus: float | None = None,
        ocr_num_gpus: float | None = None,
        ocr_inflight: int = 1,
        page_markers: bool = True,
    ) -> None:
        super().__init__()
        if engine not in OCR_MODES:
            valid = ", ".join(repr(m) for m in OCR_MODES)
            raise OcrEngineError(f"unknown OCR engine {engine!r}: choose one of {valid}")
        auto = engine == "auto"
        ocr_options: dict[str, Any] = {"lazy": True} if auto else {}
        ocr_options.update(engine_options or {})
        self.render = ro.RayModule(
            RenderPages,
            needs_image=not auto and engine_needs_image(engine),
            ocr_fallback=auto,
            tables=tables,
            dpi=dpi,
            num_outputs=3,
            batch_size=render_batch_size,
            replicas=render_replicas,
            num_cpus=1.0,
        )
        # The engine's options are constructor arguments (.pre_init), never execution
        # options: an engine's own timeout_s must not become the batch timeout.
        self.ocr = ro.RayModule(
            OcrPage if ocr_inflight == 1 else AsyncOcrPage,
            max_inflight=ocr_inflight,
            batch_size=batch_size,
            replicas=replicas,
            num_cpus=ocr_num_cpus if ocr_num_cpus is not None else ocr_module_cpus(engine),
            num_gpus=ocr_num_gpus if ocr_num_gpus is not None else (
                vllm_num_gpus() if engine == "vllm" else 0.0),
        ).pre_init(FALLBACK_ENGINE if auto else engine, **ocr_options)
        self.assemble = ro.RayModule(AssembleDocument, page_markers=page_markers,
                                     batch_size=8, num_cpus=0.25)

    def forward(self, pdfs: Any) -> Any:
        pages, to_ocr, meta = self.render(pdfs)
        page, wanted = F.expand_aligned(pages, to_ocr)
        texts = self.ocr(F.filter(page, wanted))
        return self.assemble(F.reduce(texts), meta)


def find_pdfs(source: str | Path) -> list[str]:
    """The PDF paths under a directory or an object store prefix (recursive, sorted), or
    the file itself."""
    return find_files(source, {".pdf"}, "PDF")


def list_pdfs(source: str | Path) -> list[tuple[str, int]]:
    """:func:`find_pdfs` with each file's size (from the listing: no request per file)."""
    return [item for page in list_inputs(source, {".pdf"}, "PDF") for item in page]


from rayorch.pipelines.pdf_outputs import (  # noqa: E402  (re-exported: pdf's public API)
    PDF_WRITER,
    document_warnings,
    summary_dict,
)

__all__ = [
    "OCR_MODES", "PDF_WRITER", "AssembleDocument", "AsyncOcrPage", "OcrPage", "PdfPipeline",
    "RenderPages", "RenderPdf", "assemble_markdown", "document_pages", "document_warnings",
    "failure_kind", "find_pdfs", "list_pdfs", "summary_dict",
]
