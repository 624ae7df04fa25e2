"""Ruled tables of a PDF page as pipe tables, from the page's drawn rules and its words.

``page.get_cdrawings()`` gives the strokes and thin filled rectangles a page draws: the
horizontal ones, merged where they touch, are rules; rules of about the same width stacked
with text between them bound a table. Inside it, columns are split at the vertical rules,
or (a table ruled only across, as LaTeX's ``booktabs``) at the gaps no word crosses in any
row; rows are split at the horizontal rules, and a band between two rules whose cells
hold several lines in two or more columns is one row per baseline (a table that rules
only its sections). The words come from the page's TextPage (``extractWORDS``). A "table"
of one column or one row is not one. Why not ``page.find_tables()``: docs/topics/PIPELINES.md,
"PDF to Markdown".
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from rayorch.pipelines.document.boxes import Box

Table = tuple[Box, str]
"""A table found on a page: its box and its Markdown."""

RULE_THICKNESS = 3.0
"""A filled rectangle at most this thick is a rule (TeX draws its rules so)."""
MIN_RULE = 20.0
"""Shorter strokes are glyph parts, underlines or arrows, not table rules."""
COLUMN_GAP = 6.0
"""A vertical gap at least this wide that no word of any row crosses splits columns."""
_RULING_OPS = re.compile(rb"\s(?:re|l)\s")
_TEXT_FLAGS = 2 | 64


def _segments(page: Any) -> tuple[list[Box], list[Box]]:
    """Horizontal and vertical rules as thin boxes ``(x0, y0, x1, y1)``."""
    across: list[Box] = []
    down: list[Box] = []
    for path in page.get_cdrawings():
        for item in path["items"]:
            kind = item[0]
            if kind == "l":
                (ax, ay), (bx, by) = item[1], item[2]
                box = (min(ax, bx), min(ay, by), max(ax, bx), max(ay, by))
            elif kind == "re":
                box = tuple(item[1])
            else:
                continue
            x0, y0, x1, y1 = box
            if y1 - y0 <= RULE_THICKNESS and x1 - x0 >= MIN_RULE:
                across.append((x0, (y0 + y1) / 2, x1, (y0 + y1) / 2))
            elif x1 - x0 <= RULE_THICKNESS and y1 - y0 >= 4.0:
                down.append(((x0 + x1) / 2, y0, (x0 + x1) / 2, y1))
            elif kind == "re" and path.get("type") in ("s", "fs"):  # a stroked frame
                across += [(x0, y0, x1, y0), (x0, y1, x1, y1)]
                down += [(x0, y0, x0, y1), (x1, y0, x1, y1)]
    return _merged(across, horizontal=True), down


def _merged(rules: list[Box], *, horizontal: bool) -> list[Box]:
    """Collinear rules that touch, as one (a grid draws each cell's border apart)."""
    rules.sort(key=lambda r: (round(r[1]), r[0]))
    out: list[Box] = []
    for rule in rules:
        if out and abs(out[-1][1] - rule[1]) <= 1.0 and rule[0] <= out[-1][2] + 2.0:
            last = out[-1]
            out[-1] = (last[0], last[1], max(last[2], rule[2]), last[3])
        else:
            out.append(rule)
    return out


def _overlap(a: Box, b: Box) -> float:
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) / max(min(a[2] - a[0], b[2] - b[0]), 1.0)


def _regions(across: list[Box]) -> list[tuple[Box, list[float]]]:
    """Stacks of rules about as wide as each other: a box and the y of its rules."""
    regions: list[tuple[Box, list[float]]] = []
    for rule in sorted(across, key=lambda r: r[1]):
        for k, (box, ys) in enumerate(regions):
            if _overlap(box, rule) >= 0.8 and abs((box[2] - box[0]) - (rule[2] - rule[0])) < 40:
                regions[k] = ((min(box[0], rule[0]), box[1], max(box[2], rule[2]), rule[1]),
                              [*ys, rule[1]])
                break
        else:
            regions.append(((rule[0], rule[1], rule[2], rule[1]), [rule[1]]))
    return [(box, ys) for box, ys in regions if len(ys) >= 2]


def _bands(ys: list[float]) -> list[tuple[float, float]]:
    """Spans between consecutive rules (a double rule, two rules 3 pt apart, is one)."""
    edges: list[float] = []
    for y in sorted(ys):
        if not edges or y - edges[-1] > 3.0:
            edges.append(y)
        else:
            edges[-1] = y
    return list(itertools.pairwise(edges))


