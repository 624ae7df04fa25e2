"""Which boxes of a page are tables: the layout model's table regions, checked against the
page's own columns of words.

The CDLA layout model misses tables a page shows plainly (an unruled table read as ``text``,
a zebra table as ``figure``) and draws one box around two tables set one under the other. A
table is lines of words that fall into the same columns, and that is read from word boxes
alone (:func:`find_tables`): the text-layer words of a born-digital page, or on a scan the
blobs its ink makes (:func:`ink_word_boxes`, letters joined into words, rules taken out).

* **lines** and **phrases** as :mod:`~rayorch.pipelines.document.text_table` makes them (a
  phrase ends at a gap wider than a word space);
* **blocks**: lines close under each other (:data:`RUN_GAP` line heights) with two phrases or
  more (*rows*); a line of one phrase stays in a block between two rows when it is narrow (a
  label that wraps); a wide one (a paragraph, a note) ends it, so notes stay outside;
* a block is a table when it has :data:`MIN_ROWS` rows with phrases in two columns at least
  (gaps between columns that run down it, ``text_table.column_cuts``, :data:`COLUMN_GAP`
  wide at least), most of them as many phrases as one another and those lining up (a tree's
  or a chart's labels do not); a leading column of list markers (``(5)``, ``a.``, bullets,
  line numbers) is no column (:func:`_filled`),
  two columns must hold short phrases (:data:`CELL_WORDS`: running text in two columns holds
  lines of many words) and leaders (:data:`LEADER`) mark a table of contents, no table;
* the lines of one phrase just above the first row that sit as near as the rows do, lie within
  its width and keep a word space in each column gap they cross are its header (a label over
  two header rows, a group label; a caption's words run on across the gaps).

:func:`with_found_tables` merges them into the model's detections: a found table the model
also found keeps the model's box, widened to the words; a model box holding two found tables
becomes those two; a found table the model missed is added, and the model's other boxes over
it (the ``text`` or ``figure`` it took it for) are dropped, so no word is emitted twice (the
words they held outside the table come back as regions of their own, see
:func:`~rayorch.pipelines.document.layout.page_regions`).

>>> rows = [[[0, y, 30, y + 8, "Region"], [60, y, 80, y + 8, "12"], [110, y, 130, y + 8, "7"]]
...         for y in (0, 12, 24, 36)]
>>> find_tables([w for row in rows for w in row])
[(-2.0, -2.0, 132.0, 46.0)]
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rayorch.pipelines.document.boxes import Box, box_area, box_intersection, box_union
from rayorch.pipelines.document.table_structure import ink_blobs
from rayorch.pipelines.document.text_table import (
    Line,
    Phrase,
    column_cuts,
    phrase_columns,
    text_lines,
)

"""``(x0, y0, x1, y1)``, top-left origin."""
Detection = tuple[str, float, Box]
"""A layout detection: kind, score, box (fractions of the page), as in ``layout``."""

COLUMN_GAP = 0.4
"""A gap between columns is at least this many line heights wide in every row (a sliver
that the phrases of a few lines of text happen to leave uncovered is none)."""
RUN_GAP = 2.5
"""Lines farther apart than this many line heights are not in one table."""
MIN_ROWS = 3
"""A table has at least this many lines of two phrases or more."""
NARROW = 0.5
"""A line of one phrase inside a table is at most this share of the table's width."""
CELL_WORDS = 4
"""Two columns are a table when their phrases hold at most this many words (the median);
two columns of running text hold lines of many words."""
HEADER_LINES = 3
"""At most this many lines of one phrase above a table's first row are its header (a label
over two header rows, a group label over columns, headers set close together): see
:func:`_header`."""
HEADER_GAP = 1.5
"""A header line sits at most this many times the table's median gap between lines above
the line under it (a caption or a paragraph above the table sits farther)."""
SAME_COUNT = 0.5
"""At least this share of a table's rows hold the same number of phrases."""
MARKER = 1.6
"""A column whose phrases are all at most this many line heights wide may be a list's
markers (see :func:`_filled`)."""
LEADER = re.compile(r"(\.\s*){5}")
"""Five dots in a row: a table of contents' leader (a table's "not available" mark is two
or three)."""
ALIGN = 0.5
"""Phrases whose left (or right) edges, or centres, lie within this many line heights of one
another line up."""
ALIGNED_SHARE = 0.6
"""A column lines up when this share of its phrases line up with one another."""
PAD = 0.25
"""A found table's box is widened by this share of a line height on each side."""
FOUND_SCORE = 0.0
"""The score of a table the model did not find."""
SAME_TABLE = 0.5
"""A model table and a found one overlapping by this share of the smaller are one table."""
HOLDS = 0.7
"""A found table this much inside a model table lies in it (two such: the model joined two)."""
COVERED = 0.5
"""A model region (not a table) with this share of its area inside a found table is the table
read as something else: dropped."""


