"""RenderPdf on the shipped real PDFs: page order, text layer and images as PyMuPDF gives them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest

import rayorch as ro
from rayorch.pipelines.document.render import TEXT_FLAGS
from rayorch.pipelines.pdf import RenderPdf, find_pdfs
from rayorch.testing import shared_share, text_words

pymupdf: Any = pytest.importorskip("pymupdf")  # the [pdf] extra

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pdfs"
SAMPLES = find_pdfs(EXAMPLES)


def test_examples_are_shipped_with_varied_lengths() -> None:
    counts = []
    for path in SAMPLES:
        with pymupdf.open(path) as doc:
            counts.append(doc.page_count)
    assert 6 <= len(SAMPLES) <= 10
    assert min(counts) == 1 and max(counts) >= 100
    assert sum(Path(p).stat().st_size for p in SAMPLES) < 3_000_000


def test_text_pages_become_markdown_with_pymupdfs_words() -> None:
    results = RenderPdf()(SAMPLES)
    assert len(results) == len(SAMPLES)
    for path, result in zip(SAMPLES, results):
        assert not isinstance(result, ro.RecordFailure), result
        pages, meta = result
        assert pages == []  # born-digital PDFs: nothing travels to an OCR actor
        with pymupdf.open(path) as doc:
            assert {k: meta[k] for k in ("path", "page_count")} == {
                "path": path, "page_count": doc.page_count}
            records = meta["pages"]
            assert [r["page"] for r in records] == list(range(1, doc.page_count + 1))
            assert {r["engine"] for r in records} <= {"text", "blank"}
            expected = text_words("\n".join(page.get_text(flags=TEXT_FLAGS) for page in doc))
        # The title is the document's "#" (page 1's title lines are not repeated on the page).
        got = text_words("\n".join([meta["title"], *(r["markdown"] for r in records)]))
        # Same words as PyMuPDF's text: only page numbers and hyphenated halves differ.
        recall, precision = shared_share(expected, got)
        assert recall >= 0.97 and precision >= 0.97, (path, recall, precision)
        assert meta["title"].strip()


def test_every_page_is_rendered_for_an_image_engine() -> None:
    path = SAMPLES[0]
    pages, meta = RenderPdf(needs_image=True, dpi=20).render(path)
    with pymupdf.open(path) as doc:
        assert [p["page"] for p in pages] == list(range(1, doc.page_count + 1))
        assert [p["text"] for p in pages] == [page.get_text() for page in doc]
        assert [(p["width"], p["height"]) for p in pages] == [
            (page.rect.width, page.rect.height) for page in doc
        ]
    assert all(p["png"] for p in pages)
    assert all(r["engine"] is None for r in meta["pages"])


def test_pages_and_metadata_are_msgpack_values() -> None:
    pages, meta = RenderPdf(needs_image=True).render(EXAMPLES / "phonrule-doc.pdf")
    assert msgpack.unpackb(msgpack.packb([pages, meta])) == [pages, meta]


def test_titles_skip_junk_metadata() -> None:
    _, meta = RenderPdf().render(EXAMPLES / "qtree-qarrows.pdf")
    # The metadata title is a .dvi path; page 1's largest line is the real title.
    assert meta["title"] == "Examples: Drawing arrows on qtree trees"


@pytest.mark.parametrize("grayscale", [True, False])
def test_images_are_rendered_at_the_requested_dpi(grayscale: bool) -> None:
    render = RenderPdf(needs_image=True, dpi=72, grayscale=grayscale)
    pages, _ = render.render(EXAMPLES / "poemscol-cheatsheet.pdf")
    for page in pages:
        pixmap = pymupdf.Pixmap(page["png"])
        assert (pixmap.width, pixmap.height) == (round(page["width"]), round(page["height"]))
        assert pixmap.n == (1 if grayscale else 3)
        assert page["dpi"] == 72


def test_find_pdfs_lists_a_directory_sorted_and_rejects_missing(tmp_path: Path) -> None:
    assert sorted(SAMPLES) == SAMPLES
    assert find_pdfs(SAMPLES[0]) == [SAMPLES[0]]
    with pytest.raises(ro.RayorchError, match="does not exist"):
        find_pdfs(tmp_path / "nothing-here")


def test_invalid_render_options_are_refused() -> None:
    with pytest.raises(ro.RayorchError, match="dpi"):
        RenderPdf(dpi=0)
