"""Render a PDF for the region grain (``--ocr layout``): every page as a page item.

A page item is the input of the layout step (the region contract, docs/topics/PIPELINES.md "The
region grain"): the page image (PNG, in colour so figures keep theirs), its size in PDF
points, the dpi it was rendered at and its text-layer words (PDF points, top-left origin;
none on a scanned page)::

    {"page": n, "png": bytes, "width_pt": float, "height_pt": float, "dpi": int,
     "words": [[x0, y0, x1, y1, text], ...], "layer": "usable" | "garbage" | "none"}

The checks on the file (not a PDF, encrypted, damaged, page sizes) are
:class:`~rayorch.pipelines.document.render.RenderPdf`'s: bad input is a ``RecordFailure``
for that document only.

>>> [(pages, numbers, meta)] = RenderLayoutPages()(["examples/pdfs/qtree-qarrows.pdf"])
>>> numbers, sorted(pages[0]), pages[0]["layer"]
([1], ['dpi', 'height_pt', 'layer', 'page', 'png', 'width_pt', 'words'], 'usable')
"""

from __future__ import annotations

import hashlib
from pathlib import PurePosixPath
from typing import Any

from rayorch import RecordFailure
from rayorch.pipelines.document.pdf_markdown import normalise_ligatures, text_layer_quality
from rayorch.pipelines.document.render import (
    DEFAULT_MAX_PAGE_PIXELS,
    TEXT_FLAGS,
    RenderPdf,
    checked_page_size,
)
from rayorch.pipelines.sources import slug

LAYOUT_DPI = 144
"""The resolution pages are rendered at for layout: the CDLA model's measured sweet spot,
and crops sharp enough for OCR."""

PageItem = dict[str, Any]
RegionMeta = dict[str, Any]
"""``{"path", "title", "page_count", "figure_stem", "sha256"}``: what the assemblers need
of a PDF."""


def figure_stem(path: str) -> str:
    """The prefix of a document's figure files: its stem, made file-safe, and a digest of its
    whole path (two ``report.pdf`` in different folders never share a figure name).

    >>> figure_stem("in/a b.pdf")
    'a-b-d2982428'
    """
    digest = hashlib.sha1(path.encode()).hexdigest()[:8]
    return f"{slug(PurePosixPath(path).stem)[:60]}-{digest}"


def page_words(page: Any) -> list[list[Any]]:
    """The page's text-layer words as ``[x0, y0, x1, y1, text]`` in PDF points (top-left)."""
    return [[float(x0), float(y0), float(x1), float(y1), normalise_ligatures(str(text))]
            for x0, y0, x1, y1, text, *_ in page.get_text("words", flags=TEXT_FLAGS)]


class RenderLayoutPages(RenderPdf):
    """Open each PDF: per PDF ``(pages, numbers, meta)`` (a module with ``num_outputs=3``).

    ``pages[i]`` is the page item of page ``numbers[i]`` (``i + 1``); ``meta`` is a
    :data:`RegionMeta`. ``numbers`` travel beside the pages so the page assembler knows
    its page without the page's image.
    """

    def __init__(self, *, dpi: int = LAYOUT_DPI, max_page_pixels: int = DEFAULT_MAX_PAGE_PIXELS,
                 max_pages: int | None = None, allow_damaged: bool = False,
                 defer_images: bool = False) -> None:
        super().__init__(needs_image=True, dpi=dpi, max_page_pixels=max_page_pixels,
                         max_pages=max_pages, grayscale=False, allow_damaged=allow_damaged,
                         defer_images=defer_images)

    def __call__(self, paths: list[Any]) -> list[Any]:
        out: list[Any] = []
        for result in super().__call__(paths):
            if isinstance(result, RecordFailure):
                out.append(result)
                continue
            pages, meta = result
            small: RegionMeta = {"path": meta["path"], "title": meta["title"],
                                 "page_count": meta["page_count"],
                                 "figure_stem": figure_stem(str(meta["path"])),
                                 "sha256": meta["sha256"]}
            out.append((pages, [page["page"] for page in pages], small))
        return out

    def _pages(self, doc: Any, path: str) -> tuple[list[Any], list[dict[str, Any]], None]:
        """Every page as a page item; no page records (the assemblers need none)."""
        items: list[PageItem] = []
        for index in range(doc.page_count):
            page = doc.load_page(index)
            width, height = checked_page_size(page, index, path)
            words = page_words(page)
            quality = text_layer_quality(" ".join(str(w[4]) for w in words))
            image = self._image_page(page, index, "")
            item: PageItem = {"page": index + 1, "width_pt": width, "height_pt": height,
                              "words": words, "layer": "none" if quality == "empty" else quality}
            if "png" in image:  # else deferred: a RasterizePages actor adds png and dpi
                item["png"], item["dpi"] = image["png"], round(float(image["dpi"]))
            items.append(item)
        return items, [], None


__all__ = ["LAYOUT_DPI", "RegionMeta", "RenderLayoutPages", "figure_stem", "page_words"]