def find_tables(words: Sequence[Sequence[Any]]) -> list[Box]:
    """The boxes of the tables that ``words`` (``[x0, y0, x1, y1, text]``, any unit, top-left
    origin) form, top to bottom; see the module's docstring."""
    lines = text_lines(words)
    if len(lines) < MIN_ROWS:
        return []
    height = statistics.median(line.y1 - line.y0 for line in lines)
    tables: list[Box] = []
    block: list[Line] = []
    start = 0
    for i, line in enumerate([*lines, None]):
        if line is not None and block and line.y0 - block[-1].y1 <= RUN_GAP * height and (
                len(line.phrases) >= 2 or _narrow(line, block)):
            block.append(line)
            continue
        if block:
            found = _table(lines[max(0, start - HEADER_LINES):start], block, height)
            if found is not None:
                tables.append(found)
        block = [line] if line is not None and len(line.phrases) >= 2 else []
        start = i
    return tables


def _narrow(line: Line, block: Sequence[Line]) -> bool:
    """Whether a line of one phrase is narrow beside the block's rows (a wrapped label)."""
    left = min(p.x0 for row in block for p in row.phrases)
    right = max(p.x1 for row in block for p in row.phrases)
    return line.phrases[0].x1 - line.phrases[0].x0 <= NARROW * max(right - left, 1e-9)


def _table(above: Sequence[Line], block: list[Line], height: float) -> Box | None:
    """The box of ``block`` when its lines are a table (its trailing one-phrase lines left
    out, the header lines among the lines just ``above`` it added), else ``None``."""
    while block and len(block[-1].phrases) < 2:
        block = block[:-1]
    rows = [line for line in block if len(line.phrases) >= 2]
    if len(rows) < MIN_ROWS:
        return None
    cuts = [cut for cut in column_cuts(block) if _gap(cut, rows) >= COLUMN_GAP * height]
    if not cuts:
        return None
    # A row holds phrases in two columns at least (two phrases in one column are a line of
    # text with a wide space in it, as justified text has after a full stop).
    rows = [line for line in rows
            if len({phrase_columns(p, cuts)[0] for p in line.phrases}) >= 2]
    if len(rows) < MIN_ROWS or not _filled(rows, cuts, height):
        return None
    if sum(1 for line in rows if LEADER.search(line.text)) >= 0.3 * len(rows):
        return None  # a table of contents: a list of sections, not a table
    # A table's rows hold as many phrases as one another, mostly (lines of a listing set in a
    # typewriter font, whose word spaces are as wide as a gap between phrases, do not), and
    # those rows' phrases line up one under the other (a tree's labels do not).
    [(count, same)] = Counter(len(line.phrases) for line in rows).most_common(1)
    if same < SAME_COUNT * len(rows) or not _aligned(
            [line for line in rows if len(line.phrases) == count], height):
        return None
    if len(cuts) == 1 and statistics.median(
            len(p.words) for line in rows for p in line.phrases) > CELL_WORDS:
        return None
    x0 = min(p.x0 for line in block for p in line.phrases)
    x1 = max(p.x1 for line in block for p in line.phrases)
    gaps = [b.y0 - a.y1 for a, b in itertools.pairwise(block) if b.y0 > a.y1]
    near = max(HEADER_GAP * statistics.median(gaps) if gaps else 0.0, 0.25 * height)
    top = block[0]
    for line in reversed(above):
        phrase = line.phrases[0]
        if (len(line.phrases) > 1 or top.y0 - line.y1 > near or phrase.x0 < x0 - height
                or phrase.x1 > x1 + 0.5 * (x1 - x0) or not _header(phrase, cuts, rows)):
            break
        top = line
    pad = PAD * height
    return (x0 - pad, top.y0 - pad, x1 + pad, block[-1].y1 + pad)