def _columns(words: list[Any], box: Box, down: list[Box]) -> list[float]:
    """Column edges between ``box``'s sides: at its inner vertical rules, or at word gaps."""
    x0, y0, x1, y1 = box
    inner = sorted({round(r[0], 1) for r in down
                    if x0 + 2 < r[0] < x1 - 2 and r[1] < y1 and r[3] > y0})
    edges: list[float] = []
    for x in inner:
        if not edges or x - edges[-1] > 3.0:
            edges.append(x)
    if edges:
        return edges
    spans = sorted((w[0], w[2]) for w in words)
    gaps: list[float] = []
    right = spans[0][1] if spans else 0.0
    for left, end in spans[1:]:
        if left - right >= COLUMN_GAP:
            gaps.append((left + right) / 2)
        right = max(right, end)
    return gaps


def _column(word: Any, edges: list[float]) -> int:
    return sum(edge < (word[0] + word[2]) / 2 for edge in edges)


def _cells(lines: list[list[Any]], edges: list[float]) -> list[str]:
    texts: list[list[str]] = [[] for _ in range(len(edges) + 1)]
    for line in lines:
        for word in sorted(line, key=_left):
            texts[_column(word, edges)].append(word[4])
    return [" ".join(t).replace("|", "\\|") for t in texts]


def _left(word: Any) -> float:
    return float(word[0])


def _rows(words: list[Any], bands: list[tuple[float, float]], edges: list[float]
          ) -> list[list[str]]:
    """Each band's cells; a band with several lines in two or more columns: one row a line."""
    rows: list[list[str]] = []
    for top, bottom in bands:
        inside = sorted((w for w in words if top <= (w[1] + w[3]) / 2 <= bottom),
                        key=lambda w: (round(w[3]), w[0]))
        lines: list[list[Any]] = []  # words by baseline
        for word in inside:
            if lines and abs(lines[-1][0][3] - word[3]) <= 0.35 * (word[3] - word[1]):
                lines[-1].append(word)
            else:
                lines.append([word])
        if not lines:
            continue
        used = [{_column(w, edges) for w in line} for line in lines]
        stacked = sum(1 for c in range(len(edges) + 1) if sum(c in u for u in used) > 1)
        if len(lines) > 1 and stacked >= 2:
            rows.extend(_cells([line], edges) for line in lines)
        else:
            rows.append(_cells(lines, edges))
    return rows


def pipe_table(rows: list[list[str]]) -> str:
    """Rows (the first one the header) as a Markdown pipe table."""
    width = max(len(row) for row in rows)
    lines = ["| " + " | ".join(row + [""] * (width - len(row))) + " |" for row in rows]
    lines.insert(1, "|" + " --- |" * width)
    return "\n".join(lines)


def page_tables(page: Any, textpage: Any = None, *, min_ruling_ops: int = 4,
                max_ruling_ops: int = 2000) -> list[Table]:
    """The ruled tables of a page, as ``(bbox, markdown)``; ``[]`` when none.

    Only pages whose content stream draws a few lines or rectangles (a cheap scan) are
    looked at. The words come from ``textpage`` (the page's TextPage, already built) when
    given, else from a TextPage of the table's box."""
    try:
        ops = len(_RULING_OPS.findall(page.read_contents()))
    except Exception:  # a content stream MuPDF cannot read: no table search
        return []
    if not min_ruling_ops <= ops <= max_ruling_ops:
        return []
    across, down = _segments(page)
    found: list[Table] = []
    regions = _regions(across)
    every = textpage.extractWORDS() if textpage is not None and regions else []
    for box, ys in regions:
        x0, y0, x1, y1 = box
        if textpage is None:
            words = page.get_text("words", clip=(x0 - 1, y0 - 1, x1 + 1, y1 + 1),
                                  flags=_TEXT_FLAGS)
        else:
            words = [w for w in every if x0 - 1 <= (w[0] + w[2]) / 2 <= x1 + 1
                     and y0 - 1 <= (w[1] + w[3]) / 2 <= y1 + 1]
        if not words:
            continue
        edges = _columns(words, box, down)
        rows = _rows(words, _bands(ys), edges)
        if len(edges) >= 1 and len(rows) >= 2:
            found.append((box, pipe_table(rows)))
    return found


__all__ = ["Table", "page_tables", "pipe_table"]
