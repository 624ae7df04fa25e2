"""Render a PDF: Markdown of its text-layer pages, PNGs of the pages to OCR, metadata.

Runs inside the render actors of :class:`rayorch.pipelines.pdf.PdfPipeline`. Pages with
a usable text layer become Markdown here (:mod:`rayorch.pipelines.document.pdf_markdown`),
so such pages never travel to an OCR actor; only the pages that need OCR carry a PNG.

Bad input (missing, empty, non-PDF, encrypted, truncated, damaged, zero pages, absurd
page sizes) becomes ``ro.RecordFailure("<kind>: <detail>")`` for that document only.

>>> from rayorch.pipelines.document.render import RenderPdf
>>> [(pages, meta)] = RenderPdf(ocr_fallback=True)(["examples/pdfs/qtree-qarrows.pdf"])
>>> pages                     # a born-digital page: nothing to OCR
[]
>>> [p["engine"] for p in meta["pages"]]
['text']
"""

from __future__ import annotations

import gc
import hashlib
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any

import rayorch as ro
from rayorch import RecordFailure
from rayorch.pipelines.document.ocr import Page
from rayorch.pipelines.document.pdf_markdown import (
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
from rayorch.pipelines.document.pdf_structure import byline_lines, title_lines
from rayorch.pipelines.document.pdf_tables import Table, page_tables
from rayorch.pipelines.input_files import InputFile, Prefetcher, check_file
from rayorch.pipelines.sources import each_alone
from rayorch.pipelines.sources import refuse as _refuse

DEFAULT_DPI = 110
MAX_PAGE_SIDE_PT = 14_400.0
"""The PDF implementation limit for a page side (200 inches); larger pages are refused."""
MIN_PAGE_SIDE_PT = 3.0
"""The PDF minimum page side; smaller (or empty) pages are refused."""
DEFAULT_MAX_PAGE_PIXELS = 16_000_000
"""Pixel cap per rendered page: above it the page is rendered at a lower dpi."""
PREFETCH = 4
"""Inputs on an object store a render actor reads ahead of the one it renders (a batch's)."""

TEXT_FLAGS = 2 | 64
"""``TEXT_PRESERVE_WHITESPACE | TEXT_MEDIABOX_CLIP``: ligatures expanded by MuPDF,
unknown glyphs as U+FFFD (which is how a garbage layer is recognised), no images."""

DocumentMeta = dict[str, Any]
"""``{"path", "title", "page_count", "pages": [PageRecord], "sha256"}``; a PageRecord is
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
    ~10% of a text page's time (docs/topics/PIPELINES.md, "PDF text path speed").
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_JUNK_TITLE = re.compile(r"(\.(dvi|tex|pdf|doc|docx)$)|[\\/]|^untitled$", re.IGNORECASE)


def content_sha256(file: InputFile, data: bytes | None) -> str:
    """The SHA-256 of the input's bytes, where they are read (the render actor; the
    driver reads no input): ``data`` when it was read whole, else the local file."""
    if data is not None:
        return hashlib.sha256(data).hexdigest()
    with open(str(file.path), "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


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
    ruled tables into pipe tables (:mod:`rayorch.pipelines.document.pdf_tables`).
    A document that MuPDF had to repair, or whose objects or streams it could not
    parse, is refused unless ``allow_damaged`` (MuPDF would silently return partial pages).
    ``defer_images``: a page to OCR carries no PNG but its ``source`` and the document's
    ``sha256``; a :class:`~rayorch.pipelines.document.rasterize.RasterizePages` actor renders
    it (a document's pages spread over that pool instead of living in this actor).
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
        defer_images: bool = False,
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
        self.defer_images = defer_images
        self._prefetch = Prefetcher(PREFETCH)

    def __call__(self, paths: list[Any]) -> list[RenderedDocument | RecordFailure]:
        return each_alone(self._prefetch(paths, self._check_file),
                          lambda item: self.render(*item), lambda item: str(item[0]))

    def render(self, source: Any, get: Callable[[], InputFile] | None = None
               ) -> RenderedDocument:
        """One document's pages and metadata; raises ``RecordFailure`` for bad input.
        ``get``: its file, read ahead (:class:`~rayorch.pipelines.input_files.Prefetcher`)."""
        file = self._check_file(source) if get is None else get()
        path = file.name
        pymupdf = self._pymupdf
        pymupdf.TOOLS.reset_mupdf_warnings()
        try:  # a local file is mapped; an object is read whole (MuPDF takes no ranged reader)
            data = None if file.path is not None else file.read()
            doc = (pymupdf.open(file.path, filetype="pdf") if data is None
                   else pymupdf.open(stream=data, filetype="pdf"))
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
                    "page_count": doc.page_count, "pages": records,
                    "sha256": content_sha256(file, data)}
            if self.defer_images:  # where, and which bytes, a rasterizer renders them from
                for page in pages:
                    page["source"], page["sha256"] = path, meta["sha256"]
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
            width, height = checked_page_size(page, index, path)
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
        if self.defer_images:  # a RasterizePages actor renders it (the page's source, later)
            return record
        record["png"], record["dpi"] = page_png(self._pymupdf, page, self.dpi,
                                                self.max_page_pixels, self.colorspace)
        return record


def page_png(pymupdf: Any, page: Any, dpi: int, max_page_pixels: int, colorspace: Any
             ) -> tuple[bytes, float]:
    """The page rendered at ``dpi`` (lowered so it has at most ``max_page_pixels``), as PNG,
    and the dpi it was rendered at."""
    width, height = float(page.rect.width), float(page.rect.height)
    zoom = min(dpi / 72.0, math.sqrt(max_page_pixels / (width * height)))
    # MuPDF rounds the pixel box outwards: shrink until the rounded box fits the cap.
    while math.ceil(width * zoom) * math.ceil(height * zoom) > max_page_pixels:
        zoom *= 0.995
    pixmap = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), colorspace=colorspace,
                             alpha=False)
    return pixmap.tobytes("png"), round(zoom * 72.0, 2)


def checked_page_size(page: Any, index: int, path: str) -> tuple[float, float]:
    """Page ``index``'s width and height in points; a ``RecordFailure`` for an absurd size."""
    width, height = float(page.rect.width), float(page.rect.height)
    if not (min(width, height) >= MIN_PAGE_SIDE_PT and max(width, height) <= MAX_PAGE_SIDE_PT):
        raise _refuse(
            "page size",
            f"{path} page {index + 1} is {width:g} x {height:g} pt; pages must be "
            f"{MIN_PAGE_SIDE_PT:g} to {MAX_PAGE_SIDE_PT:g} pt a side",
        )
    return width, height


def _has_ink(page: Any) -> bool:
    """Whether a page without text shows anything (an image or vector drawing) to OCR."""
    return bool(page.get_images(full=False)) or bool(page.get_cdrawings())


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
