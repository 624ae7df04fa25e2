"""Table pages of many styles with cell-level ground truth, and their scanned copies.

Each page is drawn cell by cell with PyMuPDF (so the truth is known, never read back from
the PDF): a heading, a paragraph, then one table (two on some pages) in one of the styles
below, sometimes with notes under it, then a paragraph. Styles:

* ``ruled``: a rule around every cell; ``booktabs``: rules above, under the header and below;
* ``unruled``: no rule at all; ``zebra``: every other row on a grey band;
* a cell padding of 1.5 to 3.5 points, 4 or 8 more between columns, and a font size of
  7.5 to 9.5 points (dense tables);
* any style may have a two-level header (a group label spanning two columns, the first
  column's header spanning both header rows), a first column whose labels wrap over two
  lines, numeric columns with units (right-aligned), notes under the table.

The truth of a table: its box (PDF points, notes included when it has notes, as a layout
model's box often is) and its cells ``[row, column, rowspan, colspan, text]``.

    from bench.table_set import build_set
    pages = build_set(Path(".cache/table_set"), count=24)  # [(pdf, scan pdf, truth)]
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

SET_VERSION = 3
SCAN_DPI = 150
PAGE = (612.0, 792.0)
STYLES = ("ruled", "booktabs", "unruled", "zebra")
LABELS = ["North", "South", "East", "West", "Central", "Coastal", "Upland", "Metro",
          "Rural", "Island", "Border", "Delta", "Valley", "Plains", "Harbour", "Forest"]
LONG_LABELS = ["Northern coastal districts", "Southern upland municipalities",
               "Eastern metropolitan area", "Western rural counties",
               "Central river valley towns", "Island and harbour communities",
               "Border region settlements", "Delta farming parishes"]
MEASURES = [("Population", "k"), ("Area", "km²"), ("Output", "t"), ("Income", "USD"),
            ("Growth", "%"), ("Exports", "EUR m"), ("Rainfall", "mm"), ("Density", "/km²")]
FILLER = ["the", "survey", "covers", "every", "district", "of", "the", "region", "and",
          "reports", "figures", "for", "the", "calendar", "year", "with", "revisions", "noted",
          "where", "the", "statistical", "office", "changed", "its", "method"]
FONT, SIZE, LEADING, PAD = "helv", 8.5, 10.5, 3.5


def _number(rng: random.Random, unit: str) -> str:
    value = rng.uniform(0.5, 9999)
    text = f"{value:,.1f}" if rng.random() < 0.5 else f"{int(value):,}"
    return f"{text} {unit}" if rng.random() < 0.5 else text


def describe(seed: int) -> dict[str, Any]:
    """One page's description: its tables, each with style, header, body and notes."""
    rng = random.Random(seed)
    tables = []
    for _ in range(2 if rng.random() < 0.25 else 1):
        columns = rng.randint(3, 5) if len(tables) == 0 else 3
        measures = rng.sample(MEASURES, columns - 1)
        wrap = rng.random() < 0.4
        spanning = rng.random() < 0.4 and columns >= 3
        rows = rng.randint(4, 9 if len(tables) == 0 else 5)
        labels = rng.sample(LONG_LABELS if wrap else LABELS, min(rows, 8 if wrap else 16))
        body = [[label] + [_number(rng, unit) for _, unit in measures] for label in labels]
        header = [["Region"] + [f"{name} ({unit})" for name, unit in measures]]
        if spanning:  # a group label over columns 1-2, the first header over both rows
            header = [["Region", "Group A", "", *[""] * (columns - 3)],
                      ["", *[f"{name} ({unit})" for name, unit in measures]]]
            if columns > 3:
                header[0][3:] = ["Other"] + [""] * (columns - 4)
        notes = (["Note: figures are provisional and rounded.",
                  "Source: national statistical office, annual survey."]
                 if rng.random() < 0.4 else [])
        tables.append({"style": rng.choice(STYLES), "header": header, "body": body,
                       "spanning": spanning, "wrap": wrap, "notes": notes,
                       "pad": rng.choice((1.5, 2.5, 3.5)), "size": rng.choice((7.5, 8.5, 9.5)),
                       "gutter": rng.choice((4.0, 8.0))})
    return {"seed": seed, "heading": f"Table report {seed}", "tables": tables,
            "paragraph": " ".join(rng.choice(FILLER) for _ in range(60))}


def table_cells(table: dict[str, Any]) -> list[list[Any]]:
    """The truth cells ``[row, column, rowspan, colspan, text]`` of a described table."""
    cells: list[list[Any]] = []
    width = len(table["body"][0])
    if table["spanning"]:
        cells.append([0, 0, 2, 1, "Region"])
        cells.append([0, 1, 1, 2, "Group A"])
        if width > 3:
            cells.append([0, 3, 1, width - 3, "Other"])
        cells += [[1, c, 1, 1, t] for c, t in enumerate(table["header"][1]) if c > 0]
    else:
        cells += [[0, c, 1, 1, t] for c, t in enumerate(table["header"][0])]
    top = len(table["header"])
    cells += [[top + r, c, 1, 1, t] for r, row in enumerate(table["body"])
              for c, t in enumerate(row)]
    return cells


def _lines_of(text: str, width: float, fontsize: float = SIZE) -> list[str]:
    import pymupdf

    words, lines = text.split(), [""]
    for word in words:
        trial = f"{lines[-1]} {word}".strip()
        if lines[-1] and pymupdf.get_text_length(trial, FONT, fontsize) > width:
            lines.append(word)
        else:
            lines[-1] = trial
    return lines


