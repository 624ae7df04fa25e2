"""Recognition's pure parts: SLANet's structure tokens, cell texts, pipe table or HTML, and
the text-layer words of a region (no model runs here; tests/layout runs the real ones)."""

from __future__ import annotations

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("cv2")
from PIL import Image, ImageDraw  # noqa: E402

from rayorch.pipelines.document.recognise import (  # noqa: E402
    crop_transform,
    region_problem,
    usable_words_text,
)
from rayorch.pipelines.document.table_structure import (  # noqa: E402
    TableStructureError,
    assign_texts,
    ink_words,
    parse_structure,
    ruled_grid,
    spans,
    table_content,
)

WRAP = ["<html>", "<body>", "<table>"], ["</table>", "</body>", "</html>"]


def _tokens(*rows: list[str]) -> list[str]:
    body = [t for row in rows for t in ["<tr>", *row, "</tr>"]]
    return [*WRAP[0], "<thead>", *body[:len(rows[0]) + 2], "</thead>", "<tbody>",
            *body[len(rows[0]) + 2:], "</tbody>", *WRAP[1]]


def test_a_plain_grid_parses_to_rows_of_single_cells() -> None:
    rows = parse_structure(_tokens(["<td></td>"] * 3, ["<td></td>"] * 3))
    assert rows == [[(1, 1)] * 3, [(1, 1)] * 3]
    assert not spans(rows)


def test_spans_are_read_from_the_cell_attributes() -> None:
    spanning = ["<td", ' colspan="2"', ">", "</td>"]
    rows = parse_structure(_tokens(spanning, ["<td></td>", "<td", ' rowspan="3"', ">",
                                              "</td>"]))
    assert rows == [[(2, 1)], [(1, 1), (1, 3)]]
    assert spans(rows)


@pytest.mark.parametrize(("tokens", "why"), [
    (["<tr>", "<td></td>", "<td></td>"], "ends inside a row"),  # cut at the length limit
    (["<td></td>", "</tr>"], "outside a row"),
    (["<tr>", "<td", "<b>", "</td>", "</tr>"], "inside a cell"),
    (["<tr>", "<td></td>", "</tr>", "</tr>"], "not open"),
    (["<tr>", "<tr>"], "inside a row"),
    (["<table>", "</table>"], "no cells"),
    (["<tr>", "<img>", "</tr>"], "unexpected token"),
])
def test_a_structure_that_is_no_table_is_refused_with_the_reason(tokens: list[str],
                                                                 why: str) -> None:
    with pytest.raises(TableStructureError, match=why):
        parse_structure(tokens)


def test_text_boxes_go_to_the_cell_holding_their_centre_else_the_nearest() -> None:
    cells = [(0, 0, 50, 20), (50, 0, 100, 20), (0, 20, 50, 40), (50, 20, 100, 40)]
    texts = [(55, 22, 70, 35),  # inside cell 3
             (5, 2, 30, 18),  # inside cell 0
             (60, 41, 80, 50),  # below the grid: nearest is cell 3
             (35, 3, 60, 17)]  # centre (47.5, 10) lies in cell 0
    assert assign_texts(cells, texts) == [[1, 3], [], [], [0, 2]]
    assert assign_texts([], texts) == []


def test_overlapping_cells_give_a_text_to_the_smallest_one() -> None:
    assert assign_texts([(0, 0, 100, 100), (40, 40, 60, 60)], [(45, 45, 55, 55)]) == [[], [0]]


def test_a_grid_without_spans_is_a_pipe_table_with_its_pipes_escaped() -> None:
    rows = [[(1, 1)] * 2, [(1, 1)] * 2]
    got = table_content(rows, ["Name", "a|b", "x", "multi\nline"])
    assert got == {"markdown": "| Name | a\\|b |\n| --- | --- |\n| x | multi line |"}


def test_a_ragged_grid_is_padded_to_its_widest_row() -> None:
    got = table_content([[(1, 1)] * 3, [(1, 1)] * 2], ["a", "b", "c", "1", "2"])
    assert got["markdown"].splitlines()[-1] == "| 1 | 2 |  |"


def test_a_grid_with_a_spanning_cell_is_html_with_its_texts_escaped() -> None:
    got = table_content([[(2, 1)], [(1, 1), (1, 1)]], ["Both <b>", "1", "2"])
    assert got == {"html": '<table><tr><td colspan="2">Both &lt;b&gt;</td></tr>'
                           "<tr><td>1</td><td>2</td></tr></table>"}


def test_cell_texts_must_match_the_cells() -> None:
    with pytest.raises(TableStructureError, match="2 cell texts for 3 cells"):
        table_content([[(1, 1)] * 3], ["a", "b"])


def test_words_of_a_region_read_in_lines_and_garbage_is_refused() -> None:
    words = [[50, 10, 80, 20, "world"], [10, 10, 45, 20, "hello"], [10, 30, 40, 40, "next"]]
    assert usable_words_text(words) == "hello world\nnext"
    assert usable_words_text([[0, 0, 10, 10, "\ufffd\ufffd\ufffd"]]) is None
    assert usable_words_text([]) is None


def test_points_map_to_the_pixels_of_the_regions_crop() -> None:
    region = {"bbox": [0.5, 0.25, 1.0, 0.5], "width_pt": 200.0, "height_pt": 400.0}
    to_crop = crop_transform(region, (300, 150))  # the box is 100 x 100 pt: 3 and 1.5 px/pt
    assert to_crop(100.0, 100.0) == (0.0, 0.0)
    assert to_crop(150.0, 200.0) == (150.0, 150.0)
    assert crop_transform({"bbox": [0, 0, 1, 1]}, (10, 10)) is None


