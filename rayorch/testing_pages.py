"""A region-grain run anyone can make without the layout models: ``PdfPipeline.regions``
with a layout read from the PDF's own text layer (words grouped into bands of lines), for the
page viewer's tests (tests/integration/test_page_viewer.py, tests/browser)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import rayorch as ro
from rayorch.pipelines.pdf import PdfPipeline

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


class BandLayout:
    """Regions from the text layer: words grouped into bands of lines (a gap of more than
    a line's height starts a new band), in reading order, top to bottom."""

    def __call__(self, pages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        return [self.regions(page) for page in pages]

    def regions(self, page: dict[str, Any]) -> list[dict[str, Any]]:
        words = sorted(page["words"], key=lambda w: (w[1], w[0]))
        bands: list[list[Any]] = []
        for word in words:
            if bands and word[1] - max(w[3] for w in bands[-1]) < (word[3] - word[1]):
                bands[-1].append(word)
            else:
                bands.append([word])
        w, h = page["width_pt"], page["height_pt"]
        return [{"page": page["page"], "order": i, "kind": "title" if i == 0 else "text",
                 "bbox": [min(x[0] for x in band) / w, min(x[1] for x in band) / h,
                          max(x[2] for x in band) / w, max(x[3] for x in band) / h],
                 "score": 1.0, "crop": page["png"], "words": band,
                 "width_pt": w, "height_pt": h} for i, band in enumerate(bands)]


def read_band(regions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each region's words as its block's text (the text-layer engine)."""
    return [{"page": r["page"], "order": r["order"], "kind": r["kind"], "bbox": r["bbox"],
             "engine": "text-layer", "fallback": None,
             "text": " ".join(str(w[4]) for w in r["words"])} for r in regions]


class TextLayoutPipeline(PdfPipeline):
    def __init__(self) -> None:
        super().__init__("layout", replicas=1, render_replicas=1, layout_replicas=1)
        self.layout = ro.RayModule(BandLayout, batch_size=4, num_cpus=0.25)
        self.recognise = ro.RayModule(read_band, batch_size=16, num_cpus=0.25)


def write_pdf(path: Path) -> Path:
    """A two-page PDF whose middle band holds hostile markup as text."""
    from rayorch.pipelines.document.pdf_markdown import import_pymupdf

    doc = import_pymupdf().open()
    for n in range(2):
        page = doc.new_page(width=400, height=500)
        page.insert_text((40, 60), f"Report page {n + 1}", fontsize=20)
        page.insert_text((40, 200), "Revenue rose in every quarter.", fontsize=11)
        page.insert_text((40, 216), HOSTILE, fontsize=11)
        page.insert_text((40, 400), "Notes follow below.", fontsize=11)
    doc.save(path)
    return path


__all__ = ["HOSTILE", "BandLayout", "TextLayoutPipeline", "read_band", "write_pdf"]
