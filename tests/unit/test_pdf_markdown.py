"""Markdown from a PDF's text layer, and which pages ``--ocr auto`` sends to OCR (no Ray).

The PDFs are written here with PyMuPDF (real fonts, real text layers, a real page
image), so the structures come from the same ``get_text("dict")`` as on any corpus.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from rayorch.pipelines.document.pdf_markdown import normalise_ligatures, text_layer_quality
from rayorch.pipelines.pdf import AssembleDocument, RenderPdf

pymupdf: Any = pytest.importorskip("pymupdf")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pdfs"
BODY = [
    "Lineage keeps every page of every document in its place, whatever",
    "the order in which the OCR actors finish their batches; a hyphen-",
    "ation at the end of a line is joined again when the text is read.",
    "Hyphenation is undone for the words that the document also has whole.",
]


def structured_pdf(path: Path) -> Path:
    """Two pages: a heading, a paragraph, a bullet list, a bold line, page numbers."""
    doc = pymupdf.open()
    for number in (1, 2):
        page = doc.new_page(width=595, height=842)
        page.insert_text((72, 90), f"Chapter {number}: Lineage", fontsize=20, fontname="hebo")
        y = 130.0
        for line in BODY:
            page.insert_text((72, y), line, fontsize=10, fontname="helv")
            y += 13
        y += 20
        page.insert_text((72, y), "Bold Side Note", fontsize=10, fontname="hebo")
        y += 26
        for item in ("first item of the list", "second item of the list"):
            page.insert_text((80, y), "\u2022", fontsize=10, fontname="helv")
            page.insert_text((92, y), item, fontsize=10, fontname="helv")
            y += 20
        page.insert_text((290, 800), str(number), fontsize=10, fontname="helv")
    doc.save(path)
    return path


def image_only_pdf(path: Path) -> Path:
    """A scan: page 1 of a real PDF rendered to pixels, as an image-only page; then a blank."""
    with pymupdf.open(EXAMPLES / "qtree-qarrows.pdf") as src:
        pixmap = src[0].get_pixmap(dpi=40, colorspace=pymupdf.csGRAY)
        rect = src[0].rect
    doc = pymupdf.open()
    doc.new_page(width=rect.width, height=rect.height).insert_image(rect, pixmap=pixmap)
    doc.new_page(width=rect.width, height=rect.height)
    doc.save(path)
    return path


def markdown_of(path: Path) -> str:
    [(pages, meta)] = RenderPdf(ocr_fallback=True)([str(path)])
    assert pages == []
    [doc] = AssembleDocument()([[]], [meta])
    return str(doc["markdown"])


def test_headings_lists_hyphenation_and_page_numbers(tmp_path: Path) -> None:
    markdown = markdown_of(structured_pdf(tmp_path / "structured.pdf"))
    # No metadata title: page 1's largest line is the document's "#", and only that.
    assert markdown.startswith("# Chapter 1: Lineage\n") and "## Chapter 1" not in markdown
    assert "## Chapter 2: Lineage" in markdown
    assert "#### Bold Side Note" in markdown
    assert re.search(r"\n- first item of the list\n+- second item of the list\n", markdown)
    assert "a hyphen-" not in markdown
    assert "batches; a hyphenation at the end of a line is joined" in markdown
    lines = markdown.splitlines()
    assert "1" not in lines and "2" not in lines  # running page numbers dropped
    assert lines.count("<!-- page 1 engine=text -->") == 1


def test_ligatures_are_letters_and_garbage_layers_are_recognised() -> None:
    assert normalise_ligatures("\ufb01nd the \ufb00ect of \ufb04ow") == "find the ffect of fflow"
    assert text_layer_quality("A real sentence, with words.") == "usable"
    assert text_layer_quality(" \n\t ") == "empty"
    assert text_layer_quality("\ufffd\ufffd\ufffd\ufffd ab") == "garbage"
    assert text_layer_quality("\ue001\ue002\ue003 x") == "garbage"  # private use area
    assert text_layer_quality("mostly fine text \ufffd") == "usable"


def test_auto_sends_only_pages_with_ink_and_no_text_to_ocr(tmp_path: Path) -> None:
    path = image_only_pdf(tmp_path / "scan.pdf")
    [(pages, meta)] = RenderPdf(ocr_fallback=True)([str(path)])
    assert [p["page"] for p in pages] == [1] and pages[0]["png"].startswith(b"\x89PNG")
    assert [(r["engine"], r["layer"]) for r in meta["pages"]] == [(None, "empty"),
                                                                  ("blank", "empty")]
    # --ocr text: no OCR; the scan is an empty page that the summary warns about.
    [(none, text_meta)] = RenderPdf()([str(path)])
    assert none == []
    [doc] = AssembleDocument()([[]], [text_meta])
    assert doc["page_engines"] == ["text", "blank"] and doc["empty_pages"] == [1]


def mixed_font_pdf(path: Path) -> Path:
    """Short lines whose first glyph is not like the rest: a bold lead-in, a large sign."""
    doc = pymupdf.open()
    page = doc.new_page(width=595, height=842)
    page.insert_text((72, 90), "Real Heading", fontsize=20, fontname="hebo")
    y = 130.0
    for _ in range(12):  # body text, so that 10 pt is the body size
        page.insert_text((72, y), BODY[0], fontsize=10, fontname="helv")
        y += 13
    y += 20
    lead = pymupdf.get_text_length("Note: ", fontname="hebo", fontsize=10)
    page.insert_text((72, y), "Note: ", fontsize=10, fontname="hebo")
    page.insert_text((72 + lead, y), "only the first word of this line is bold", fontsize=10,
                     fontname="helv")
    y += 40
    sign = pymupdf.get_text_length("+ ", fontname="helv", fontsize=24)
    page.insert_text((72, y), "+ ", fontsize=24, fontname="helv")
    page.insert_text((72 + sign, y), "a large sign, then a line of body text", fontsize=10,
                     fontname="helv")
    doc.save(path)
    return path


def test_a_line_is_sized_and_weighted_by_all_its_spans(tmp_path: Path) -> None:
    """MuPDF's fast line output carries only a line's first font; the Markdown must not."""
    markdown = markdown_of(mixed_font_pdf(tmp_path / "mixed.pdf"))
    assert markdown.startswith("# Real Heading\n")  # the title: page 1's largest line
    lines = markdown.splitlines()
    assert "Note: only the first word of this line is bold" in lines
    assert "\\+ a large sign, then a line of body text" in lines  # escaped: not a list item


def test_fast_line_reader_agrees_with_pymupdf_dict() -> None:
    """Every shipped example page: the same lines, texts, weights and blocks as the dict.

    Line boxes are MuPDF's (the dict recomputes them from font ascenders), so only their
    left and right edges are compared; the heights differ by a point or two.
    """
    from rayorch.pipelines.document.pdf_markdown import page_lines, textpage_lines
    from rayorch.pipelines.document.render import TEXT_FLAGS

    pages = lines = same = fast = 0
    for path in sorted(EXAMPLES.glob("*.pdf")):
        with pymupdf.open(path) as doc:
            for page in doc:
                textpage = page.get_textpage(flags=TEXT_FLAGS)
                ours = textpage_lines(textpage)
                theirs = page_lines(textpage.extractDICT())
                pages += 1
                if ours is None:  # a page with glyphs the dict treats apart: read by the dict
                    continue
                fast += 1
                assert [line.text for line in ours] == [line.text for line in theirs]
                lines += len(ours)
                same += sum((a.size, a.bold, a.block) == (b.size, b.bold, b.block)
                            and abs(a.x0 - b.x0) < 0.5 and abs(a.x1 - b.x1) < 0.5
                            for a, b in zip(ours, theirs))
    assert fast >= 0.95 * pages, (fast, pages)
    assert same >= 0.999 * lines, (same, lines)


def test_reading_pages_leaves_the_cycle_collector_as_it_was(tmp_path: Path) -> None:
    """The renderer pauses Python's cycle collector per document, also one it refuses."""
    import gc

    doc = pymupdf.open()
    doc.new_page(width=595, height=842).insert_text((72, 90), "fine page", fontsize=10)
    doc.new_page(width=2, height=2)  # under the PDF minimum: refused while reading pages
    doc.save(tmp_path / "tiny.pdf")
    assert gc.isenabled()
    [failure] = RenderPdf()([str(tmp_path / "tiny.pdf")])
    assert "page size" in str(failure) and gc.isenabled()
    markdown_of(structured_pdf(tmp_path / "structured.pdf"))
    assert gc.isenabled()


def test_the_renderer_does_not_load_pymupdfs_layout_model() -> None:
    """PyMuPDF imports its layout plugin (an ONNX model, ~1 s a process) when installed;
    a render actor never uses it, so it is not loaded, yet stays importable."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("pymupdf.layout") is None:
        pytest.skip("pymupdf_layout is not installed: nothing to leave out")
    code = (
        "import sys\n"
        "from rayorch.pipelines.pdf import RenderPdf\n"
        "RenderPdf()\n"
        "assert 'pymupdf' in sys.modules and 'pymupdf.layout' not in sys.modules\n"
        "import pymupdf.layout\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
