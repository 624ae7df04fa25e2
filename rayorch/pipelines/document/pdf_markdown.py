"""A PDF text layer as Markdown, from PyMuPDF's own structures (``page.get_text("dict")``).

One pass over each page's blocks, lines and spans gives:

* headings from font size (sizes clearly above the document's body size, ranked) and
  weight (a short block whose every span is bold);
* list items (a line starting with a bullet becomes ``- ...``; numbered items stay);
* ligatures expanded (MuPDF does it when ``TEXT_PRESERVE_LIGATURES`` is off; any left
  over, e.g. from OCR, are mapped by :func:`normalise_ligatures`);
* end-of-line hyphenation joined (``hyphen-`` + ``ation`` on the next line of a block)
  when the joined word occurs elsewhere in the document, else kept with its hyphen;
* running page numbers and margin line numbers dropped (a line that is only a number,
  or ``Page N``/``N of M``/a roman numeral, in the top, bottom or side margin);
* a table of contents as a nested list, monospaced runs as fenced code
  (:mod:`rayorch.pipelines.document.pdf_structure`);
* optionally, ruled tables as pipe tables (:mod:`rayorch.pipelines.document.pdf_tables`).

Everything else keeps PyMuPDF's text and line breaks, so the words are the ones
``page.get_text()`` gives. Why no library: docs/topics/PIPELINES.md, "PDF to Markdown".

>>> normalise_ligatures("e\ufb03cient \ufb01les")
'efficient files'
>>> text_layer_quality("\ufffd\ufffd\ufffd ok")
'garbage'
"""

from __future__ import annotations

import html
import json
import re
import sys
from collections import Counter
from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import Any

from rayorch.pipelines.document.pdf_structure import code_runs, toc_entries
from rayorch.pipelines.document.pdf_tables import Table

_LIGATURES = str.maketrans({"\ufb00": "ff", "\ufb01": "fi", "\ufb02": "fl", "\ufb03": "ffi",
                            "\ufb04": "ffl", "\ufb05": "ft", "\ufb06": "st"})
BULLETS = frozenset("\u2022\u25e6\u25aa\u25ab\u2023\u2043\u2219\u25cf\u25cb\u25a0\u25a1"
                    "\u25ba\u25b6\u2013\u2014-\u00b7")
"""Bullets, dashes and middle dots that start a list item. Not ``*``: in the corpus it marks
a judged example sentence (``* Here another is.``), and LaTeX's own third-level bullet is
U+2217."""
_NUMBERED = re.compile(r"^(\(?\d{1,3}[.)]|\(?[a-z][.)]|\([ivx]{1,4}\))\s")
_PAGE_NUMBER = re.compile(
    r"^(page\s+)?\d{1,4}(\s*(/|of)\s*\d{1,4})?$|^[ivxlcdm]{1,7}$"
    "|^[-\u2013\u2014]\\s*\\d{1,4}\\s*[-\u2013\u2014]$",
    re.IGNORECASE,
)
_HYPHEN_END = re.compile(r"[^\W\d_]-$")
BAND = 0.15
"""Fraction of the page height at top and bottom where running page numbers sit."""
MARGIN = 0.09
"""Fraction of the page width at each side where line numbers sit."""
HEADING_RATIO = 1.15
"""A line at least this much larger than the body text is a heading."""
MAX_HEADING_CHARS = 120
BOLD = 16  # span flag bit: bold
MONO = 8  # span flag bit: monospaced
_MAX_NUMBER_CHARS = 24
"""A longer line is never a page or line number."""


_LIGATURE_CHARS = re.compile("[\ufb00-\ufb06]")


def normalise_ligatures(text: str) -> str:
    """Replace the Unicode ligature characters (U+FB00-FB06) by their letters."""
    # A search is ~10x cheaper than a translate, and MuPDF has expanded most ligatures already.
    return text.translate(_LIGATURES) if _LIGATURE_CHARS.search(text) else text


_BAD_CHARS = re.compile("[\ufffd\ue000-\uf8ff\U000f0000-\U0010ffff\x00-\x08\x0e-\x1f\x7f-\x9f]")


