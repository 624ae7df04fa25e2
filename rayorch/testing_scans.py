"""Scanned PDFs of any length for tests and benches: image-only pages (no text layer) whose
text is known, as a scanner would make them. Needs PyMuPDF (the ``pdf`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

WIDTH, HEIGHT = 420.0, 300.0
"""A page's size in points (small: OCR of thousands of pages stays quick)."""


def scan_text(number: int) -> str:
    """The words on page ``number`` (1-based): distinct per page, so order is checkable."""
    return f"Page {number} of the ledger holds entry {number * 7 % 1000} for account {number}"


def write_scan(path: str | Path, pages: int, *, dpi: int = 100) -> list[str]:
    """An image-only PDF of ``pages`` pages at ``path``, each a ``dpi`` grayscale picture
    of :func:`scan_text`; returns each page's text (what OCR should read)."""
    from rayorch.pipelines.document.pdf_markdown import import_pymupdf

    pymupdf: Any = import_pymupdf()
    texts = [scan_text(n) for n in range(1, pages + 1)]
    with pymupdf.open() as src, pymupdf.open() as out:
        page = src.new_page(width=WIDTH, height=HEIGHT)
        for text in texts:
            page.add_redact_annot(page.rect)
            page.apply_redactions()  # an empty page again, for the next text
            head, _, tail = text.partition(" for ")
            page.insert_text((30, 80), head, fontsize=16)
            page.insert_text((30, 115), f"for {tail}", fontsize=16)
            pixmap = page.get_pixmap(dpi=dpi, colorspace=pymupdf.csGRAY)
            target = out.new_page(width=WIDTH, height=HEIGHT)
            target.insert_image(target.rect, pixmap=pixmap)
        out.save(path, garbage=1, deflate=True)
    return texts


__all__ = ["HEIGHT", "WIDTH", "scan_text", "write_scan"]
