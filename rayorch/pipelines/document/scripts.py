"""Superscripts and subscripts in OCR text, from where their glyphs sit on the line.

A recogniser reads each text line at one height (RapidOCR's PP-OCRv4 scales it to 48 px), so
the small raised ``²`` of ``km²`` comes out as a plain ``2``. The image still shows it: the
glyph is smaller than the line's digits and capitals, and sits above the line's baseline (a
subscript: below its middle). :func:`mark_scripts` looks at the ink under each character the
recogniser placed (its per-character boxes) and writes such digits and signs as their
Unicode superscript or subscript; no word list decides it.

>>> import numpy as np
>>> gray = np.full((30, 40), 255, np.uint8)
>>> gray[8:22, 2:10] = 0      # a digit: 14 px tall, on the baseline (row 21)
>>> gray[8:22, 12:20] = 0     # another
>>> gray[8:16, 22:27] = 0     # a small raised one
>>> chars = [("1", (2, 5, 10, 25)), ("0", (12, 5, 20, 25)), ("2", (21, 5, 28, 25))]
>>> mark_scripts(gray, (0, 5, 30, 25), "102", chars)
'10²'
"""

from __future__ import annotations

import statistics
import unicodedata
from collections.abc import Sequence
from typing import Any

from rayorch.pipelines.document.boxes import Box

_MINUS = "\N{MINUS SIGN}"
_PLAIN = "0123456789+-" + _MINUS + "=()"
SUPERSCRIPTS = dict(zip(_PLAIN, "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁻⁼⁽⁾", strict=True))
SUBSCRIPTS = dict(zip(_PLAIN, "₀₁₂₃₄₅₆₇₈₉₊₋₋₌₍₎", strict=True))
SCRIPTS = frozenset(SUPERSCRIPTS.values()) | frozenset(SUBSCRIPTS.values())

SMALL = 0.75
"""A superscript or subscript glyph is at most this share of the line's cap height tall (a
text digit is the whole cap height; Helvetica's ``²`` is 0.55 of it)."""
DIGIT_LEAST = 0.4
"""A superscript or subscript digit is this share of the cap height tall at least (a comma or
a point under a misplaced character box is less)."""
RAISED = 0.6
"""A superscript's middle lies this share of the cap height above the baseline at least (a
text digit's middle: 0.5; a hyphen's: 0.35; Helvetica's ``²``: 0.7)."""
LOWERED = 0.25
"""A subscript's middle lies at most this share of the cap height above the baseline."""

CORE_INK = 100
"""Pixels darker than this are a glyph's core."""

_CAPS = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZbdfhklt")
"""Characters whose glyph rises from the baseline to about the cap height."""
_ON_BASELINE = _CAPS | frozenset("acemnorsuvwxz")
"""Characters whose glyph sits on the baseline (no descender)."""


def mark_scripts(gray: Any, line: Box, text: str, chars: Sequence[tuple[str, Box]]) -> str:
    """``text`` with the digits and signs whose glyphs are small and raised (lowered) on
    their line written as superscripts (subscripts).

    ``gray`` is a 2-D uint8 array, dark ink on light paper; ``line`` the line's box and
    ``chars`` the recogniser's characters of ``text`` in order, each with its box, all in
    ``gray``'s pixels. A line whose characters do not spell ``text``, or that shows too few
    glyphs to find its baseline and cap height, is left as it is.
    """
    if len(chars) != len(text) or "".join(c for c, _ in chars) != text:
        return text
    if not any(c in SUPERSCRIPTS for c in text):
        return text
    glyphs = _glyphs(gray, line)
    if not glyphs:
        return text
    under = [None if c.isspace() else _glyph_under(glyphs, box) for c, box in chars]
    # One blob of ink may hold several characters (a ``²`` that touches the ``m`` before
    # it): each of them gets the blob's darker core under it (the anti-aliased edges that
    # join two glyphs are lighter). Cutting the blob at the characters' columns instead
    # cut text digits into script-like pieces (the left of a 4).
    shared = [g is not None and under.count(g) > 1 for g in under]
    cores = _glyphs(gray, line, CORE_INK) if any(shared) else []
    pieces = [_glyph_under([c for c in cores if _inside(c, g)], box)
              if split and g is not None else g
              for g, (_, box), split in zip(under, chars, shared, strict=True)]
    under = [None if split else g for g, split in zip(under, shared, strict=True)]
    bottoms = [g[3] for c, g in zip(text, under, strict=True) if c in _ON_BASELINE and g]
    tops = [g[1] for c, g in zip(text, under, strict=True) if c in _CAPS and g]
    if len(bottoms) < 2 or len(tops) < 2:
        return text
    baseline, cap = statistics.median(bottoms), statistics.median(tops)
    if baseline - cap < 4:
        return text
    out = []
    for c, glyph in zip(text, pieces, strict=True):
        out.append(_script(c, glyph, gray, baseline, cap)
                   if c in SUPERSCRIPTS and glyph is not None else c)
    return "".join(out)


