"""`--ocr layout`'s real models (from their wheels, on the CPU) on a generated page and on its
scanned copy: the layout finds the title, the table and the figure, the table's cells come
back in place, the scan's text comes from OCR, and a bad page or region fails alone.

    bash scripts/test_layout.sh        # or: python -m pytest -m layout tests/layout
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rapid_layout")
pytest.importorskip("rapid_table")
pytest.importorskip("rapidocr_onnxruntime")
pymupdf = pytest.importorskip("pymupdf")

from bench.markdown_quality import norm  # noqa: E402
from bench.region_quality import cells_in_place, markdown_tables  # noqa: E402
from bench.region_set import labels, one_page, render, scan_copy  # noqa: E402
from rayorch import RecordFailure  # noqa: E402
from rayorch.pipelines.document.layout import DROPPED_KINDS, DetectLayout  # noqa: E402
from rayorch.pipelines.document.recognise import RecogniseRegion  # noqa: E402
from rayorch.pipelines.document.region_render import RenderLayoutPages  # noqa: E402
from rayorch.testing import word_recall  # noqa: E402

pytestmark = [pytest.mark.layout, pytest.mark.timeout(900)]
CORPORA = ("born-digital", "scanned")


def page_item(path: Path) -> dict[str, Any]:
    """Page 1 of ``path`` as the job renders it for layout (the page item)."""
    [(items, _, _)] = RenderLayoutPages()([str(path)])
    return dict(items[0])


@pytest.fixture(scope="module")
def models() -> tuple[DetectLayout, RecogniseRegion]:
    return DetectLayout(), RecogniseRegion()


@pytest.fixture(scope="module")
def page_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The generated page, its scanned copy (150 dpi, no text layer) and its labels."""
    directory = tmp_path_factory.mktemp("layout")
    description = one_page()
    born, scanned = directory / "page.pdf", directory / "scan.pdf"
    render(description, born)
    scan_copy(born, scanned)
    with pymupdf.open(born) as doc:
        text = doc[0].get_text()
    return {"born-digital": born, "scanned": scanned, "labels": labels(description),
            "description": description, "text": text}


@pytest.fixture(scope="module")
def read(models: tuple[DetectLayout, RecogniseRegion], page_files: dict[str, Any]
         ) -> dict[str, tuple[list[dict[str, Any]], list[Any]]]:
    """Per corpus: the page's regions and the blocks recognised from them."""
    detect, recognise = models
    out = {}
    for corpus in CORPORA:
        [regions] = detect([page_item(page_files[corpus])])
        assert not isinstance(regions, RecordFailure), regions
        out[corpus] = (regions, recognise([r for r in regions if r["kind"] not in DROPPED_KINDS]))
    return out


def _only(blocks: list[Any], kind: str) -> dict[str, Any]:
    found = [b for b in blocks if isinstance(b, dict) and b["kind"] == kind]
    assert len(found) == 1, [(b["kind"], b.get("text", "")[:30]) for b in blocks]
    return found[0]


@pytest.mark.parametrize("corpus", CORPORA)
def test_layout_finds_the_title_first_then_the_table_and_the_figure(
        read: dict[str, Any], page_files: dict[str, Any], corpus: str) -> None:
    regions, blocks = read[corpus]
    kinds = [r["kind"] for r in regions]
    assert kinds[0] == "title" and "table" in kinds and "figure" in kinds, kinds
    assert kinds.index("table") < kinds.index("figure")  # reading order: the page's order
    assert [r["order"] for r in regions] == list(range(len(regions)))
    title = _only(blocks, "title")
    assert norm(title["text"]) == norm(page_files["labels"]["title"])
    assert all(0.0 <= v <= 1.0 for r in regions for v in r["bbox"])


@pytest.mark.parametrize("corpus", CORPORA)
def test_the_tables_cells_come_back_in_place(read: dict[str, Any], page_files: dict[str, Any],
                                             corpus: str) -> None:
    _, blocks = read[corpus]
    table = _only(blocks, "table")
    # a grid whose cells' words sit closer than a column gap: its rules, with or without words
    assert table["fallback"] is None and table["engine"] == "ruled-grid", table["engine"]
    [found] = markdown_tables(table["table"].get("markdown") or table["table"]["html"])
    [label] = page_files["labels"]["tables"]
    share = cells_in_place(found, label)
    assert share >= (1.0 if corpus == "born-digital" else 0.75), (found, label)


