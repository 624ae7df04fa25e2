"""A born-digital table's cells from its text-layer words alone (whitespace analysis).

The layout model gives a table's box; the words inside it (``[x0, y0, x1, y1, text]``, PDF
points) carry their own positions, which say more than a model's reading of the crop:

* **lines**: words whose vertical extents overlap, left to right; a line is cut into
  *phrases* where the gap between two words is wider than :data:`PHRASE_GAP` times the line's
  height (a word space is about a quarter of it, a column gap more);
* **columns**: the x-ranges that the phrases of the *body* lines (those with two phrases or
  more, from the first line with the most phrases down) leave uncovered are the gaps between
  columns, narrowed by the lines of one phrase that do not run across such a gap (a label
  that wraps onto lines of its own around its row's values, as on a scan, whose words are as
  tall as their ink). Header lines above the body do not vote, so a header spanning two
  columns does not hide the gap between them; it becomes one cell with ``colspan``. Within
  a gap, the cut goes through the widest part that no header word covers, line by line up
  from the body until a line covers it all (a header wider than its values; a header
  spanning columns);
* **notes**: trailing lines of one phrase that crosses a column gap (or that begin as a note
  does: "Note", "Source", "*", a dagger) are not rows; they come back apart, as the table's
  notes;
* **rows**: a line starts a new row unless it sits closer to the line above than rows sit to
  each other (:data:`CONTINUATION_GAP` of the median gap between lines that do not overlap)
  and its phrases fall in columns that the row above fills with the same span, or leaves
  empty: then it is more text of the same row (a multi-line cell stays one cell, values set
  beside a label that wraps join it), unless it sets numbers under the row's words (the first
  values under a header, set close under it);
* a header cell with empty cells under it, down to the body, spans those rows (``rowspan``).

:func:`text_table` answers ``(rows, texts)`` in the shape that
:func:`rayorch.pipelines.document.table_structure.table_content` writes, or raises
:class:`~rayorch.pipelines.document.table_structure.TableStructureError` for words that do not
form a table (one column, one row): the caller then reads the region another way. Why not
PyMuPDF's ``find_tables``: docs/topics/PIPELINES.md, "Tables".

>>> words = [[0, 0, 20, 10, "Name"], [60, 0, 80, 10, "Qty"],
...          [0, 14, 20, 24, "pen"], [60, 14, 70, 24, "4"],
...          [0, 28, 20, 38, "ink"], [60, 28, 70, 38, "2"]]
>>> rows, texts, notes = text_table(words)
>>> rows
[[(1, 1), (1, 1)], [(1, 1), (1, 1)], [(1, 1), (1, 1)]]
>>> texts, notes
(['Name', 'Qty', 'pen', '4', 'ink', '2'], '')
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rayorch.pipelines.document.table_structure import Cell, TableStructureError

PHRASE_GAP = 0.6
"""A gap between two words of a line wider than this share of the line's height cuts it."""
CONTINUATION_GAP = 0.6
"""A line nearer to the line above than this share of the median gap between lines may
continue the row above."""
CELL_SPACE = 0.3
"""A space between two words of a phrase wider than this share of the line's height, with a
column gap in it, parts two cells (headers set close together)."""
ALIGNED = 0.25
"""Points: a word this near to where a column's body text starts (or ends) is aligned to it."""
MIN_COLUMN_GAP = 1.5
"""Points: a narrower uncovered x-range is not a gap between columns."""
_NUMBER = re.compile(r"^[-+\u2212(]?[$€£¥]?\d")
_NOTE_START = re.compile(r"^\s*(notes?\b|sources?\b|\*|†|‡|§|¹|²|³|\(\w\)\s)", re.IGNORECASE)


@dataclass
class Phrase:
    x0: float
    x1: float
    words: list[str]
    spaces: list[tuple[float, float, float]] = field(default_factory=list)
    """Per gap between two of its words: ``(gap start, gap end, line height)``."""

    def split(self, cuts: Sequence[float], edges: Sequence[tuple[float, float]]
              ) -> list[Phrase]:
        """The phrase cut where a column gap falls in a space that is wider than a word
        space, or that a column's body text starts or ends at (``edges``: per column, where
        its body text starts and ends): headers set close together."""
        out = [Phrase(self.x0, self.x1, [self.words[0]])]
        for word, (left, right, height) in zip(self.words[1:], self.spaces, strict=True):
            aligned = any(abs(right - a) <= ALIGNED or abs(left - b) <= ALIGNED
                          for a, b in edges)
            if ((aligned or right - left > CELL_SPACE * height)
                    and any(left < c < right for c in cuts)):
                out[-1].x1 = left
                out.append(Phrase(right, self.x1, [word]))
            else:
                out[-1].words.append(word)
                out[-1].spaces.append((left, right, height))
        return out