def draw_table(page: Any, table: dict[str, Any], top: float, left: float = 72.0
                ) -> tuple[list[float], float]:
    """Draw ``table`` at ``top``; its box (notes included) and the y under it."""
    import pymupdf

    cells = table_cells(table)
    width = len(table["body"][0])
    size, pad = table.get("size", SIZE), table.get("pad", PAD)
    leading = size * LEADING / SIZE
    length = pymupdf.get_text_length
    widths = []
    for c in range(width):
        texts = [(t, "hebo" if r < len(table["header"]) else FONT)
                 for r, col, _, span, t in cells if col == c and span == 1]
        widest = max(length(t, font, size) for t, font in texts)
        widths.append(widest + 2 * pad + table.get("gutter", 8.0))
    if table["wrap"]:
        widths[0] = 92.0
    xs = [left]
    for w in widths:
        xs.append(xs[-1] + w)
    n_rows = max(r + span for r, _, span, _, _ in cells)
    lines_per: dict[tuple[int, int], list[str]] = {}
    heights = [leading + 2 * pad] * n_rows
    for r, c, rspan, cspan, text in cells:
        inner = xs[c + cspan] - xs[c] - 2 * pad
        lines = _lines_of(text, inner, size)
        lines_per[(r, c)] = lines
        if rspan == 1:
            heights[r] = max(heights[r], len(lines) * leading + 2 * pad)
    ys = [top]
    for h in heights:
        ys.append(ys[-1] + h)
    style, header_rows = table["style"], len(table["header"])
    if style == "zebra":
        for r in range(header_rows, n_rows, 2):
            page.draw_rect(pymupdf.Rect(xs[0], ys[r], xs[-1], ys[r + 1]), color=None,
                           fill=(0.88, 0.9, 0.93))
    for r, c, rspan, cspan, _ in cells:
        x0, x1, y0 = xs[c], xs[c + cspan], ys[r]
        lines = lines_per[(r, c)]
        block = len(lines) * leading
        y = y0 + (ys[r + rspan] - y0 - block) / 2 + size
        if table.get("top"):  # set at the cell's top, not its middle
            y = y0 + pad + size
        bold = r < header_rows
        font = "hebo" if bold else FONT
        numeric = c > 0 and r >= header_rows
        for line in lines:
            w = length(line, font, size)
            if cspan > 1 or (r < header_rows and c > 0):
                x = (x0 + x1 - w) / 2
            elif numeric:
                x = x1 - pad - w
            else:
                x = x0 + pad
            page.insert_text((x, y), line, fontname=font, fontsize=size)
            y += leading
        if style == "ruled":
            page.draw_rect(pymupdf.Rect(x0, y0, x1, ys[r + rspan]), color=(0, 0, 0), width=0.5)
    if style == "booktabs":
        for y, w in ((ys[0], 1.0), (ys[header_rows], 0.5), (ys[-1], 1.0)):
            page.draw_line((xs[0], y), (xs[-1], y), color=(0, 0, 0), width=w)
        if table["spanning"]:
            page.draw_line((xs[1] + 2, ys[1]), (xs[3] - 2, ys[1]), color=(0, 0, 0), width=0.4)
    bottom = ys[-1]
    y = bottom + 4
    for note in table["notes"]:
        y += 9
        page.insert_text((xs[0], y), note, fontname=FONT, fontsize=7)
    if table["notes"]:
        bottom = y + 3
    return [xs[0] - 2, top - 2, xs[-1] + 2, bottom + 2], bottom


def render(description: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    """Draw the page into ``path``; its truth: per table, its box and cells."""
    import pymupdf

    doc = pymupdf.open()
    page = doc.new_page(width=PAGE[0], height=PAGE[1])
    page.insert_text((72, 80), description["heading"], fontname="hebo", fontsize=15)
    words = description["paragraph"].split()
    text = " ".join(words[:30])
    y = 100.0
    for line in _lines_of(text, 468, 10):
        y += 13
        page.insert_text((72, y), line, fontname=FONT, fontsize=10)
    truth = []
    y += 24
    for table in description["tables"]:
        box, _ = draw_table(page, table, y)
        truth.append({"box": box, "cells": table_cells(table), "style": table["style"],
                      "notes": bool(table["notes"]), "spanning": table["spanning"],
                      "wrap": table["wrap"]})
        y = box[3] + 30
    for line in _lines_of(" ".join(words[30:]), 468, 10):
        y += 13
        page.insert_text((72, y), line, fontname=FONT, fontsize=10)
    doc.save(path)
    doc.close()
    return truth


def scan_copy(source: Path, path: Path, dpi: int = SCAN_DPI) -> None:
    """``source`` with every page as one grayscale image at ``dpi`` and no text layer."""
    import pymupdf

    with pymupdf.open(source) as doc, pymupdf.open() as out:
        for page in doc:
            pix = page.get_pixmap(dpi=dpi, colorspace=pymupdf.csGRAY)
            new = out.new_page(width=page.rect.width, height=page.rect.height)
            new.insert_image(new.rect, stream=pix.tobytes("png"))
        out.save(path)


def build_set(directory: Path, count: int = 24, first_seed: int = 1000
              ) -> list[tuple[Path, Path, list[dict[str, Any]]]]:
    """``count`` pages (one PDF each), their scans and truths, built once into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for seed in range(first_seed, first_seed + count):
        pdf, scan = directory / f"t{seed}.pdf", directory / f"t{seed}-scan.pdf"
        label = directory / f"t{seed}.json"
        if label.exists() and json.loads(label.read_text()).get("version") == SET_VERSION:
            truth = json.loads(label.read_text())["tables"]
        else:
            truth = render(describe(seed), pdf)
            scan_copy(pdf, scan)
            label.write_text(json.dumps({"version": SET_VERSION, "tables": truth}))
        out.append((pdf, scan, truth))
    return out


__all__ = ["build_set", "describe", "draw_table", "render", "scan_copy", "table_cells"]