def _gap(cut: float, rows: Sequence[Line]) -> float:
    """The width of the gap between columns at ``cut``: from the rightmost end of a phrase
    left of it to the leftmost start of one right of it."""
    left = max((p.x1 for row in rows for p in row.phrases if p.x1 <= cut), default=cut)
    right = min((p.x0 for row in rows for p in row.phrases if p.x0 >= cut), default=cut)
    return right - left


def _aligned(rows: Sequence[Line], height: float) -> bool:
    """Whether the phrases of ``rows`` (each of as many phrases) line up, phrase by phrase:
    their left or right edges, or their centres, within :data:`ALIGN` line heights in
    :data:`ALIGNED_SHARE` of the rows, as a table's cells do and a tree's labels do not."""
    tolerance = ALIGN * height
    for i in range(len(rows[0].phrases)):
        spans = [(p.x0, p.x1, (p.x0 + p.x1) / 2) for p in (line.phrases[i] for line in rows)]
        best = max(sum(1 for other in spans if abs(other[k] - span[k]) <= tolerance)
                   for k in range(3) for span in spans)
        if best < ALIGNED_SHARE * len(spans):
            return False
    return True


def _filled(rows: Sequence[Line], cuts: Sequence[float], height: float) -> bool:
    """Whether two columns at least hold text in half the rows, list markers not counted:
    leading columns of narrow phrases (``(5)``, ``a.``, a line number) before a column of wide
    ones are a list's or a listing's, not a table's."""
    held: Counter[int] = Counter()  # rows holding text in each column
    widths: dict[int, list[float]] = {}  # the widths of the phrases in that column alone
    for line in rows:
        for phrase in line.phrases:
            first, last = phrase_columns(phrase, cuts)
            held.update(range(first, last + 1))
            if first == last:
                widths.setdefault(first, []).append(phrase.x1 - phrase.x0)
    order = sorted(held)
    wide = [c for c in order if max(widths.get(c, [math.inf])) > MARKER * height]
    start = wide[0] if wide else order[0]
    return sum(1 for c in order if c >= start and held[c] >= 0.5 * len(rows)) >= 2


def _header(phrase: Phrase, cuts: Sequence[float], rows: Sequence[Line]) -> bool:
    """Whether a line of one ``phrase`` above the ``rows`` reads as their header: it lies
    right of the first column (a group label), or each gap between columns that it crosses
    holds one of its word spaces (headers set close together); a caption's words run on
    across the gaps."""
    if phrase.x0 >= cuts[0]:
        return True
    for cut in cuts:
        if not phrase.x0 < cut < phrase.x1:
            continue
        left = max((p.x1 for row in rows for p in row.phrases if p.x1 <= cut), default=cut)
        right = min((p.x0 for row in rows for p in row.phrases if p.x0 >= cut), default=cut)
        if not any(a < right and left < b for a, b, _ in phrase.spaces):
            return False
    return True


SPECK = 0.4
"""A blob lower than this share of the median blob is a speck (a dot, a comma, what is left
where two rules crossed): no line of its own; a dot on the line it lies on."""
INK_LINE = 1.3
"""A line of ink (a digit's or a capital's height, where no letter descends) is this much
shorter than its font's height, which a text layer's words have."""
INK_WORD = "·"
"""The text of an ink blob standing in for a word (its text is not read here)."""