@dataclass
class Line:
    y0: float
    y1: float
    phrases: list[Phrase] = field(default_factory=list)
    word_spans: list[tuple[float, float]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return " ".join(" ".join(p.words) for p in self.phrases)


def text_lines(words: Sequence[Sequence[Any]]) -> list[Line]:
    """The words as lines, top to bottom, each cut into phrases."""
    order = sorted(((float(w[0]), float(w[1]), float(w[2]), float(w[3]), str(w[4]))
                    for w in words if str(w[4]).strip()), key=lambda w: (w[1] + w[3]) / 2)
    groups: list[list[tuple[float, float, float, float, str]]] = []
    for word in order:
        centre = (word[1] + word[3]) / 2
        if groups:  # against the line's first word: a line must not creep down the page
            top, bottom = groups[-1][0][1], groups[-1][0][3]
            if top <= centre <= bottom:
                groups[-1].append(word)
                continue
        groups.append([word])
    lines = []
    for group in groups:
        group.sort(key=lambda w: w[0])
        line = Line(min(w[1] for w in group), max(w[3] for w in group),
                     word_spans=[(w[0], w[2]) for w in group])
        height = statistics.median(w[3] - w[1] for w in group)  # not the extent: lines overlap
        for x0, _, x1, _, text in group:
            if line.phrases and x0 - line.phrases[-1].x1 <= PHRASE_GAP * height:
                line.phrases[-1].spaces.append((line.phrases[-1].x1, x0, height))
                line.phrases[-1].x1 = max(line.phrases[-1].x1, x1)
                line.phrases[-1].words.append(text)
            else:
                line.phrases.append(Phrase(x0, x1, [text]))
        lines.append(line)
    return lines


def column_cuts(lines: Sequence[Line]) -> list[float]:
    """The x of each gap between columns: ranges no phrase of a body line covers."""
    most = max(len(line.phrases) for line in lines)
    first = next(i for i, line in enumerate(lines) if len(line.phrases) == most)
    body = [p for line in lines[first:] if len(line.phrases) >= 2 for p in line.phrases]
    spans = sorted((p.x0, p.x1) for p in body)
    if not spans:
        return []
    # A label that wraps sits on lines of its own, above and below its row's values (set
    # at the row's middle): those lines' phrases show its column where they do not run
    # across a gap that the others leave (a label wider than its header narrows that gap;
    # a note across the columns would close it).
    inner = _gaps(spans)
    spans = sorted(spans + [(p.x0, p.x1) for line in lines[first:]
                            if len(line.phrases) == 1 for p in line.phrases
                            if not any(p.x0 <= lo and hi <= p.x1 for lo, hi in inner)])
    header = [line.word_spans for line in reversed(lines[:first])]
    return [_free_middle(lo, hi, header) for lo, hi in _gaps(spans)]


def _gaps(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The x-ranges between sorted ``spans`` that none of them covers."""
    gaps: list[tuple[float, float]] = []
    reach = spans[0][1]
    for x0, x1 in spans[1:]:
        if x0 - reach >= MIN_COLUMN_GAP:
            gaps.append((reach, x0))
        reach = max(reach, x1)
    return gaps


def _free_middle(lo: float, hi: float, header: Sequence[Sequence[tuple[float, float]]]
                 ) -> float:
    """The middle of the widest part of ``lo..hi`` that no word of the header lines covers
    (a header wider than its column's values must not be cut), the lines taken from the
    body up until one covers what is left (a header spanning the columns)."""
    free = [(lo, hi)]
    for words in header:
        left = free
        for x0, x1 in words:
            left = [part for a, b in left
                    for part in ((a, min(b, x0)), (max(a, x1), b)) if part[1] - part[0] > 0.5]
        if not left:
            break
        free = left
    a, b = max(free, key=lambda part: part[1] - part[0])
    return (a + b) / 2


def phrase_columns(phrase: Phrase, cuts: Sequence[float]) -> tuple[int, int]:
    """The first and last column (inclusive) that ``phrase`` lies in."""
    first = sum(1 for c in cuts if c < phrase.x0)
    last = sum(1 for c in cuts if c < phrase.x1)
    return first, last


def _is_note(line: Line, cuts: Sequence[float]) -> bool:
    if _NOTE_START.match(line.text):
        return True
    if len(line.phrases) != 1:
        return False
    first, last = phrase_columns(line.phrases[0], cuts)
    return last > first


def _split_notes(lines: list[Line], cuts: Sequence[float]) -> tuple[list[Line], list[Line]]:
    """The table's lines and the trailing lines that are notes under it."""
    end = len(lines)
    while end > 2 and _is_note(lines[end - 1], cuts):
        end -= 1
    # a note that runs over several lines: its first line marks it, its others may not
    for i in range(2, end):
        if _NOTE_START.match(lines[i].text) and len(lines[i].phrases) == 1 and all(
                len(line.phrases) == 1 for line in lines[i:end]):
            end = i
            break
    return lines[:end], lines[end:]


Slots = dict[int, tuple[int, list[str]]]
"""One row: its cells by first column, each ``(last column, words)``."""


def _edges(lines: Sequence[Line], cuts: Sequence[float]) -> list[tuple[float, float]]:
    """Per column, where the text of its body cells starts and ends (phrases of lines with
    two phrases or more that lie in that column alone)."""
    edges: dict[int, tuple[float, float]] = {}
    for line in lines:
        if len(line.phrases) < 2:
            continue
        for phrase in line.phrases:
            first, last = phrase_columns(phrase, cuts)
            if first == last:
                a, b = edges.get(first, (phrase.x0, phrase.x1))
                edges[first] = (min(a, phrase.x0), max(b, phrase.x1))
    return list(edges.values())


def _slots(line: Line, cuts: Sequence[float], edges: Sequence[tuple[float, float]]) -> Slots:
    slots: Slots = {}
    for phrase in (part for whole in line.phrases for part in whole.split(cuts, edges)):
        first, last = phrase_columns(phrase, cuts)
        # a phrase starting in a cell already taken joins it (a gap inside a cell's text)
        owner = next((f for f, (end, _) in slots.items() if f <= first <= end), None)
        if owner is not None:
            end, words = slots[owner]
            slots[owner] = (max(end, last), words + phrase.words)
        else:
            slots[first] = (last, list(phrase.words))
    return slots


def _continues(row: Slots, line: Slots) -> bool:
    """Whether every cell of ``line`` lies in a cell of ``row`` with the same span, or in
    columns that ``row`` leaves empty (a value set beside a label that wraps)."""
    def fits(first: int, last: int) -> bool:
        if first in row:
            return row[first][0] == last
        return not any(f <= last and first <= end for f, (end, _) in row.items())
    return all(fits(first, last) for first, (last, _) in line.items())


def _numeric(words: Sequence[str]) -> bool:
    return bool(words) and _NUMBER.match(words[0]) is not None


def _values_under_labels(row: Slots, line: Slots) -> bool:
    """Whether ``line`` holds numbers in the columns where ``row`` holds words (a header):
    the first row of values under it, however close, not more of the header's text."""
    shared = [c for c in line if c in row]
    return bool(shared) and all(_numeric(line[c][1]) and not _numeric(row[c][1])
                                for c in shared)


def text_table(words: Sequence[Sequence[Any]]) -> tuple[list[list[Cell]], list[str], str]:
    """``(rows, texts, notes)`` of the table the words form; see the module's docstring."""
    lines = text_lines(words)
    if len(lines) < 2:
        raise TableStructureError("the words make fewer than two lines")
    cuts = column_cuts(lines)
    if not cuts:
        raise TableStructureError("no gap between columns runs down the words")
    lines, note_lines = _split_notes(lines, cuts)
    edges = _edges(lines, cuts)
    gaps = [b.y0 - a.y1 for a, b in itertools.pairwise(lines)]
    between = [g for g in gaps if g > 0]  # lines side by side in a row overlap: no gap
    median_gap = statistics.median(between) if between else 0.0
    rows: list[Slots] = []
    for i, line in enumerate(lines):
        slots = _slots(line, cuts, edges)
        close = i > 0 and gaps[i - 1] < CONTINUATION_GAP * median_gap
        if rows and close and _continues(rows[-1], slots) and not _values_under_labels(
                rows[-1], slots):
            for first, (last, more) in slots.items():
                rows[-1].setdefault(first, (last, []))[1].extend(more)
        else:
            rows.append(slots)
    if len(rows) < 2:
        raise TableStructureError("the words make one row")
    return (*_grid(rows, len(cuts) + 1), " ".join(line.text for line in note_lines))


def _grid(rows: list[Slots], width: int) -> tuple[list[list[Cell]], list[str]]:
    """Rows of ``(colspan, rowspan)`` cells and their texts. Header cells (the rows above the
    first one whose cells each fill one column, its first column among them) span the empty
    cells under them down to the body."""
    body = next((i for i, row in enumerate(rows) if 0 in row and len(row) > 1
                 and all(last == first for first, (last, _) in row.items())), 1)
    taken: set[tuple[int, int]] = set()  # (row, column) covered by a rowspan from above
    out_rows: list[list[Cell]] = []
    texts: list[str] = []
    for r, row in enumerate(rows):
        cells: list[Cell] = []
        column = 0
        while column < width:
            if (r, column) in taken:
                column += 1
                continue
            last, words = row.get(column, (column, []))
            rowspan = 1
            if r < body and words:
                while (r + rowspan < body and all(
                        c not in rows[r + rowspan] and (r + rowspan, c) not in taken
                        for c in range(column, last + 1))):
                    rowspan += 1
            for below in range(r + 1, r + rowspan):
                taken.update((below, c) for c in range(column, last + 1))
            cells.append((last - column + 1, rowspan))
            texts.append(" ".join(words))
            column = last + 1
        out_rows.append(cells)
    return out_rows, texts


__all__ = ["Line", "Phrase", "column_cuts", "phrase_columns", "text_lines", "text_table"]