def test_a_region_item_that_cannot_be_read_says_why() -> None:
    good = {"page": 1, "order": 0, "kind": "text", "bbox": [0, 0, 1, 1], "crop": b""}
    assert region_problem(good) is None
    assert "lacks crop" in str(region_problem({k: v for k, v in good.items() if k != "crop"}))
    assert "unknown region kind 'poem'" in str(region_problem({**good, "kind": "poem"}))


def _grid_image(rows: int = 5, cols: int = 3, *, merged_row: int | None = None,
                text_above: bool = False) -> np.ndarray:
    """A drawn ruled table: ``rows`` x ``cols`` cells of 60 x 24 px, one pixel rules; the
    vertical rules skip ``merged_row`` (one cell across it)."""
    top = 30 if text_above else 5
    image = Image.new("L", (cols * 60 + 10, top + rows * 24 + 5), 255)
    draw = ImageDraw.Draw(image)
    if text_above:
        draw.rectangle((5, 8, 150, 16), fill=0)  # a line of a paragraph above the table
    for r in range(rows + 1):
        draw.line((5, top + r * 24, 5 + cols * 60, top + r * 24), fill=0)
    for c in range(cols + 1):
        for r in range(rows):
            if merged_row == r and 0 < c < cols:
                continue
            draw.line((5 + c * 60, top + r * 24, 5 + c * 60, top + (r + 1) * 24), fill=0)
    return np.asarray(image)


def test_a_ruled_grid_is_read_from_its_rules() -> None:
    got = ruled_grid(_grid_image())
    assert got is not None
    rows, boxes = got
    assert rows == [[(1, 1)] * 3] * 5
    assert len(boxes) == 15
    left, top, right, bottom = boxes[4]  # row 1, column 1
    assert 60 <= left <= 70 and 120 <= right <= 130 and 24 <= top <= 34 and 48 <= bottom <= 58


def test_a_row_no_inner_rule_crosses_is_one_cell_spanning_the_columns() -> None:
    got = ruled_grid(_grid_image(merged_row=0))
    assert got is not None and got[0][0] == [(3, 1)] and got[0][1] == [(1, 1)] * 3


def test_text_inside_the_crop_above_the_table_is_no_row_of_it() -> None:
    got = ruled_grid(_grid_image(text_above=True))
    assert got is not None and len(got[0]) == 5


@pytest.mark.parametrize("drawing", ["paragraph", "chart", "one rule"])
def test_what_is_no_ruled_grid_is_said_so(drawing: str) -> None:
    image = Image.new("L", (200, 130), 255)
    draw = ImageDraw.Draw(image)
    if drawing == "paragraph":
        for y in range(10, 120, 14):
            draw.rectangle((5, y, 190, y + 7), fill=0)  # lines of text, as ink
    elif drawing == "chart":
        draw.line((10, 120, 190, 120), fill=0, width=2)
        draw.line((10, 5, 10, 120), fill=0, width=2)
        for k in range(6):
            draw.rectangle((20 + k * 28, 120 - 15 * (k + 1), 40 + k * 28, 120), fill=80)
    else:
        draw.line((5, 60, 195, 60), fill=0)
    assert ruled_grid(np.asarray(image)) is None


def _ink(*boxes: tuple[int, int, int, int]) -> object:
    """A page with a block of ink per glyph box (dark on white), and a table's rules."""
    image = Image.new("L", (300, 60), 255)
    draw = ImageDraw.Draw(image)
    draw.line((0, 4, 299, 4), fill=0)  # rules over the row and between cells: no words
    draw.line((100, 0, 100, 59), fill=0)
    for box in boxes:
        draw.rectangle(box, fill=0)
    return np.asarray(image)


def test_an_ocr_line_is_cut_into_its_words_at_the_inks_gaps() -> None:
    """One detected line spans two cells ("North" | "1,204 kg"): each word gets its own
    ink's box, so the gap between the cells shows; glyphs 2 px apart stay one word."""
    glyphs = [(10 + 8 * k, 20, 15 + 8 * k, 32) for k in range(5)]  # N o r t h
    number = [(140 + 8 * k, 20, 145 + 8 * k, 32) for k in range(5)]  # 1,204
    unit = [(190, 20, 195, 32), (198, 20, 203, 32)]  # kg, a word space (~9 px) away
    words = ink_words(_ink(*glyphs, *number, *unit), [((8, 16, 210, 36), "North 1,204 kg")])
    assert [text for _, text in words] == ["North", "1,204", "kg"]
    (n0, _, n1, _), (d0, _, d1, _), (k0, _, k1, _) = (box for box, _ in words)
    assert (n0, n1) == (10, 48) and (d0, d1) == (140, 178) and (k0, k1) == (190, 204)


def test_more_blobs_than_words_join_at_the_narrowest_gaps_and_fewer_keep_the_line() -> None:
    # "7,981" read as one word whose comma sits 5 px off: its blobs join, the far one not
    ink = _ink((10, 20, 30, 32), (35, 20, 55, 32), (120, 20, 150, 32))
    words = ink_words(ink, [((5, 16, 155, 36), "7,981 t")])
    assert [(box[0], box[2], text) for box, text in words] == [(10, 56, "7,981"),
                                                                (120, 151, "t")]
    # three words on one blob: the line stays whole, its text as read
    line = ((5, 16, 155, 36), "a b c")
    assert ink_words(_ink((10, 20, 150, 32)), [line]) == [line]
