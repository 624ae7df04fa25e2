"""Generated documents with known structure, and their scanned copies (PyMuPDF, Pillow).

:func:`write_structured_pdf` writes a one-page report with a title, a section heading, body
text, a ruled table and a raster figure with its caption, and returns what a converter
should find (its labels). :func:`write_scanned_copy` turns any PDF into a scan of itself:
every page an image, no text layer. Used by the layout suite and the benchmarks.
"""

from __future__ import annotations

import importlib
import io
from pathlib import Path
from typing import Any

TABLE_ROWS = [["Region", "Units", "Revenue"], ["North", "1200", "34.5"],
              ["South", "950", "28.1"], ["East", "1430", "41.9"], ["West", "780", "22.4"]]
TITLE = "Quarterly Field Report"
HEADINGS = ["Measured Sales by Region", "Sensor Overview"]
BODY = ("The survey covered four regions over twelve weeks. Each office reported the units "
        "shipped and the revenue booked, in thousands, at the end of the quarter.")


def _figure_png(width: int = 480, height: int = 300) -> bytes:
    """A raster figure: a colour gradient with a few filled shapes (no text in it)."""
    image_module: Any = importlib.import_module("PIL.Image")
    draw_module: Any = importlib.import_module("PIL.ImageDraw")
    image = image_module.new("RGB", (width, height))
    pixels = image.load()
    for x in range(width):
        for y in range(height):
            pixels[x, y] = (40 + x * 200 // width, 90 + y * 120 // height, 200 - x * 120 // width)
    draw = draw_module.Draw(image)
    draw.ellipse((60, 60, 200, 200), fill=(230, 80, 40))
    draw.rectangle((260, 90, 420, 250), fill=(30, 160, 90))
    draw.polygon([(140, 280), (240, 150), (340, 280)], fill=(250, 220, 60))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _wrapped(page: Any, x: float, y: float, width: float, text: str, size: float) -> float:
    """Insert ``text`` wrapped to ``width`` from ``(x, y)``; the baseline after it."""
    pymupdf: Any = importlib.import_module("pymupdf")
    line = ""
    for word in text.split():
        trial = f"{line} {word}".strip()
        if pymupdf.get_text_length(trial, fontname="helv", fontsize=size) > width and line:
            page.insert_text((x, y), line, fontname="helv", fontsize=size)
            y += size * 1.45
            line = word
        else:
            line = trial
    if line:
        page.insert_text((x, y), line, fontname="helv", fontsize=size)
        y += size * 1.45
    return y


def write_structured_pdf(path: str | Path) -> dict[str, Any]:
    """A one-page report at ``path``; returns its labels: ``title``, ``headings``,
    ``table`` (rows of cells, header first) and ``figures`` (how many)."""
    pymupdf: Any = importlib.import_module("pymupdf")
    with pymupdf.open() as doc:
        page = doc.new_page(width=612, height=792)
        page.insert_text((72, 90), TITLE, fontname="hebo", fontsize=24)
        y = _wrapped(page, 72, 130, 468, BODY, 11)
        page.insert_text((72, y + 20), HEADINGS[0], fontname="hebo", fontsize=16)
        top, row_h, col_w = y + 40, 24.0, 156.0
        for r, row in enumerate(TABLE_ROWS):
            for c, cell in enumerate(row):
                page.insert_text((72 + c * col_w + 8, top + r * row_h + 16), cell,
                                 fontname="hebo" if r == 0 else "helv", fontsize=11)
        bottom = top + len(TABLE_ROWS) * row_h
        for r in range(len(TABLE_ROWS) + 1):
            page.draw_line((72, top + r * row_h), (72 + 3 * col_w, top + r * row_h), width=0.8)
        for c in range(4):
            page.draw_line((72 + c * col_w, top), (72 + c * col_w, bottom), width=0.8)
        page.insert_text((72, bottom + 40), HEADINGS[1], fontname="hebo", fontsize=16)
        figure = pymupdf.Rect(72, bottom + 60, 72 + 320, bottom + 60 + 200)
        page.insert_image(figure, stream=_figure_png())
        page.insert_text((72, figure.y1 + 20), "Figure 1: Sensor readings across the field.",
                         fontname="helv", fontsize=10)
        doc.save(str(path))
    return {"title": TITLE, "headings": list(HEADINGS), "table": [list(r) for r in TABLE_ROWS],
            "figures": 1}


def write_scanned_copy(source: str | Path, path: str | Path, *, dpi: int = 150) -> str:
    """``source`` as a scan at ``path``: every page rendered at ``dpi`` and saved as an
    image-only page of the same size (no text layer). Returns ``path``."""
    pymupdf: Any = importlib.import_module("pymupdf")
    with pymupdf.open(str(source)) as src, pymupdf.open() as doc:
        for page in src:
            pixmap = page.get_pixmap(dpi=dpi)
            target = doc.new_page(width=page.rect.width, height=page.rect.height)
            target.insert_image(target.rect, pixmap=pixmap)
        doc.save(str(path))
    return str(path)


__all__ = ["HEADINGS", "TABLE_ROWS", "TITLE", "write_scanned_copy", "write_structured_pdf"]
