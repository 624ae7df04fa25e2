"""Born-digital tables from their words (``text_table``), on PDFs PyMuPDF draws cell by cell:
ruled, unruled, zebra and booktabs tables, a two-level header with spanning cells, labels
that wrap over two lines, numeric columns with units, notes under the table. The words are
the page's text layer inside the table's box, as the layout step hands them over; the truth
comes from the drawing, never from the PDF. Scored as ICDAR 2013's adjacency relations
(``bench/table_quality.py``): every relation must come back, and no other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pymupdf = pytest.importorskip("pymupdf")

from bench.table_quality import html_cells, markdown_cells, relations  # noqa: E402
from bench.table_set import draw_table, table_cells  # noqa: E402
from rayorch.pipelines.document.region_assemble import block_markdown, content_entry  # noqa: E402
from rayorch.pipelines.document.table_structure import (  # noqa: E402
    TableStructureError,
    table_content,
)
from rayorch.pipelines.document.text_table import text_table  # noqa: E402

BODY = [["North", "1,204 kg", "12.5 %", "310"], ["South", "998", "9.1 %", "1,020 t"],
        ["East", "87 kg", "0.4", "55"], ["West", "2,310.7 kg", "18.0 %", "7 t"],
        ["Central", "640", "3.3 %", "412 t"]]
HEADER = [["Region", "Mass (kg)", "Share (%)", "Freight (t)"]]
SPANNING = [["Region", "Group A", "", "Other"], ["", "Mass (kg)", "Share (%)", "Freight (t)"]]
LONG = ["Northern coastal districts", "Southern upland municipalities",
        "Eastern metropolitan area", "Western rural counties", "Central river valley towns"]
NOTES = ["Note: figures are provisional and rounded.",
         "Source: national statistical office, annual survey."]


def table(style: str, *, spanning: bool = False, wrap: bool = False, notes: bool = False
          ) -> dict[str, Any]:
    body = [[LONG[i], *row[1:]] for i, row in enumerate(BODY)] if wrap else BODY
    return {"style": style, "header": SPANNING if spanning else HEADER, "body": body,
            "spanning": spanning, "wrap": wrap, "notes": NOTES if notes else []}


def page_words(tmp_path: Path, described: dict[str, Any]) -> list[list[Any]]:
    """Draw the table on a page with a paragraph above and below; the words inside its box."""
    path = tmp_path / "table.pdf"
    with pymupdf.open() as doc:
        page = doc.new_page(width=612, height=792)
        page.insert_text((72, 90), "A paragraph above the table, no part of it.", fontsize=10)
        box, bottom = draw_table(page, described, 120.0)
        page.insert_text((72, bottom + 40), "A paragraph under the table.", fontsize=10)
        doc.save(path)
    with pymupdf.open(path) as doc:
        words = doc[0].get_text("words", clip=pymupdf.Rect(box))
    return [list(w[:5]) for w in words]


def cells_of(rows: Any, texts: list[str]) -> list[list[Any]]:
    content = table_content(rows, texts)
    return html_cells(content["html"]) if "html" in content else markdown_cells(
        content["markdown"])


@pytest.mark.parametrize("style", ["ruled", "unruled", "zebra", "booktabs"])
def test_every_cell_comes_back_in_place_whatever_the_style(tmp_path: Path, style: str) -> None:
    described = table(style)
    rows, texts, notes = text_table(page_words(tmp_path, described))
    assert relations(cells_of(rows, texts)) == relations(table_cells(described))
    assert notes == "" and len(rows) == 6 and all(len(row) == 4 for row in rows)


def test_a_two_level_header_spans_columns_and_rows(tmp_path: Path) -> None:
    described = table("unruled", spanning=True)
    rows, texts, _ = text_table(page_words(tmp_path, described))
    content = table_content(rows, texts)
    assert '<td rowspan="2">Region</td><td colspan="2">Group A</td>' in content["html"]
    assert "<td>Mass (kg)</td><td>Share (%)</td><td>Freight (t)</td>" in content["html"]
    assert relations(html_cells(content["html"])) == relations(table_cells(described))


@pytest.mark.parametrize(("style", "top"), [("unruled", False), ("ruled", False),
                                            ("unruled", True)])
def test_a_label_over_two_lines_is_one_cell_and_its_row_keeps_its_values(
        tmp_path: Path, style: str, top: bool) -> None:
    described = {**table(style, wrap=True), "top": top}  # values by the label's middle or top
    rows, texts, _ = text_table(page_words(tmp_path, described))
    assert "Southern upland municipalities" in texts
    assert len(rows) == 6, texts
    assert relations(cells_of(rows, texts)) == relations(table_cells(described))


def test_notes_under_the_table_stay_out_of_it_and_come_back_apart(tmp_path: Path) -> None:
    described = table("booktabs", notes=True)
    rows, texts, notes = text_table(page_words(tmp_path, described))
    assert notes == " ".join(NOTES)
    assert not any("provisional" in t or "Source" in t for t in texts)
    assert relations(cells_of(rows, texts)) == relations(table_cells(described))
    block = {"page": 1, "order": 0, "kind": "table", "bbox": [0, 0, 1, 1],
             "engine": "text-grid", "fallback": None,
             "table": {**table_content(rows, texts), "notes": notes}}
    entry = content_entry(block, None, 1)
    assert entry is not None and entry["table_footnote"] == [" ".join(NOTES)]
    assert "provisional" not in entry["table_body"]
    assert block_markdown(block, None, "#").endswith("\n\n" + " ".join(NOTES))


def test_a_wide_line_under_the_table_is_a_note_though_no_marker_says_so(tmp_path: Path
                                                                        ) -> None:
    note = "Figures are provisional and rounded to units."  # wider than a column
    described = {**table("unruled"), "notes": [note]}
    rows, texts, notes = text_table(page_words(tmp_path, described))
    assert notes == note and len(rows) == 6
    assert relations(cells_of(rows, texts)) == relations(table_cells(described))


def test_headers_set_close_together_are_parted_where_the_columns_text_starts(
        tmp_path: Path) -> None:
    """An HTML table as PyMuPDF's Story lays it out: cells left-aligned, a word space apart."""
    rows = [["Name", "Pages", "Seconds"], ["north", "120", "45"], ["south", "98", "39"],
            ["east", "143", "52"], ["west", "77", "28"]]
    path = tmp_path / "story.pdf"
    writer = pymupdf.DocumentWriter(str(path))
    device = writer.begin_page(pymupdf.Rect(0, 0, 300, 200))
    story = pymupdf.Story(html="<table>" + "".join(
        "<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows) + "</table>")
    story.place(pymupdf.Rect(20, 20, 280, 180))
    story.draw(device)
    writer.end_page()
    writer.close()
    with pymupdf.open(path) as doc:
        words = [list(w[:5]) for w in doc[0].get_text("words")]
    found, texts, _ = text_table(words)
    assert texts == [c for row in rows for c in row] and len(found) == 5


def test_words_that_are_no_table_are_refused() -> None:
    paragraph = [[72 + 40 * i, 100 + 12 * line, 72 + 40 * i + 36, 110 + 12 * line, "word"]
                 for line in range(4) for i in range(10)]
    with pytest.raises(TableStructureError):
        text_table(paragraph)  # words set a word space apart: no gap between columns
    with pytest.raises(TableStructureError):
        text_table([[72, 100, 100, 110, "alone"], [200, 100, 230, 110, "line"]])


@pytest.mark.parametrize("style", ["booktabs", "ruled"])
def test_a_label_over_two_lines_keeps_its_column_when_its_words_are_short(
        tmp_path: Path, style: str) -> None:
    """A scan's words are as tall as their ink, not their font: the values, set at the row's
    middle, then share no line with the label's two lines, and only the labels' own lines
    show where the first column ends (it is wider than its header, ``Region``)."""
    described = table(style, wrap=True)
    words = [[x0, (y0 + y1) / 2 - 0.35 * (y1 - y0), x1, (y0 + y1) / 2 + 0.35 * (y1 - y0), text]
             for x0, y0, x1, y1, text in page_words(tmp_path, described)]
    rows, texts, _ = text_table(words)
    assert "Southern upland municipalities" in texts, texts
    assert relations(cells_of(rows, texts)) == relations(table_cells(described))


def test_the_first_row_of_values_set_close_under_the_header_is_a_row_of_its_own(
        tmp_path: Path) -> None:
    """A header whose first cell spans both header rows leaves the first column empty in the
    second; values set closer under it than rows sit to each other fill that column and add
    to the others, yet numbers under words are a new row, not more header text."""
    described = table("unruled", spanning=True)
    words = page_words(tmp_path, described)
    header = max(w[3] for w in words if w[4] in ("Mass", "(kg)"))
    body = min(w[1] for w in words if w[1] > header)
    lift = (body - header) * 0.8  # the gap under the header a fifth of what it was
    words = [[x0, y0 - lift, x1, y1 - lift, t] if y0 > header else [x0, y0, x1, y1, t]
             for x0, y0, x1, y1, t in words]
    rows, texts, _ = text_table(words)
    assert "North" in texts and "1,204 kg" in texts, texts
    assert relations(cells_of(rows, texts)) == relations(table_cells(described))
