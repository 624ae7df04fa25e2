"""Which boxes of a page are tables (``table_detect``, through ``layout.page_regions``): the
tables a page's own columns of words show, merged with the layout model's detections.

No model runs here: the detections are given, as the model returns them when it misses a
table (an unruled table read as ``text``, one box around two tables); tests/layout runs the
real model on generated pages through the job.
"""

from __future__ import annotations

import pytest

from rayorch.pipelines.document.layout import page_regions
from rayorch.pipelines.document.table_detect import find_tables

PIL = pytest.importorskip("PIL")
from PIL import Image, ImageDraw  # noqa: E402

WIDTH, HEIGHT = 612.0, 792.0
COLUMNS = (72.0, 160.0, 240.0)


def _line(y: float, x: float, text: str, size: float = 9.0) -> list[list[object]]:
    """The words of ``text`` set from ``x`` on the line at ``y`` (a word space between)."""
    words = []
    for word in text.split():
        width = 0.5 * size * len(word)
        words.append([x, y, x + width, y + size, word])
        x += width + 0.25 * size
    return words


def _table(top: float, rows: list[list[str]], pitch: float = 14.0) -> list[list[object]]:
    return [w for r, row in enumerate(rows) for x, cell in zip(COLUMNS, row, strict=True)
            for w in _line(top + r * pitch, x, cell)]


ROWS = [["Region", "Area", "Income"], ["North", "3,561", "7,435"], ["South", "5,185", "919"],
        ["East", "2,673", "4,507"], ["West", "1,240", "842"]]
PARAGRAPH = "the survey covers every district of the region and reports figures for the year"
NOTE = "Note: figures are provisional and rounded to the nearest unit of the survey"


def _page(words: list[list[object]], layer: str = "usable") -> dict[str, object]:
    return {"page": 1, "png": b"", "width_pt": WIDTH, "height_pt": HEIGHT, "dpi": 144,
            "words": words, "layer": layer}


def _frac(x0: float, y0: float, x1: float, y1: float) -> tuple[float, float, float, float]:
    return (x0 / WIDTH, y0 / HEIGHT, x1 / WIDTH, y1 / HEIGHT)


def _regions(words: list[list[object]], detections: list[tuple[str, float, tuple[float, ...]]]
             ) -> list[dict[str, object]]:
    image = Image.new("L", (612, 792), 255)
    return page_regions(_page(words), detections, image)  # type: ignore[arg-type]


def _texts(region: dict[str, object]) -> list[str]:
    return [str(w[4]) for w in region["words"]]  # type: ignore[attr-defined]


def test_an_unruled_table_the_model_reads_as_text_is_a_table_its_notes_outside() -> None:
    words = [*_line(100, 72, PARAGRAPH), *_table(140, ROWS), *_line(204, 72, "Source: NSO"),
             *_line(218, 72, NOTE)]
    # The model's one text box over the table and its notes, as CDLA reads an unruled table,
    # and its paragraph's box reaching down into the table's first row.
    regions = _regions(words, [("text", 0.98, _frac(70, 136, 300, 230)),
                               ("text", 0.95, _frac(70, 98, 500, 146))])
    tables = [r for r in regions if r["kind"] == "table"]
    assert len(tables) == 1
    assert _texts(tables[0]) == [w for row in ROWS for cell in row for w in cell.split()]
    notes = [r for r in regions if "Note:" in _texts(r) or "Source:" in _texts(r)]
    assert notes and all(r["kind"] == "text" for r in notes)
    every = [w for r in regions for w in _texts(r)]
    assert sorted(every) == sorted(str(w[4]) for w in words)  # each word once


def test_one_model_box_around_two_tables_becomes_two_tables() -> None:
    second = [["Delta", "12", "7"], ["Valley", "4", "9"], ["Plains", "30", "2"]]
    words = [*_table(140, ROWS), *_table(240, second)]
    regions = _regions(words, [("table", 0.9, _frac(70, 136, 300, 290))])
    tables = [r for r in regions if r["kind"] == "table"]
    assert [_texts(t)[:1] for t in tables] == [["Region"], ["Delta"]]
    assert all(t["score"] == 0.9 for t in tables)
    assert len([w for t in tables for w in _texts(t)]) == len(words)


