"""Page images rendered apart from their document (``spread_pages``): the render actor defers
them, a :class:`RasterizePages` actor renders each from its source, checked against the
bytes the render actor read (rayorch/pipelines/document/rasterize.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rayorch import RecordFailure
from rayorch.pipelines.document.rasterize import RasterizePages
from rayorch.pipelines.document.region_render import RenderLayoutPages
from rayorch.pipelines.document.render import RenderPdf

pymupdf = pytest.importorskip("pymupdf")  # the [pdf] extra
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pdfs"
SAMPLE = EXAMPLES / "poemscol-cheatsheet.pdf"


def test_deferred_pages_carry_no_image_and_rasterize_to_the_same_png() -> None:
    inline, meta = RenderPdf(needs_image=True, dpi=72).render(SAMPLE)
    deferred, deferred_meta = RenderPdf(needs_image=True, dpi=72, defer_images=True).render(SAMPLE)
    assert deferred_meta == meta
    assert all("png" not in p and p["source"] == str(SAMPLE) and p["sha256"] == meta["sha256"]
               for p in deferred)
    rendered = RasterizePages(dpi=72)(list(reversed(deferred)))  # any order, any batch
    assert [p["png"] for p in reversed(rendered)] == [p["png"] for p in inline]
    assert [{k: v for k, v in p.items() if k not in ("source", "sha256")}
            for p in reversed(rendered)] == inline


def test_region_pages_defer_their_image_too() -> None:
    [(inline, numbers, meta)] = RenderLayoutPages()([str(SAMPLE)])
    [(deferred, deferred_numbers, deferred_meta)] = RenderLayoutPages(defer_images=True)(
        [str(SAMPLE)])
    assert (deferred_numbers, deferred_meta) == (numbers, meta)
    assert all("png" not in p for p in deferred)
    rendered = RasterizePages(dpi=144, grayscale=False)(deferred)
    assert [p["png"] for p in rendered] == [p["png"] for p in inline]


def test_a_source_changed_after_render_fails_its_pages_alone(tmp_path: Path) -> None:
    path = tmp_path / "doc.pdf"
    shutil.copy(SAMPLE, path)
    pages, _ = RenderPdf(needs_image=True, defer_images=True).render(path)
    other = tmp_path / "other.pdf"
    shutil.copy(EXAMPLES / "qtree-qarrows.pdf", other)
    good = RenderPdf(needs_image=True, defer_images=True).render(other)[0][0]
    shutil.copy(EXAMPLES / "qtree-qarrows.pdf", path)  # rewritten under the same name
    out = RasterizePages()([pages[0], good, {"page": 1}, "junk", {**good, "page": 99}])
    assert isinstance(out[0], RecordFailure) and "changed after it was rendered" in str(out[0])
    assert out[1]["png"].startswith(b"\x89PNG")  # the other document's page still renders
    assert all(isinstance(o, RecordFailure) for o in out[2:])
    assert "expected a deferred page item" in str(out[2])
    assert "has no page 99" in str(out[4])


def test_a_rasterizer_keeps_few_documents_open() -> None:
    raster = RasterizePages(open_documents=1)
    for path in (SAMPLE, EXAMPLES / "qtree-qarrows.pdf", SAMPLE):
        pages, _ = RenderPdf(needs_image=True, defer_images=True).render(path)
        assert all(isinstance(p, dict) for p in raster(pages))
        assert len(raster._open) == 1
    raster.close()
    assert not raster._open


def test_invalid_rasterizer_options_are_refused() -> None:
    from rayorch import RayorchError

    with pytest.raises(RayorchError, match="must be positive"):
        RasterizePages(dpi=0)
    assert pymupdf.Pixmap(RasterizePages(dpi=36)(
        RenderPdf(needs_image=True, defer_images=True).render(SAMPLE)[0])[0]["png"]).width > 0