def test_born_digital_text_is_the_text_layer_and_the_scans_is_ocr(
        read: dict[str, Any], page_files: dict[str, Any]) -> None:
    paragraphs = [v for k, v in page_files["description"]["parts"] if k == "p"]
    for corpus, engine in (("born-digital", "text-layer"), ("scanned", "rapidocr")):
        _, blocks = read[corpus]
        texts = [b for b in blocks if b["kind"] == "text"]
        assert texts and all(b["engine"] == engine for b in texts), texts
        got = "\n".join(b["text"] for b in texts)
        for paragraph in paragraphs:
            assert word_recall(paragraph, got) >= 0.9, (corpus, paragraph, got)


@pytest.mark.parametrize("corpus", CORPORA)
def test_the_figure_is_the_crop_of_the_page_image(read: dict[str, Any], corpus: str) -> None:
    from PIL import Image

    _, blocks = read[corpus]
    figure = _only(blocks, "figure")
    image = Image.open(io.BytesIO(figure["image"]))
    assert image.format == "PNG" and figure["engine"] == "crop"
    # The raster chart is 300 pt wide on the page: its crop at 144 dpi is about 600 px.
    assert 500 <= image.size[0] <= 720, image.size
    colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 3  # the bars, not a blank cut


def test_a_bad_page_or_region_fails_alone_with_its_cause(
        models: tuple[DetectLayout, RecogniseRegion], read: dict[str, Any],
        page_files: dict[str, Any]) -> None:
    detect, recognise = models
    good = page_item(page_files["born-digital"])
    broken = {**good, "page": 2, "png": b"\x89PNG\r\n\x1a\n" + b"\0" * 40}
    got = detect([broken, good, {"page": 3}])
    assert isinstance(got[0], RecordFailure) and got[0].cause.startswith("layout: page 2: ")
    assert isinstance(got[1], list) and got[1]
    assert isinstance(got[2], RecordFailure) and "lacks png" in got[2].cause
    regions, _ = read["born-digital"]
    table = next(r for r in regions if r["kind"] == "table")
    blocks = recognise([{**table, "crop": b"not an image"}, table])
    assert isinstance(blocks[0], RecordFailure)
    assert blocks[0].cause == ("recognise: page 1 region {} (table): ValueError: the page "
                               "image is not a PNG".format(table["order"]))
    assert isinstance(blocks[1], dict) and "table" in blocks[1]


def test_a_table_without_rules_is_read_from_its_words(
        models: tuple[DetectLayout, RecogniseRegion], tmp_path: Path) -> None:
    """No rules to read: the words' positions give the cells, on the born-digital page and
    on its scan."""
    _, recognise = models
    rows = [["Name", "Pages", "Seconds"], ["north", "120", "45"], ["south", "98", "39"],
            ["east", "143", "52"], ["west", "77", "28"]]
    html = "<table>" + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>"
                               for row in rows) + "</table>"
    path = tmp_path / "plain.pdf"
    story = pymupdf.Story(html=html)
    writer = pymupdf.DocumentWriter(str(path))
    device = writer.begin_page(pymupdf.Rect(0, 0, 300, 200))
    story.place(pymupdf.Rect(20, 20, 280, 180))
    story.draw(device)
    writer.end_page()
    writer.close()
    item = page_item(path)
    with pymupdf.open(path) as doc:
        words = [w for w in item["words"]]
        x0 = min(w[0] for w in words) - 4
        y0 = min(w[1] for w in words) - 4
        x1 = max(w[2] for w in words) + 4
        y1 = max(w[3] for w in words) + 4
        box = [x0 / 300, y0 / 200, x1 / 300, y1 / 200]
        clip = pymupdf.Rect(x0, y0, x1, y1)
        crop = doc[0].get_pixmap(dpi=144, clip=clip).tobytes("png")
    region = {"page": 1, "order": 0, "kind": "table", "bbox": box, "score": 1.0, "crop": crop,
              "words": words, "width_pt": 300.0, "height_pt": 200.0}
    [block] = recognise([region])
    assert isinstance(block, dict), block
    assert block["fallback"] is None and block["engine"] == "text-grid", block
    [found] = markdown_tables(block["table"].get("markdown") or block["table"]["html"])
    assert cells_in_place(found, rows) == 1.0, found
    # the same crop with no words (a scan): the OCR lines, cut into words at their ink's
    # gaps, give the cells as the text layer's words do
    [scanned] = recognise([{**region, "words": []}])
    assert isinstance(scanned, dict), scanned
    assert scanned["fallback"] is None and scanned["engine"] == "ocr-grid", scanned
    [found] = markdown_tables(scanned["table"].get("markdown") or scanned["table"]["html"])
    assert cells_in_place(found, rows) == 1.0, found
