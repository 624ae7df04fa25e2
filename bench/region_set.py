"""A labeled set for the region grain: headings, ruled tables and a raster figure, plus scans.

Each document is a seeded description (a title, two section headings, paragraphs, two ruled
5x3 tables and one raster bar chart with its caption) laid out as HTML on A4 by PyMuPDF's
``Story``; its scanned copy has every page as one 150-dpi grayscale image and no text layer.
The labels come from the description, never from the PDF:

    from bench.region_set import build_set
    docs = build_set(Path(".cache/region_set"))   # [(pdf, scanned pdf, labels)], built once

Labels: ``{"title", "headings": [[level, text]], "tables": [[[cell, ...], ...]],
"figures": n}`` (a table is its rows, header row first).
"""

from __future__ import annotations

import io
import json
import random
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.markdown_set import BORDER, WORDS  # noqa: E402

SET_VERSION = 1
"""Bumped whenever the generator changes, so a cached set is rebuilt."""
DOCUMENTS = 3
SCAN_DPI = 150
FIGURE = "figure.png"


def _words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def _paragraph(rng: random.Random, sentences: tuple[int, int] = (3, 5)) -> str:
    out = []
    for _ in range(rng.randint(*sentences)):
        text = _words(rng, 8, 16)
        out.append(text[0].upper() + text[1:] + ".")
    return " ".join(out)


def _title(rng: random.Random, low: int, high: int) -> str:
    return " ".join(w.capitalize() for w in _words(rng, low, high).split())


def _table(rng: random.Random, rows: int = 5, cols: int = 3) -> list[list[str]]:
    header = [w.capitalize() for w in rng.sample(WORDS, cols)]
    body = [[rng.choice(WORDS) if col == 0 else str(rng.randint(1, 999)) for col in range(cols)]
            for _ in range(rows - 1)]
    return [header, *body]


def describe(seed: int) -> dict[str, Any]:
    """The seeded description of one document: a title and its parts in order."""
    rng = random.Random(seed)
    first, second = _title(rng, 2, 4), _title(rng, 2, 4)
    caption = f"Figure 1: {_title(rng, 3, 5)}"
    parts: list[tuple[str, Any]] = [
        ("p", _paragraph(rng)),
        ("h2", f"1 {first}"), ("p", _paragraph(rng)), ("table", _table(rng)),
        ("p", _paragraph(rng, (2, 3))), ("figure", {"seed": seed, "caption": caption}),
        ("h2", f"2 {second}"), ("p", _paragraph(rng)), ("table", _table(rng)),
        ("p", _paragraph(rng, (2, 4))),
    ]
    return {"title": _title(rng, 3, 6), "parts": parts}


def one_page(seed: int = 7) -> dict[str, Any]:
    """A one-page description: a title, a paragraph, a ruled 5x3 table, a paragraph and a
    raster figure with its caption (what tests/layout reads)."""
    rng = random.Random(seed)
    caption = f"Figure 1: {_title(rng, 3, 5)}"
    return {"title": _title(rng, 3, 5), "parts": [
        ("p", _paragraph(rng, (2, 3))), ("table", _table(rng)), ("p", _paragraph(rng, (2, 3))),
        ("figure", {"seed": seed, "caption": caption})]}


def figure_png(seed: int, width: int = 480, height: int = 280) -> bytes:
    """A raster bar chart (RGB PNG): what a figure in a scanned report looks like."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    bars = 8
    for k in range(bars):
        top = rng.randint(30, height - 40)
        left = 30 + k * (width - 50) // bars
        draw.rectangle([left, top, left + (width - 50) // bars - 10, height - 25],
                       fill=(rng.randint(20, 200), rng.randint(60, 160), rng.randint(120, 240)))
    draw.line([20, height - 25, width - 10, height - 25], fill="black", width=3)
    draw.line([20, 10, 20, height - 25], fill="black", width=3)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def to_html(description: dict[str, Any]) -> str:
    """The HTML of a description (what ``Story`` lays out; the figure is ``figure.png``)."""
    import html

    esc = html.escape
    out = [f"<h1>{esc(description['title'])}</h1>"]
    for kind, value in description["parts"]:
        if kind == "table":
            rows = []
            for i, row in enumerate(value):
                tag = "th" if i == 0 else "td"
                rows.append("<tr>" + "".join(f'<{tag} style="{BORDER}">{esc(cell)}</{tag}>'
                                             for cell in row) + "</tr>")
            out.append('<table style="border-collapse: collapse">' + "".join(rows) + "</table>")
        elif kind == "figure":
            out.append(f'<p><img src="{FIGURE}" width="300"/></p>')
            out.append(f"<p>{esc(value['caption'])}</p>")
        else:
            out.append(f"<{kind}>{esc(value)}</{kind}>")
    return "\n".join(out)


def labels(description: dict[str, Any]) -> dict[str, Any]:
    """What a reader sees in the rendered document: title, headings, tables, figures."""
    found: dict[str, Any] = {"title": description["title"], "headings": [], "list_items": [],
                             "code": [], "tables": [], "figures": 0}
    for kind, value in description["parts"]:
        if kind == "h2":
            found["headings"].append([2, value])
        elif kind == "table":
            found["tables"].append(value)
        elif kind == "figure":
            found["figures"] += 1
    return found


def render(description: dict[str, Any], path: Path) -> None:
    """Lay the description out on A4 pages with PyMuPDF's ``Story``."""
    import pymupdf

    figure = next(v for k, v in description["parts"] if k == "figure")
    archive = pymupdf.Archive()
    archive.add(figure_png(figure["seed"]), FIGURE)
    story = pymupdf.Story(html=to_html(description), archive=archive)
    writer = pymupdf.DocumentWriter(str(path))
    mediabox = pymupdf.paper_rect("a4")
    where = pymupdf.Rect(72, 72, mediabox.width - 72, mediabox.height - 72)
    more = 1
    while more:
        device = writer.begin_page(mediabox)
        more, _ = story.place(where)
        story.draw(device)
        writer.end_page()
    writer.close()


def scan_copy(source: Path, path: Path, dpi: int = SCAN_DPI) -> None:
    """``source`` with every page replaced by its grayscale image at ``dpi``: no text layer."""
    import pymupdf

    with pymupdf.open(source) as src, pymupdf.open() as out:
        for page in src:
            pixmap = page.get_pixmap(dpi=dpi, colorspace=pymupdf.csGRAY)
            target = out.new_page(width=page.rect.width, height=page.rect.height)
            target.insert_image(target.rect, pixmap=pixmap)
        out.save(path)


def build_set(directory: Path, documents: int = DOCUMENTS
              ) -> list[tuple[Path, Path, dict[str, Any]]]:
    """The set's PDFs, their scanned copies and labels under ``directory`` (built once)."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = directory / "set.json"
    wanted = {"version": SET_VERSION, "documents": documents}
    built = json.loads(stamp.read_text()) if stamp.exists() else None
    docs = []
    for seed in range(documents):
        description = describe(seed)
        path, scanned = directory / f"regions-{seed:02d}.pdf", directory / f"scan-{seed:02d}.pdf"
        if built != wanted or not path.exists() or not scanned.exists():
            render(description, path)
            scan_copy(path, scanned)
        docs.append((path, scanned, labels(description)))
    stamp.write_text(json.dumps(wanted))
    return docs
