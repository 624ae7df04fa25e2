"""Assemble a PDF's pages into one Markdown document (the page-grain jobs).

Runs inside the assemble actors of :class:`rayorch.pipelines.pdf.PdfPipeline`: the OCR'd
page texts of one document, in page order, plus the Markdown its text-layer pages got
from the renderer.

>>> from rayorch.pipelines.document.render import RenderPdf
>>> [(pages, meta)] = RenderPdf(ocr_fallback=True)(["examples/pdfs/qtree-qarrows.pdf"])
>>> [doc] = AssembleDocument()([[]], [meta])
>>> doc["markdown"].count("<!-- page "), doc["page_engines"]
(1, ['text'])
"""

from __future__ import annotations

import re
from typing import Any

from rayorch.pipelines.document.page_ocr import PageText
from rayorch.pipelines.document.render import DocumentMeta


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
                "sha256": meta.get("sha256"),
                "pages": len(pages),
                "markdown": assemble_markdown(pages, meta, page_markers=self.page_markers),
                "page_engines": [p["engine"] for p in pages],
                "empty_pages": [p["page"] for p in pages if _empty(p)],
                "no_layer_pages": [p["page"] for p in pages
                                   if _empty(p) and p["engine"] == "text"],
                "garbage_pages": [p["page"] for p in pages if p["garbage"]],
            })
        return documents
