"""Page structures that span several text lines: the title, a table of contents, code.

Each takes the lines of :func:`rayorch.pipelines.document.pdf_markdown.page_lines` (in MuPDF's
order) and says which of them it consumes:

* :func:`title_lines`: page 1's largest-size lines, taken together (a title set on two or
  three lines is one title, and it is the document's ``#``, not a heading again), and
  :func:`byline_lines`: the centered lines under it (authors, date), text, not headings;
* :func:`toc_entries`: on a page that has a "Contents" line or several dot-leader lines,
  the rows that end in a page number (MuPDF splits ``1.1``, the title, the leaders and the
  number into lines of their own: they are put together by baseline) become one nested
  list, without leaders and page numbers;
* :func:`code_runs`: consecutive lines set wholly in a monospaced font become one fenced
  block, lines on one baseline joined (a comment beside its code), indentation kept from
  the x position, and bare listing line numbers beside the code dropped.

Why these rules: docs/topics/PIPELINES.md, "PDF to Markdown".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol


class _Line(Protocol):  # pdf_markdown.Line; a protocol keeps this module import-free
    text: str
    size: float
    x0: float
    y0: float
    x1: float
    y1: float
    block: int
    bold: bool
    mono: bool


_CONTENTS = frozenset({"contents", "table of contents", "inhaltsverzeichnis", "inhalt",
                       "table des matières", "sommaire", "índice", "indice", "list of figures",
                       "list of tables"})
_PAGE_REF = re.compile(r"(?:\d{1,4}|[ivxlc]{1,6})$", re.IGNORECASE)
_LEADER_CHARS = " .\u2026\u00b7"
_DIGITS = re.compile(r"^\d{1,4}$")
_SECTION_START = re.compile(r"^(?:\d{1,3}(?:\.\d{1,3})*\.?|[A-Z](?:\.\d{1,3})+\.?|[IVX]{1,5}\.?)\s")
_TITLE_LINES = 4
_BYLINE_LINES = 6
MIN_TOC_ENTRIES = 3


def title_lines(lines: Sequence[_Line], body: float) -> list[int]:
    """Indices of page 1's title: the first line of the page's largest size (at least
    1.15x ``body``) and the lines right below it in that size; ``[]`` when none."""
    sizes = [line.size for line in lines if sum(c.isalpha() for c in line.text) >= 2]
    if not sizes or max(sizes) < body * 1.15:
        return []
    top = max(sizes)
    chosen: list[int] = []
    for i, line in enumerate(lines):
        big = abs(line.size - top) <= 0.5 and sum(c.isalpha() for c in line.text) >= 2
        if not chosen:
            if big:
                chosen.append(i)
            continue
        last = lines[chosen[-1]]
        if not big or line.y0 - last.y1 > line.size or len(chosen) == _TITLE_LINES:
            break
        chosen.append(i)
    return chosen


def byline_lines(lines: Sequence[_Line], title: Sequence[int], body: float, width: float
                 ) -> list[int]:
    """Indices of the lines larger than the body and not bold right after a title (authors,
    affiliations, a date: what LaTeX's ``\\maketitle`` sets), up to the first bold line or
    body text line (body size, over 40% of the page wide); at most six. They are text, not
    headings."""
    found: list[int] = []
    for i in range(title[-1] + 1 if title else len(lines), len(lines)):
        line = lines[i]
        if line.bold or len(found) == _BYLINE_LINES:
            break
        if line.size >= body * 1.15:
            found.append(i)
        elif line.x1 - line.x0 > 0.4 * width:
            break
    return found


def _rows(lines: Sequence[_Line], indices: Sequence[int]) -> list[list[int]]:
    """Consecutive lines on one baseline, left to right, as rows of line indices."""
    rows: list[list[int]] = []
    for i in indices:
        line = lines[i]
        if rows:
            last = lines[rows[-1][-1]]
            if abs(line.y1 - last.y1) <= 0.35 * max(line.size, 1.0) and line.x0 >= last.x0:
                rows[-1].append(i)
                continue
        rows.append([i])
    return rows


def entry_parts(text: str) -> tuple[str, bool, bool]:
    """A TOC row's title (leaders and page number off), whether it ends in a page number,
    and whether it has dot leaders (string operations: no regex runs over the leaders)."""
    parts = text.rsplit(None, 1)
    numbered = len(parts) == 2 and len(parts[1]) <= 6 and _PAGE_REF.match(parts[1]) is not None
    body = parts[0] if numbered else text.rstrip()
    title = body.rstrip(_LEADER_CHARS)
    tail = body[len(title):]
    leaders = tail.count(".") + tail.count("\u00b7") + 3 * tail.count("\u2026") >= 3
    return title.strip(), numbered, leaders


def _row_text(lines: Sequence[_Line], row: Sequence[int]) -> str:
    return " ".join(" ".join(lines[i].text.split()) for i in row)


_CONTENTS_WORDS = ("contents", "inhalt", "mati\u00e8res", "sommaire", "ndice", "list of")
_LEADER_MARKS = (". . .", "...", "\u2026", "\u00b7\u00b7")


def is_toc_page(lines: Sequence[_Line]) -> bool:
    """A "Contents" line, or at least three dot-leader lines. This runs on every page, so
    the page's text is first searched as a whole (a few substring searches, in C); lines
    are looked at only on a page that has one of the words or leaders."""
    text = "\n".join([line.text for line in lines])
    folded = text.casefold()
    if not any(word in folded for word in _CONTENTS_WORDS) and sum(
            text.count(mark) for mark in _LEADER_MARKS) < MIN_TOC_ENTRIES:
        return False
    leaders = 0
    for line in lines:
        text = line.text
        if len(text) <= 24 and text.strip().casefold() in _CONTENTS:
            return True
        tail = text[-12:]
        if (". ." in tail or ".." in tail or "\u2026" in tail or "\u00b7" in tail) and (
                entry_parts(text)[2]):
            leaders += 1
            if leaders >= MIN_TOC_ENTRIES:
                return True
    return False


def _section_start(lines: Sequence[_Line], row: Sequence[int], text: str) -> bool:
    """A row that starts as a TOC entry does: a section number (``2``, ``2.3.1``, ``A.1``,
    ``IV``) or, unnumbered, set all in bold (LaTeX's chapter-level entries)."""
    return bool(_SECTION_START.match(text)) or all(lines[i].bold for i in row)


def _is_index(texts: list[str]) -> bool:
    """Leader rows ending in page lists (``1730, 1733``): an index, not a TOC."""
    lists = sum(1 for t in texts if (". ." in t or "..." in t) and "," in t[-16:])
    return lists >= MIN_TOC_ENTRIES


def toc_entries(lines: Sequence[_Line]) -> dict[int, str]:
    """On a TOC page: ``{index of an entry's first line: the TOC's Markdown list}`` for
    each run of entries, every line of an entry consumed (its index maps to ``""``).

    An entry is a row ending in a page number, with dot leaders, or, after a "Contents"
    line on the same page, starting as an entry does (:func:`_section_start`); one that
    wraps is joined with its first line. An index (page lists after leaders) is left alone,
    as are rows that only end in a margin line number."""
    if not is_toc_page(lines):
        return {}
    rows = _rows(lines, range(len(lines)))
    texts = [_row_text(lines, row) for row in rows]
    if _is_index(texts):
        return {}
    out: dict[int, str] = {}
    run: list[tuple[float, str, list[int]]] = []  # (x0, text, line indices)
    pending: list[int] = []  # the first line of an entry that wraps
    contents = False  # a "Contents" line above, and no text since its entries

    def flush() -> None:
        if len(run) >= MIN_TOC_ENTRIES or (run and contents):
            lefts = sorted({round(x0 / 4) for x0, _, _ in run})
            items = []
            for x0, text, _ in run:
                depth = min(lefts.index(round(x0 / 4)), 3)
                items.append("  " * depth + "- " + text)
            first = run[0][2][0]
            for _, _, indices in run:
                for i in indices:
                    out[i] = ""
            out[first] = "\n".join(items)
        run.clear()

    for k, row in enumerate(rows):
        if not row:
            continue
        text = texts[k]
        title, numbered, leaders = entry_parts(text)
        if not numbered and leaders and k + 1 < len(rows) and _DIGITS.match(texts[k + 1]):
            row = row + rows[k + 1]  # the page number wrapped to a line of its own
            text = f"{text} {texts[k + 1]}"
            rows[k + 1] = []
            title, numbered, leaders = entry_parts(text)
        if text.casefold() in _CONTENTS:
            flush()
            contents, pending = True, []
            continue
        starts = _section_start(lines, pending or row,
                                _row_text(lines, pending) if pending else text)
        if (numbered and title and not _DIGITS.match(title) and len(text) <= 200
                and (leaders or (contents and starts))):
            indices = pending + row
            full = f"{_row_text(lines, pending)} {title}" if pending else title
            run.append((lines[indices[0]].x0, full, indices))
            pending = []
            continue
        if (contents or run) and not pending and not leaders and starts:
            pending = list(row)  # perhaps the first line of a long entry
            continue
        if run:  # the TOC's entries ended: the rest of the page is text
            contents = False
        flush()
        pending = []
    flush()
    return out


def _char_width(lines: Sequence[_Line]) -> float:
    widths = sorted((line.x1 - line.x0) / len(line.text) for line in lines if line.text.strip())
    return max(widths[len(widths) // 2], 1.0) if widths else 6.0


def code_runs(lines: Sequence[_Line]) -> dict[int, str]:
    """``{index of a code run's first line: its fenced block}``, every other line of the
    run mapped to ``""``: runs of at least two monospaced lines, or one that fills its
    MuPDF block alone."""
    out: dict[int, str] = {}
    run: list[int] = []
    count = len(lines)

    def alone(index: int) -> bool:  # the only line of its MuPDF block
        block = lines[index].block
        return all(lines[j].block != block for j in (index - 1, index + 1) if 0 <= j < count)

    def flush() -> None:
        if not run:
            return
        monos = [i for i in run if lines[i].mono]
        if len(monos) >= 2 or (len(monos) == 1 and alone(monos[0])):
            out.update(dict.fromkeys(run, ""))
            out[run[0]] = fence([lines[i] for i in monos])
        run.clear()

    for i, line in enumerate(lines):
        if line.mono:
            run.append(i)
        elif (i + 1 < count and lines[i + 1].mono and _DIGITS.match(line.text.strip())
              and abs(lines[i + 1].y1 - line.y1) <= 0.35 * line.size
              and lines[i + 1].x0 > line.x1):
            run.append(i)  # a listing's line number beside its line: dropped
        elif run:
            flush()
    flush()
    return out


def fence(code: Sequence[_Line]) -> str:
    """Monospaced lines as a fenced block: rows by baseline, indentation by x position."""
    width = _char_width(code)
    left = min(line.x0 for line in code)
    rows: list[str] = []
    last: _Line | None = None
    for line in code:
        text = line.text.rstrip()
        if last is not None and abs(line.y1 - last.y1) <= 0.35 * line.size and line.x0 > last.x0:
            gap = max(1, round((line.x0 - last.x1) / width))
            rows[-1] += " " * gap + text.lstrip()
        else:
            rows.append(" " * max(0, round((line.x0 - left) / width)) + text)
        last = line
    fences = "````" if any("```" in row for row in rows) else "```"
    return "\n".join([fences, *rows, fences])


__all__ = ["byline_lines", "code_runs", "entry_parts", "fence", "is_toc_page", "title_lines",
           "toc_entries"]