def text_layer_quality(text: str, *, garbage_share: float = 0.3) -> str:
    """``"usable"``, ``"empty"`` or ``"garbage"`` for one page's text layer.

    Garbage: at least ``garbage_share`` of the visible characters are U+FFFD
    (unmapped glyphs), private-use code points or control characters — the text a
    PDF without a proper ToUnicode map gives.
    """
    if not text or text.isspace():
        return "empty"
    if not _BAD_CHARS.search(text):  # the usual case: one scan, no counting
        return "usable"
    visible = len("".join(text.split()))
    bad = len(_BAD_CHARS.findall(text))
    return "garbage" if bad >= garbage_share * visible else "usable"


@dataclass(slots=True)
class Line:
    """One text line of a page: its text, dominant font size, boldness, box, MuPDF block
    and whether every span with text is monospaced."""

    text: str
    size: float
    bold: bool
    x0: float
    y0: float
    x1: float
    y1: float
    block: int
    mono: bool = False


def page_lines(page_dict: dict[str, Any]) -> list[Line]:
    """The text lines of ``page.get_text("dict")``, in PyMuPDF's block order."""
    lines: list[Line] = []
    append = lines.append
    for block in page_dict.get("blocks", ()):
        if block.get("type", 0) != 0:
            continue
        number = block.get("number", len(lines))
        for line in block.get("lines", ()):
            spans = line["spans"]
            if len(spans) == 1:  # most lines: one span, no joining or comparing
                span = spans[0]
                text = span["text"]
                if not text or text.isspace():
                    continue
                size, bold = span["size"], bool(span["flags"] & BOLD)
                mono = bool(span["flags"] & MONO)
            else:
                text = "".join([s["text"] for s in spans])
                if not text or text.isspace():
                    continue
                # The line's size is its longest span's; bold (monospaced) when every span
                # with text is.
                size, longest, bold, mono = 0.0, 0, True, True
                for s in spans:
                    span_text = s["text"]
                    chars = len(span_text)
                    if chars > longest:
                        size, longest = s["size"], chars
                    if span_text and not span_text.isspace():
                        bold = bold and bool(s["flags"] & BOLD)
                        mono = mono and bool(s["flags"] & MONO)
            x0, y0, x1, y1 = line["bbox"]
            append(Line(text, round(size, 1), bold, x0, y0, x1, y1, number, mono))
    return lines


_JSON_SCALE = 1000.0
"""MuPDF's JSON writes coordinates and sizes as ``int(value * scale)``: 0.001 pt steps."""
_HTML_SPAN = re.compile(r'(<b>)?(?:<i>)?(?:<tt>)?<span style="font-family:[^;"<>]*?(,monospace)?;'
                        r'font-size:([0-9.]+)pt;color:#[0-9a-f]+">([^<]*)</span>')
_mupdf: Any = None
_DICT_DROPS = re.compile(
    rb"\\u00|\x7f|\xc2[\x80-\x9f]|\xe2\x80[\x8b-\x8f\xa8-\xae]|\xe2\x81[\xa0-\xaf]|\xef\xbb\xbf"
    rb"|\xed[\xa0-\xbf]|\xef\xbf\xbd|\xcc[\x80-\xbf]|\xcd[\x80-\xaf]")
"""In MuPDF's JSON (UTF-8): control, zero-width and bidi format characters, lone
surrogates, U+FFFD and combining accents. PyMuPDF's dict drops glyphs whose box falls
outside the page (often these) and maps surrogates to U+FFFD; a page
with any of them is read through the dict to get the same text."""


def import_pymupdf() -> Any:
    """``import pymupdf``, without the layout-analysis plugin it imports when installed.

    PyMuPDF imports ``pymupdf.layout`` (an ONNX model: about a second per process) whenever
    the ``pymupdf_layout`` package is there; the renderer never uses it, and every render
    actor would pay it at start. It stays importable afterwards (``import pymupdf.layout``).
    """
    if "pymupdf" in sys.modules or "pymupdf.layout" in sys.modules:
        import pymupdf

        return pymupdf
    sys.modules["pymupdf.layout"] = None  # type: ignore[assignment]  # ImportError: skipped
    try:
        import pymupdf
    finally:
        del sys.modules["pymupdf.layout"]
    return pymupdf


