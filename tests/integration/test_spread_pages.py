"""``spread_pages``: a scan's page images are rendered by a pool of their own, not by the
actor that reads the document, and the document still assembles in page order, as the
same run without it does (rayorch/pipelines/document/rasterize.py; issue 42, "Huge
documents spread"). Real Ray, real PyMuPDF, real rapidocr."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from rayorch.pipelines.pdf import PdfPipeline
from rayorch.testing_scans import write_scan

pytest.importorskip("pymupdf")
pytest.importorskip("rapidocr_onnxruntime")
pytestmark = [pytest.mark.integration, pytest.mark.long]

PAGES = 16


def squeeze(text: str) -> str:
    return "".join(text.split())


def run(pipeline: PdfPipeline, sources: list[str], store: str) -> tuple[Any, list[Any]]:
    handle = pipeline.run(sources, store=store, progress=False, quiet=True)
    return handle, [value for _, value in handle]


@pytest.mark.timeout(600)
def test_a_scan_is_imaged_by_the_rasterizers_and_assembles_in_page_order(
        ray_local: None, redis_url: str, tmp_path: Path) -> None:
    scan = tmp_path / "scan.pdf"
    texts = write_scan(scan, PAGES)
    born = Path(__file__).resolve().parents[2] / "examples" / "pdfs" / "qtree-qarrows.pdf"
    sources = [str(scan), str(born)]
    spread, (doc, digital) = run(
        PdfPipeline("auto", spread_pages=True, render_replicas=2, replicas=2, batch_size=4),
        sources, f"{redis_url}?payload_dir={tmp_path / 'payloads'}")  # values as segments
    calls = spread.stats.calls
    # Every scanned page went through a rasterizer; none of the born-digital one did.
    assert calls["rasterize"].done == PAGES
    # The render actor carried no page image: the rasterizers wrote the PNG bytes (values
    # leave a durable store's facts for payload segments, counted per Call).
    assert calls["rasterize"].payload_bytes > 20 * max(1, calls["render"].payload_bytes)
    sections = re.split(r"<!-- page \d+ engine=\w+ -->", doc["markdown"])[1:]
    assert doc["page_engines"] == ["rapidocr"] * PAGES
    assert [squeeze(s) for s in sections] == [squeeze(t) for t in texts]  # in page order
    assert digital["page_engines"] == ["text"]
    # The same run without spreading gives the same documents.
    plain, (same_doc, same_digital) = run(
        PdfPipeline("auto", render_replicas=2, replicas=2, batch_size=4), sources,
        "memory://plain")
    assert "rasterize" not in plain.stats.calls
    assert same_doc["markdown"] == doc["markdown"]
    assert same_digital["markdown"] == digital["markdown"]
