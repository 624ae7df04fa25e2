"""Bad input becomes a RecordFailure for that document only, with a one-line, clear cause.

The bad files are generated here (never shipped): corrupt, truncated, encrypted, zero
pages, non-PDF, empty, absurd page sizes, missing.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

import rayorch as ro
from rayorch.pipelines.document.render import MAX_PAGE_SIDE_PT
from rayorch.pipelines.pdf import RenderPdf, failure_kind

pymupdf: Any = pytest.importorskip("pymupdf")  # the [pdf] extra

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pdfs"
GOOD = EXAMPLES / "gb4e-doc.pdf"


def zero_page_pdf() -> bytes:
    """A well-formed PDF (valid xref and trailer) whose page tree has no pages."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [] /Count 0 >>"]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1, xref
    )
    return bytes(out)


def one_page_pdf(path: Path, width: float, height: float) -> Path:
    doc = pymupdf.open()
    page = doc.new_page(width=width, height=height)
    page.insert_text((2, min(height, 40.0) - 1), "x", fontsize=1)
    doc.save(path)
    return path


@pytest.fixture
def bad_pdfs(tmp_path: Path) -> dict[str, Path]:
    """Expected failure kind -> a generated file of that kind."""
    good = GOOD.read_bytes()
    files: dict[str, Path] = {}

    def write(kind: str, name: str, data: bytes) -> None:
        files[kind] = tmp_path / name
        files[kind].write_bytes(data)

    write("truncated", "truncated.pdf", good[: len(good) // 2])
    corrupt = bytearray(good)
    rng = random.Random(7)
    for i in range(len(good) // 4, len(good) // 2, 53):  # header, xref and %%EOF stay intact
        corrupt[i] = rng.randrange(256)
    write("damaged", "corrupt.pdf", bytes(corrupt))
    write("not a PDF", "notes.pdf", b"this is plain text, not a PDF\n" * 40)
    write("empty", "empty.pdf", b"")
    write("no pages", "zero-pages.pdf", zero_page_pdf())
    encrypted = pymupdf.open(GOOD)
    encrypted.save(
        tmp_path / "encrypted.pdf",
        encryption=pymupdf.PDF_ENCRYPT_AES_256,
        user_pw="secret",
        owner_pw="owner-secret",
    )
    files["encrypted"] = tmp_path / "encrypted.pdf"
    files["page size"] = one_page_pdf(tmp_path / "huge.pdf", 1e6, 1e6)
    files["missing"] = tmp_path / "does-not-exist.pdf"
    files["not a file"] = tmp_path
    return files


def test_each_bad_input_fails_alone_with_its_kind(bad_pdfs: dict[str, Path]) -> None:
    kinds = list(bad_pdfs)
    batch = [str(GOOD)] + [str(bad_pdfs[k]) for k in kinds] + [str(GOOD)]
    results = RenderPdf()(batch)

    assert len(results) == len(batch)
    for good in (results[0], results[-1]):
        assert not isinstance(good, ro.RecordFailure), good
        pages, meta = good
        assert meta["page_count"] == len(meta["pages"]) == 9 and pages == []
    for kind, result in zip(kinds, results[1:-1]):
        assert isinstance(result, ro.RecordFailure), f"{kind}: no failure for {bad_pdfs[kind]}"
        assert failure_kind(result.cause) == kind, result.cause
        assert "\n" not in result.cause
        assert str(bad_pdfs[kind]) in result.cause


def test_causes_say_what_to_do(bad_pdfs: dict[str, Path]) -> None:
    render = RenderPdf()
    [encrypted] = render([str(bad_pdfs["encrypted"])])
    assert isinstance(encrypted, ro.RecordFailure)
    assert "password" in encrypted.cause and "decrypt" in encrypted.cause
    [huge] = render([str(bad_pdfs["page size"])])
    assert isinstance(huge, ro.RecordFailure)
    assert "1e+06 x 1e+06 pt" in huge.cause and f"{MAX_PAGE_SIDE_PT:g}" in huge.cause


def test_tiny_page_is_refused(tmp_path: Path) -> None:
    [result] = RenderPdf()([str(one_page_pdf(tmp_path / "tiny.pdf", 1, 1))])
    assert isinstance(result, ro.RecordFailure)
    assert failure_kind(result.cause) == "page size"


def test_non_path_input_is_a_record_failure() -> None:
    [result] = RenderPdf()([None])
    assert isinstance(result, ro.RecordFailure)
    assert failure_kind(result.cause) == "bad input"


def test_max_pages_guard() -> None:
    [result] = RenderPdf(max_pages=5)([str(GOOD)])
    assert isinstance(result, ro.RecordFailure)
    assert result.cause.startswith("too many pages:") and "max_pages=5" in result.cause


def wrong_xref_pdf(path: Path) -> Path:
    """A real PDF whose ``startxref`` offset is wrong: MuPDF must repair it to read it."""
    data = GOOD.read_bytes()
    at = data.rindex(b"startxref")
    path.write_bytes(data[:at] + b"startxref\n12\n%%EOF\n")
    return path


def test_repaired_file_is_refused_unless_allowed(tmp_path: Path) -> None:
    path = str(wrong_xref_pdf(tmp_path / "wrong-xref.pdf"))
    [refused] = RenderPdf()([path])
    assert isinstance(refused, ro.RecordFailure)
    assert failure_kind(refused.cause) == "damaged" and "repair" in refused.cause
    [accepted] = RenderPdf(allow_damaged=True)([path])
    assert not isinstance(accepted, ro.RecordFailure), accepted
    pages, meta = accepted
    assert len(meta["pages"]) == meta["page_count"] == 9 and pages == []


def test_large_legal_page_is_rendered_under_the_pixel_cap(tmp_path: Path) -> None:
    path = one_page_pdf(tmp_path / "poster.pdf", MAX_PAGE_SIDE_PT, MAX_PAGE_SIDE_PT / 2)
    cap = 1_000_000
    [result] = RenderPdf(needs_image=True, dpi=300, max_page_pixels=cap)([str(path)])
    assert not isinstance(result, ro.RecordFailure), result
    [page] = result[0]
    pixmap = pymupdf.Pixmap(page["png"])
    assert pixmap.width * pixmap.height <= cap
    assert page["dpi"] < 300