def textpage_lines(textpage: Any) -> list[Line] | None:
    """The lines of a PyMuPDF ``TextPage``, as ``page_lines(textpage.extractDICT())`` gives
    them, from MuPDF's own JSON and HTML writers at ~60% of the cost; ``None`` when the
    two do not line up (then use :func:`page_lines`).

    MuPDF's JSON gives blocks, line boxes and texts, but only each line's first font; its
    HTML gives every span's size and weight, read only for lines with more than one span.
    Why not the dict: building it is 40% of a text page's time (docs/topics/PIPELINES.md,
    "PDF text path speed").
    """
    global _mupdf
    if _mupdf is None:
        _mupdf = import_pymupdf().mupdf
    try:
        buffer = _mupdf.fz_new_buffer(16384)
        out = _mupdf.FzOutput(buffer)
        _mupdf.fz_print_stext_page_as_json(out, textpage.this, _JSON_SCALE)
        out.fz_close_output()
        raw = _mupdf.fz_buffer_extract(buffer)
        if _DICT_DROPS.search(raw):
            return None
        blocks = json.loads(raw, strict=False)["blocks"]
        # One <p> per line, in the JSON's line order (both walk MuPDF's blocks and lines).
        html_lines = textpage.extractHTML().split("\n<p ")
        return _json_html_lines(blocks, html_lines)
    except Exception:  # anything unexpected in MuPDF's output: the dict reads this page
        return None


def _json_html_lines(blocks: list[dict[str, Any]], html_lines: list[str]) -> list[Line] | None:
    if len(html_lines) - 1 != sum(len(block.get("lines", ())) for block in blocks):
        return None
    lines: list[Line] = []
    append = lines.append
    scale = _JSON_SCALE
    index = 0
    for number, block in enumerate(blocks):
        if block.get("type") != "text":
            return None
        for line in block["lines"]:
            index += 1
            text = line["text"]
            if not text or text.isspace():
                continue
            markup = html_lines[index]
            spans = markup.count("<span")
            if spans > 1:  # size: the longest span's; bold, mono: when every span with text is
                size, longest, bold, mono, found = 0.0, 0, True, True, 0
                for bold_tag, mono_tag, span_size, span_text in _HTML_SPAN.findall(markup):
                    found += 1
                    if "&" in span_text:
                        span_text = html.unescape(span_text)
                    chars = len(span_text)
                    if chars > longest:
                        size, longest = float(span_size), chars
                    if span_text and not span_text.isspace():
                        bold = bold and bool(bold_tag)
                        mono = mono and bool(mono_tag)
                if found != spans:
                    return None
            else:
                font = line["font"]
                size, bold = font["size"] / scale, font["weight"] == "bold"
                mono = font["family"] == "monospace"
            box = line["bbox"]
            x0, y0 = box["x"] / scale, box["y"] / scale
            append(Line(text, round(size, 1), bold, x0, y0, x0 + box["w"] / scale,
                        y0 + box["h"] / scale, number, mono))
    return lines


@dataclass(frozen=True, slots=True)
class FontScale:
    """A document's body text size and the sizes that make headings (largest first)."""

    body: float
    heading_sizes: tuple[float, ...]

    def level(self, size: float) -> int | None:
        """Markdown heading level of a line of ``size`` (2 = largest; the title is 1)."""
        for rank, heading in enumerate(self.heading_sizes[:3]):
            if size >= heading - 0.25:
                return rank + 2
        return None


def size_chars(pages: Sequence[Sequence[Line]]) -> Counter[float]:
    """Characters per font size (to the half point) over some pages' lines."""
    chars: Counter[float] = Counter()
    for lines in pages:
        for line in lines:
            chars[round(line.size * 2) / 2] += len(line.text)
    return chars