def fold_width(text: str) -> str:
    """``text`` NFKC-folded (the recogniser answers full-width commas and points), its
    superscripts and subscripts kept."""
    return "".join(c if c in SCRIPTS else unicodedata.normalize("NFKC", c) for c in text)


def _script(c: str, glyph: Box, gray: Any, baseline: float, cap: float) -> str:
    """``c`` as a superscript or subscript when ``glyph`` (its ink) is one on its line."""
    height = baseline - cap
    if not (DIGIT_LEAST if c.isdigit() else 0.0) * height <= glyph[3] - glyph[1] \
            <= SMALL * height:
        return c
    middle = baseline - (glyph[1] + glyph[3]) / 2
    # A script has blank paper between it and the line's baseline (its cap line): a piece
    # of a text digit (a 5's bar, a 9's bowl) has the rest of it there.
    if middle >= RAISED * height and _blank(gray, glyph, glyph[3], baseline):
        return SUPERSCRIPTS[c]
    if (middle <= LOWERED * height and c not in ("-", _MINUS)
            and _blank(gray, glyph, cap, glyph[1])):
        return SUBSCRIPTS[c]
    return c


def _blank(gray: Any, glyph: Box, top: float, bottom: float) -> bool:
    """Whether no ink lies between rows ``top`` and ``bottom`` in the glyph's columns (less
    a pixel each side, where a neighbour's anti-aliased edge may reach)."""
    import numpy as np

    band = np.asarray(gray[int(top) + 1:int(bottom), int(glyph[0]) + 1:int(glyph[2]) - 1])
    return bool(band.size == 0 or band.min() >= 160)


def _inside(inner: Box, outer: Box) -> bool:
    return (outer[0] <= inner[0] and inner[2] <= outer[2] and outer[1] <= inner[1]
            and inner[3] <= outer[3])


def _glyphs(gray: Any, line: Box, ink: int = 160) -> list[Box]:
    """The blobs of pixels darker than ``ink`` inside ``line`` (bottom and right edges
    inclusive), in ``gray``'s pixels; rules crossing the whole line, and specks, left
    out."""
    import cv2
    import numpy as np

    height, width = gray.shape[:2]
    x0, y0 = max(0, int(line[0])), max(0, int(line[1]))
    x1, y1 = min(width, int(line[2]) + 1), min(height, int(line[3]) + 1)
    if x1 - x0 < 2 or y1 - y0 < 4:
        return []
    patch = (np.asarray(gray[y0:y1, x0:x1]) < ink).astype(np.uint8)
    count, _, stats, _ = cv2.connectedComponentsWithStats(patch, connectivity=8)
    glyphs: list[Box] = []
    for x, y, w, h, area in stats[1:count].tolist():
        if area < 3 or h >= y1 - y0 - 1 or w > 2 * (y1 - y0):
            continue  # a speck, a vertical rule through the line, a horizontal rule
        glyphs.append((float(x + x0), float(y + y0), float(x + x0 + w), float(y + y0 + h)))
    return glyphs


def _glyph_under(glyphs: Sequence[Box], box: Box) -> Box | None:
    """The glyph that overlaps the character's box most (its middle inside the box's reach,
    or half the box or the glyph over it: one blob may hold two characters), or ``None``."""
    best, overlap = None, 0.0
    for glyph in glyphs:
        middle = (glyph[0] + glyph[2]) / 2
        shared = min(glyph[2], box[2]) - max(glyph[0], box[0])
        if not (box[0] - 1 <= middle <= box[2] + 1
                or shared >= 0.5 * min(box[2] - box[0], glyph[2] - glyph[0])):
            continue
        if shared > overlap:
            best, overlap = glyph, shared
    return best


__all__ = ["SCRIPTS", "SUBSCRIPTS", "SUPERSCRIPTS", "fold_width", "mark_scripts"]