def test_a_table_the_model_found_stays_one_region_with_its_score() -> None:
    words = [*_line(100, 72, PARAGRAPH), *_table(140, ROWS)]
    regions = _regions(words, [("table", 0.93, _frac(70, 138, 290, 200)),
                               ("text", 0.9, _frac(70, 98, 500, 110))])
    assert [(r["kind"], r["score"]) for r in regions] == [("text", 0.9), ("table", 0.93)]
    assert _texts(regions[1])[:3] == ["Region", "Area", "Income"]


def test_running_text_in_two_columns_and_a_paragraph_are_no_table() -> None:
    left = "the survey covers every district of"
    right = "reports figures for the calendar year"
    columns = [w for r in range(8) for w in (*_line(100 + 12 * r, 72, left),
                                             *_line(100 + 12 * r, 320, right))]
    assert find_tables(columns) == []
    assert find_tables([w for r in range(8) for w in _line(100 + 12 * r, 72, PARAGRAPH)]) == []


def test_a_table_on_a_scan_is_found_in_its_ink() -> None:
    image = Image.new("L", (612, 792), 255)
    draw = ImageDraw.Draw(image)
    for r in range(6):  # six rows of three cells, each cell two words of ink
        for x in COLUMNS:
            draw.rectangle((x, 140 + 16 * r, x + 18, 148 + 16 * r), fill=0)
            draw.rectangle((x + 22, 140 + 16 * r, x + 40, 148 + 16 * r), fill=0)
    for r in range(7):  # ruled on every row and column: the rules are no words
        draw.line((68, 136 + 16 * r, 300, 136 + 16 * r), fill=0)
    for x in (68, 156, 236, 300):
        draw.line((x, 136, x, 232), fill=0)
    page = _page([], layer="none")
    regions = page_regions(page, [("figure", 0.8, _frac(68, 134, 310, 240))], image)
    assert [r["kind"] for r in regions] == ["table"]
    x0, y0, x1, y1 = regions[0]["bbox"]  # type: ignore[misc]
    assert x0 <= 72 / 612 and y0 <= 140 / 792 and x1 >= 280 / 612 and y1 >= 228 / 792


def test_header_lines_of_one_label_above_the_first_row_belong_to_the_table() -> None:
    # A group label over columns 1-2, the first column's label set between the two header
    # rows, then the second header row: only that one has two phrases.
    words = [*_line(100, 72, PARAGRAPH), *_line(130, 190, "Group A"), *_line(137, 72, "Region"),
             *_line(144, 160, "Area"), *_line(144, 240, "Income"),
             *_table(160, ROWS[1:])]
    regions = _regions(words, [("text", 0.9, _frac(70, 98, 500, 110))])
    [table] = [r for r in regions if r["kind"] == "table"]
    assert _texts(table)[:4] == ["Group", "A", "Region", "Area"]
    assert "Group" not in [w for r in regions if r is not table for w in _texts(r)]


def test_a_bulleted_list_and_a_table_of_contents_are_no_table() -> None:
    bullets = [w for r in range(5) for w in (*_line(100 + 14 * r, 72, "•"),
                                             *_line(100 + 14 * r, 84, "item of the list"))]
    assert find_tables(bullets) == []  # a column of markers, then text: a list
    contents = [w for r in range(6) for w in (*_line(100 + 14 * r, 72, f"{r + 1}.{r}"),
                                              *_line(100 + 14 * r, 110, "Section title"),
                                              *_line(100 + 14 * r, 200, ". . . . . ."),
                                              *_line(100 + 14 * r, 300, str(10 + r)))]
    assert find_tables(contents) == []  # leaders: a table of contents