def font_scale(pages: Sequence[Sequence[Line]] | Counter[float]) -> FontScale:
    """The most used size (by characters) is the body; clearly larger sizes rank headings.
    ``pages`` may be their :func:`size_chars` already."""
    chars = pages if isinstance(pages, Counter) else size_chars(pages)
    chars = +chars  # sizes whose count went to zero or below (lines taken away) are gone
    if not chars:
        return FontScale(0.0, ())
    body = chars.most_common(1)[0][0]
    total = sum(chars.values())
    # A size used for a large share of the text is body text of another kind, not a heading.
    big = sorted((s for s, n in chars.items()
                  if s >= body * HEADING_RATIO and n <= 0.2 * total), reverse=True)
    return FontScale(body, tuple(big))


def _is_page_number(line: Line, edge: bool, width: float, height: float) -> bool:
    """A number alone on a line: first/last lines in the top/bottom band, or a side margin."""
    if len(line.text) > _MAX_NUMBER_CHARS or not _PAGE_NUMBER.match(line.text.strip()):
        return False
    in_band = line.y1 <= height * BAND or line.y0 >= height * (1 - BAND)
    in_side = line.x1 <= width * MARGIN or line.x0 >= width * (1 - MARGIN)
    return (edge and in_band) or in_side


def _continues(line: Line, after: Line) -> bool:
    """Whether ``after`` is the next line of ``line``'s column: below it, starting at its
    left edge or up to an indent left of it (interleaved columns start far to one side)."""
    return after.y0 > line.y0 and line.x0 - 40.0 <= after.x0 <= line.x0 + 2.0


_FRAGMENT = re.compile(r"([^\W\d_]+)-$")
_WORD = re.compile(r"[^\W\d_]+")


class DocumentWords:
    """The text of a document's lines, case-folded at the first lookup: a word split by a
    line-end hyphen is joined only when the joined word occurs elsewhere in it (a substring
    search: one C pass per lookup, no word list built for the few lookups a document makes)."""

    def __init__(self, pages: Sequence[Sequence[Line]]) -> None:
        self._pages = pages
        self._text: str | None = None

    def __contains__(self, word: object) -> bool:
        if self._text is None:
            self._text = "\n".join([line.text for lines in self._pages for line in lines]
                                   ).casefold()
        return isinstance(word, str) and bool(word) and word in self._text


def _join_lines(lines: list[tuple[str, Line]], words: Container[str]) -> str:
    """Lines of one paragraph; a word hyphenated across a line end is joined again when the
    joined word occurs elsewhere in the document, else kept with its hyphen on one line."""
    out: list[str] = []
    previous: Line | None = None
    for text, line in lines:
        text = text.rstrip()
        if (out and previous is not None and out[-1].endswith("-") and _HYPHEN_END.search(out[-1])
                and text.lstrip()[:1].islower() and _continues(previous, line)):
            rest = text.lstrip()
            head, tail = _FRAGMENT.search(out[-1]), _WORD.match(rest)
            joined = (head.group(1) + tail.group(0)).casefold() if head and tail else ""
            out[-1] = out[-1][:-1] + rest if joined in words else out[-1] + rest
        else:
            out.append(text)
        previous = line
    return "\n".join(out)


_MARKDOWN_START = frozenset("*+#>")
_MAYBE_MARKUP = frozenset("*+#> \t\u00a0")
_ATX = re.compile(r"#{1,6}(\s|$)")


def _escaped(text: str) -> str:
    """A paragraph line that Markdown would read as a list item, heading or quote, escaped."""
    if text[:1] not in _MAYBE_MARKUP:  # most lines: one set lookup
        return text
    stripped = text.lstrip()
    first = stripped[:1]
    if first in _MARKDOWN_START and (first == ">" or stripped[1:2].isspace()
                                     or (first == "#" and _ATX.match(stripped))):
        return text[:len(text) - len(stripped)] + "\\" + stripped
    return text


