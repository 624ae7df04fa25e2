"""Render page images in a pool of their own, so a document's pages spread over it.

With ``PdfPipeline(spread_pages=True)`` (``rayorch run pdf --spread-pages``) the render
actor reads each document's text layer and decides which pages need OCR, but renders no
image: each such page leaves it as ``{"page", "width", "height", "text", "source",
"sha256"}``. A :class:`RasterizePages` actor renders its PNG. Pages of one document then
batch with pages of others over every rasterizer, so a 3,000-page scan is rendered by many
actors, none of which holds it whole, and no render actor holds a document's images.

Each rasterizer keeps the last few documents it opened (:data:`OPEN_DOCUMENTS`): a batch of
pages of one document opens it once. A document is read as the render actor read it
(:func:`~rayorch.pipelines.input_files.check_file`: a local file mapped, an object read whole)
and must have the bytes the render actor saw (``sha256``): a source rewritten in between
fails its pages alone, with that cause, never renders another document's page.

>>> from rayorch.pipelines.document.render import RenderPdf
>>> [(pages, meta)] = RenderPdf(needs_image=True, defer_images=True)(
...     ["examples/pdfs/qtree-qarrows.pdf"])
>>> sorted(pages[0])
['height', 'page', 'sha256', 'source', 'text', 'width']
>>> [page] = RasterizePages()(pages)
>>> page["png"][:4], page["dpi"]
(b'\\x89PNG', 110.0)
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import rayorch as ro
from rayorch.pipelines.document.pdf_markdown import import_pymupdf
from rayorch.pipelines.document.render import (
    DEFAULT_DPI,
    DEFAULT_MAX_PAGE_PIXELS,
    content_sha256,
    page_png,
)
from rayorch.pipelines.input_files import check_file
from rayorch.pipelines.sources import each_alone
from rayorch.pipelines.sources import refuse as _refuse

OPEN_DOCUMENTS = 2
"""Documents a rasterizer keeps open between batches (a document's pages come in runs)."""


class RasterizePages:
    """Batched: each deferred page item in, the same item with ``png`` and ``dpi`` out (a
    ``RecordFailure`` for that page alone when its document cannot be read as it was)."""

    def __init__(self, *, dpi: int = DEFAULT_DPI,
                 max_page_pixels: int = DEFAULT_MAX_PAGE_PIXELS, grayscale: bool = True,
                 open_documents: int = OPEN_DOCUMENTS) -> None:
        if dpi <= 0 or max_page_pixels <= 0 or open_documents < 1:
            raise ro.RayorchError(f"dpi ({dpi}), max_page_pixels and open_documents must be "
                                  "positive")
        self._pymupdf: Any = import_pymupdf()
        self._pymupdf.TOOLS.mupdf_display_errors(False)
        self.dpi, self.max_page_pixels = dpi, max_page_pixels
        self.colorspace = self._pymupdf.csGRAY if grayscale else self._pymupdf.csRGB
        self.open_documents = open_documents
        self._open: OrderedDict[tuple[str, str], Any] = OrderedDict()

    def __call__(self, pages: list[Any]) -> list[Any]:
        return each_alone(pages, self.rasterize, lambda item: f"page {_number(item)}")

    def rasterize(self, item: Any) -> dict[str, Any]:
        """``item`` with its page rendered (``png``, ``dpi``)."""
        if not (isinstance(item, dict) and isinstance(item.get("source"), str)
                and isinstance(item.get("sha256"), str) and isinstance(item.get("page"), int)):
            raise _refuse("bad input", "expected a deferred page item (page, source, sha256), "
                          f"got {type(item).__name__}")
        doc = self._document(item["source"], item["sha256"])
        number = item["page"]
        if not 1 <= number <= doc.page_count:
            raise _refuse("bad input", f"{item['source']} has no page {number}")
        png, dpi = page_png(self._pymupdf, doc.load_page(number - 1), self.dpi,
                            self.max_page_pixels, self.colorspace)
        return {**item, "png": png, "dpi": dpi}

    def _document(self, source: str, sha256: str) -> Any:
        key = (source, sha256)
        doc = self._open.get(key)
        if doc is not None:
            self._open.move_to_end(key)
            return doc
        file = check_file(source, "PDF", 1024, whole=True)
        data = None if file.path is not None else file.read()
        if content_sha256(file, data) != sha256:
            raise _refuse("changed", f"{source} changed after it was rendered (its SHA-256 is "
                          "not the one its pages were read from); run it again")
        doc = (self._pymupdf.open(file.path, filetype="pdf") if data is None
               else self._pymupdf.open(stream=data, filetype="pdf"))
        self._open[key] = doc
        while len(self._open) > self.open_documents:
            _, old = self._open.popitem(last=False)
            old.close()
        return doc

    def close(self) -> None:
        for doc in self._open.values():
            doc.close()
        self._open.clear()


def _number(item: Any) -> str:
    return str(item.get("page")) if isinstance(item, dict) else "?"


__all__ = ["OPEN_DOCUMENTS", "RasterizePages"]