def ink_word_boxes(gray: Any) -> list[list[Any]]:
    """The word blobs of a page image (2-D uint8, dark ink on light paper) as words
    ``[x0, y0, x1, y1, "·"]`` in pixels: its ink with the rules taken out (horizontal ones
    longer than 4% of the width, vertical ones taller than 3% of the height: longer than a
    letter's strokes), letters joined into words
    (:func:`~rayorch.pipelines.document.table_structure.ink_blobs`)."""
    height, width = gray.shape
    blobs = ink_blobs(gray, (max(40, width // 25), max(30, height // 33)))
    # A blob is as tall as its ink (a word without ascenders, a line's x-height); a text
    # layer's words are as tall as their font. Given their line's ink height, grown by
    # INK_LINE, blobs part into phrases at the same gaps as words do.
    if not blobs:
        return []
    tall = statistics.median(b[3] - b[1] for b in blobs)
    lines = text_lines([[*blob, INK_WORD] for blob in blobs if blob[3] - blob[1] >= SPECK * tall])
    out = []
    for line in lines:
        grow = (INK_LINE - 1) * (line.y1 - line.y0) / 2
        out += [[x0, line.y0 - grow, x1, line.y1 + grow, INK_WORD] for x0, x1 in line.word_spans]
        # The specks on the line are its dots and commas: words ".", so that a leader's dots
        # fill the gap between a section's title and its page, as a text layer's do.
        out += [[b[0], line.y0 - grow, b[2], line.y1 + grow, "."] for b in blobs
                if b[3] - b[1] < SPECK * tall and line.y0 <= (b[1] + b[3]) / 2 <= line.y1]
    return out


def page_tables(words: Sequence[Sequence[Any]], size_pt: tuple[float, float], gray: Any
                ) -> list[Box]:
    """The tables of a page as boxes in fractions of it: found in its text-layer ``words``
    (PDF points; page size ``size_pt``) when it has usable ones, else in the ink of ``gray``
    (its image, 2-D uint8)."""
    if words:
        scale_x, scale_y = size_pt
        boxes = find_tables(words)
    else:
        scale_y, scale_x = gray.shape
        boxes = find_tables(ink_word_boxes(gray))
    return [(max(0.0, x0 / scale_x), max(0.0, y0 / scale_y), min(1.0, x1 / scale_x),
             min(1.0, y1 / scale_y)) for x0, y0, x1, y1 in boxes]


def with_found_tables(detections: Sequence[Detection], found: Sequence[Box]) -> list[Detection]:
    """The model's ``detections`` (merged, boxes as fractions) with the ``found`` tables
    (fractions too) merged in; see the module's docstring."""
    kept = list(detections)
    claimed: set[int] = set()
    out: list[Detection] = []
    for kind, score, box in kept:
        if kind != "table":
            continue
        inside = [i for i, table in enumerate(found)
                  if box_intersection(table, box) >= HOLDS * box_area(table)]
        if len(inside) >= 2:  # the model drew one box around two tables
            out += [("table", score, found[i]) for i in inside]
            claimed.update(inside)
            continue
        same = [i for i, table in enumerate(found) if i not in claimed and box_intersection(
            table, box) >= SAME_TABLE * min(box_area(table), box_area(box))]
        for i in same:
            box = box_union(box, found[i])
        claimed.update(same)
        out.append(("table", score, box))
    added = [table for i, table in enumerate(found) if i not in claimed
             and not any(box_intersection(table, b)
                         >= SAME_TABLE * min(box_area(table), box_area(b)) for _, _, b in out)]
    tables = out + [("table", FOUND_SCORE, table) for table in added]
    others: list[Detection] = []
    for kind, score, box in kept:
        if kind == "table":
            continue
        for _, _, table in tables:
            if box_intersection(box, table) >= COVERED * box_area(box):
                break
            if box_intersection(box, table) > 0.0:
                box = _outside(box, table)
        else:
            others.append((kind, score, box))
    return tables + others


def _outside(box: Box, table: Box) -> Box:
    """The largest part of ``box`` above, below, left or right of ``table`` (a region that
    reaches into a table gives up the part inside, so no word is in both)."""
    x0, y0, x1, y1 = box
    parts = [(x0, y0, x1, min(y1, table[1])), (x0, max(y0, table[3]), x1, y1),
             (x0, y0, min(x1, table[0]), y1), (max(x0, table[2]), y0, x1, y1)]
    return max(parts, key=box_area)


__all__ = ["FOUND_SCORE", "find_tables", "ink_word_boxes", "page_tables", "with_found_tables"]