def _list_item(text: str) -> str | None:
    """``- item`` for a bulleted line, the line itself for a numbered one, else ``None``."""
    stripped = text.lstrip()
    first = stripped[:1]
    if first in BULLETS and (len(stripped) == 1 or stripped[1:2].isspace()):
        return "- " + stripped[1:].strip()
    # Only a line starting "(", a digit or "x." / "x)" can be numbered: skip the regex otherwise.
    if ((first == "(" or first.isdigit() or stripped[1:2] in (".", ")"))
            and _NUMBERED.match(stripped)):
        return stripped
    return None


def _block_markdown(lines: list[Line], scale: FontScale, words: Container[str]) -> str:
    text = " ".join([line.text.strip() for line in lines]) if len(lines) <= 3 else ""
    if text and len(text) <= MAX_HEADING_CHARS:
        level = scale.level(min(line.size for line in lines)) if scale.body else None
        if (level is None and len(text) > 2 and all(line.bold for line in lines)
                and not text.endswith((".", ",", ":"))):
            level = 4
        if level is not None:
            return "#" * level + " " + text
    groups: list[tuple[bool, list[tuple[str, Line]]]] = []  # (a list item?, its lines)
    for line in lines:
        item = _list_item(line.text)
        if item is not None and len(item) <= 2 and line.text.strip() in BULLETS:
            # a bullet set apart from its text
            groups.append((True, [("-", line)]))
        elif item is not None:
            groups.append((True, [(item, line)]))
        elif groups and groups[-1][0] and groups[-1][1][-1][0] == "-":
            groups[-1] = (True, [("- " + _escaped(line.text.strip()), line)])
        elif groups and groups[-1][0]:
            groups[-1][1].append((_escaped(line.text.strip()), line))  # an item's next line
        elif groups:
            groups[-1][1].append((_escaped(line.text), line))
        else:
            groups.append((False, [(_escaped(line.text), line)]))
    return "\n".join(_join_lines(group, words) for _, group in groups)


def page_markdown(lines: list[Line], width: float, height: float, scale: FontScale,
                  tables: Sequence[Table] = (), words: Container[str] | None = None) -> str:
    """One page's Markdown: blocks separated by blank lines, tables at their place.

    ``words`` are the document's (:class:`DocumentWords`; this page's when not given), for
    joining hyphenated words. A table of contents becomes a list, monospaced runs fenced
    code (:mod:`rayorch.pipelines.document.pdf_structure`).
    """
    last = len(lines) - 1
    kept = [line for i, line in enumerate(lines) if len(line.text) > _MAX_NUMBER_CHARS
            or not _is_page_number(line, i < 2 or i > last - 2, width, height)]
    if tables:
        kept = [line for line in kept if not any(  # a line whose middle is in a table
            bx0 <= (line.x0 + line.x1) / 2 <= bx1 and by0 <= (line.y0 + line.y1) / 2 <= by1
            for (bx0, by0, bx1, by1), _ in tables)]
    if words is None:
        words = DocumentWords([kept])
    special = toc_entries(kept)  # {line index: its Markdown, "" for a consumed line}
    if any(line.mono for line in kept):
        for index, markdown in code_runs(kept).items():
            special.setdefault(index, markdown)
    parts: list[tuple[float, str]] = []
    block: list[Line] = []
    for index, line in enumerate(kept):
        if (special and index in special) or (block and line.block != block[0].block):
            if block:
                parts.append((block[0].y0, _block_markdown(block, scale, words)))
                block = []
            if special and index in special:
                parts.append((line.y0, special[index]))
                continue
        block.append(line)
    if block:
        parts.append((block[0].y0, _block_markdown(block, scale, words)))
    if tables:
        parts.extend((bbox[1], markdown) for bbox, markdown in tables)
        parts.sort(key=lambda part: part[0])
    return normalise_ligatures("\n\n".join(text for _, text in parts if text.strip()))


__all__ = [
    "BULLETS", "DocumentWords", "FontScale", "Line", "font_scale", "normalise_ligatures",
    "page_lines", "page_markdown", "size_chars", "Table", "text_layer_quality", "textpage_lines",
]
