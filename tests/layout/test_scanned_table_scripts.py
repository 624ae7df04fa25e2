"""A scanned table's superscripts and subscripts: `--ocr layout`'s recognition step reads the
small raised ``²`` of ``km²`` as ``²`` (the recogniser alone answers ``2``), a digit set
small and low as a subscript, and leaves the table's plain digits alone.

    python -m pytest -m layout tests/layout/test_scanned_table_scripts.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rapid_table")
pytest.importorskip("rapidocr_onnxruntime")
pymupdf = pytest.importorskip("pymupdf")

from bench.region_quality import markdown_tables  # noqa: E402
from bench.table_set import scan_copy  # noqa: E402
from rayorch.pipelines.document.layout import open_png, pixel_box, region_item  # noqa: E402
from rayorch.pipelines.document.recognise import RecogniseRegion  # noqa: E402
from rayorch.pipelines.document.region_render import RenderLayoutPages  # noqa: E402
from rayorch.pipelines.document.scripts import SCRIPTS  # noqa: E402

pytestmark = [pytest.mark.layout, pytest.mark.timeout(600)]

SIZE = 9.0
LEFT, TOP, ROW, COLUMNS = 60.0, 80.0, 16.0, (60.0, 170.0, 280.0)
# Each cell: its runs of (text, shift) where shift is "" (on the line), "sup" or "sub".
ROWS: list[list[list[tuple[str, str]]]] = [
    [[("Region", "")], [("Area (km²)", "")], [("Volume (m", ""), ("3", "sup"), (")", "")]],
    [[("North", "")], [("9,804 km²", "")], [("125 m", ""), ("3", "sup")]],
    [[("South", "")], [("7,236 km²", "")], [("2,250 m", ""), ("3", "sup")]],
    [[("East", "")], [("3,512", "")], [("CO", ""), ("2", "sub"), (" 48", "")]],
    [[("West", "")], [("6,102 km²", "")], [("812", "")]],
]
EXPECTED = [["Region", "Area (km²)", "Volume (m³)"], ["North", "9,804 km²", "125 m³"],
            ["South", "7,236 km²", "2,250 m³"], ["East", "3,512", "CO₂ 48"],
            ["West", "6,102 km²", "812"]]


def _draw(path: Path) -> list[float]:
    """The table drawn as a typesetter sets scripts: a smaller digit, raised or lowered
    (and the font's own ``²``); returns its box in points."""
    doc = pymupdf.open()
    page = doc.new_page(width=400, height=240)
    for r, row in enumerate(ROWS):
        y = TOP + r * ROW
        for c, runs in enumerate(row):
            x = COLUMNS[c]
            for text, shift in runs:
                size = SIZE * (0.62 if shift else 1.0)
                rise = {"": 0.0, "sup": -0.38 * SIZE, "sub": 0.18 * SIZE}[shift]
                font = "hebo" if r == 0 else "helv"
                page.insert_text((x, y + rise), text, fontname=font, fontsize=size)
                x += pymupdf.get_text_length(text, font, size)
    doc.save(path)
    doc.close()
    return [LEFT - 6, TOP - ROW, 360.0, TOP + len(ROWS) * ROW - 6]


def _cells(block: dict[str, Any]) -> list[list[str]]:
    """The block's table, its cells without spaces (OCR drops the one in ``9,804 km²``)."""
    [table] = markdown_tables(block["table"].get("markdown") or block["table"]["html"])
    return [["".join(cell.split()) for cell in row] for row in table]


@pytest.fixture(scope="module")
def recognise() -> RecogniseRegion:
    return RecogniseRegion()


def test_a_scanned_tables_superscripts_and_subscripts_come_out_as_such(
        recognise: RecogniseRegion, tmp_path: Path) -> None:
    """The 150-dpi scan's table region, cut as the job cuts it, reads ``km²``, ``m³`` and
    ``CO₂``; its other digits stay plain."""
    born, scan = tmp_path / "table.pdf", tmp_path / "scan.pdf"
    box = _draw(born)
    scan_copy(born, scan)
    [(items, _, _)] = RenderLayoutPages()([str(scan)])
    page = items[0]
    assert page.get("layer") != "usable"  # a scan: no text layer to read instead
    image = open_png(page["png"])
    frac = (box[0] / page["width_pt"], box[1] / page["height_pt"],
            box[2] / page["width_pt"], box[3] / page["height_pt"])
    region = region_item(page, 0, "table", 1.0, frac, image.crop(pixel_box(image, frac)), [])
    [block] = recognise([region])
    assert isinstance(block, dict), block
    assert block["fallback"] is None and block["engine"] == "ocr-grid", block
    assert _cells(block) == [["".join(cell.split()) for cell in row] for row in EXPECTED]


@pytest.mark.parametrize("seed", [1015, 1021])
def test_a_scanned_tables_plain_digits_stay_plain(recognise: RecogniseRegion, tmp_path: Path,
                                                   seed: int) -> None:
    """On the table set's scans (dense numbers at 7.5 to 9.5 points, touching at 150 dpi),
    every cell holds a script exactly where the truth's does: a 4 whose left half looks
    raised, the bar of a 5, a 9 against its point stay digits."""
    from bench.table_quality import block_cells
    from bench.table_set import describe, render

    born, scan = tmp_path / "page.pdf", tmp_path / "scan.pdf"
    truth = render(describe(seed), born)
    scan_copy(born, scan)
    [(items, _, _)] = RenderLayoutPages()([str(scan)])
    page = items[0]
    image = open_png(page["png"])
    scripted, wanted = [], []
    for order, table in enumerate(truth):
        x0, y0, x1, y1 = table["box"]
        frac = (x0 / page["width_pt"], y0 / page["height_pt"], x1 / page["width_pt"],
                y1 / page["height_pt"])
        region = region_item(page, order, "table", 1.0, frac,
                             image.crop(pixel_box(image, frac)), [])
        [block] = recognise([region])
        assert isinstance(block, dict) and "table" in block, block
        scripted += sorted("".join(c[4].split()) for c in block_cells(block)
                           if SCRIPTS & set(c[4]))
        wanted += sorted("".join(c[4].split()) for c in table["cells"] if SCRIPTS & set(c[4]))
    assert scripted == wanted
