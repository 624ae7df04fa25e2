"""The PDF job's summary warnings are true of the OCR mode that ran (public API, real OCR)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pymupdf: Any = pytest.importorskip("pymupdf")
pytest.importorskip("rapidocr_onnxruntime")

from rayorch.pipelines.pdf import (  # noqa: E402
    AssembleDocument,
    OcrPage,
    RenderPdf,
    document_warnings,
)


def three_pages(path: Path) -> Path:
    """Page 1 text; page 2 only its running page number; page 3 a drawing, no text."""
    doc = pymupdf.open()
    page = doc.new_page(width=400, height=600)
    page.insert_text((50, 100), "Body text of the first page, long enough to be a line.",
                     fontsize=11)
    page = doc.new_page(width=400, height=600)
    page.insert_text((195, 580), "2", fontsize=10)
    page = doc.new_page(width=400, height=600)
    page.draw_rect(pymupdf.Rect(60, 60, 340, 300), color=(0, 0, 0), width=2)
    page.draw_line((60, 60), (340, 300), color=(0, 0, 0), width=2)
    doc.save(path)
    return path


def warnings_of(path: Path, render: RenderPdf, ocr: OcrPage | None) -> list[str]:
    [(to_ocr, meta)] = render([str(path)])
    texts = ocr(to_ocr) if ocr is not None and to_ocr else []
    [doc] = AssembleDocument()([texts], [meta])
    return document_warnings("d.pdf", doc)


def test_warnings_match_the_mode_that_ran(tmp_path: Path) -> None:
    path = three_pages(tmp_path / "d.pdf")
    # --ocr auto: the drawing was OCR'd (and gave nothing); nothing says auto would OCR it.
    auto = warnings_of(path, RenderPdf(ocr_fallback=True), OcrPage("rapidocr"))
    assert auto == ["d.pdf: 1 page empty after OCR (page 3)"]
    # --ocr text: the drawing had no text layer and no OCR ran, so auto would OCR it.
    text = warnings_of(path, RenderPdf(), None)
    assert text == ["d.pdf: 1 page without a text layer (page 3); --ocr auto would OCR them"]
    # Page 2 (its text layer held only its page number) is in neither.
