"""A labeled set of PDFs for Markdown quality: HTML with known structure, rendered by PyMuPDF.

Each document is built from a seeded description (title, headings with levels, paragraphs,
bullet and numbered lists, monospace code blocks, ruled tables, sometimes a table of
contents with dot leaders and a linguistics example starting with an asterisk), written as
HTML and laid out into a PDF by PyMuPDF's ``Story``. The labels come from the description,
never from the PDF, so they say what a reader of the page sees:

    from bench.markdown_set import build_set
    docs = build_set(Path(".cache/markdown_set"))   # [(pdf path, labels)], built once

Labels: ``{"title", "headings": [[level, text]], "list_items": [text], "code": [text],
"tables": [[[cell, ...], ...]]}`` (a table is its rows, header row first). A TOC entry is a
list item; the title is level 1 and not among the headings. Same seed, same PDFs.
"""

from __future__ import annotations

import html
import json
import random
from pathlib import Path
from typing import Any

SET_VERSION = 2
"""Bumped whenever the generator changes, so a cached set is rebuilt."""
DOCUMENTS = 8
_WORD_TEXT = (
    "lineage store shard replica actor batch page grain source render table column value "
    "format engine driver commit stream result record output input layer text model "
    "pipeline schedule request reply budget memory worker cluster token sample metric "
    "reader writer measure window buffer signal fragment margin header footer figure "
    "caption section chapter example sentence version option archive network latency "
    "quality corpus document extract parse normalise compare observe recover restart"
)
WORDS = tuple(_WORD_TEXT.split())
CODE_LINES = (
    "def {a}({b}, {c}):",
    "    {b} = {c} + 1",
    "    for item in {a}_{b}:",
    "        total += item.{c}",
    "    return {b}",
    "result = {a}({b}=3, {c}=[1, 2])",
    "if {b} is None:",
    "    raise ValueError('{a} missing')",
    "print({a}, {c})",
)
BORDER = "border: 1px solid black; padding: 2px"


def _words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def _sentence(rng: random.Random) -> str:
    text = _words(rng, 8, 18)
    return text[0].upper() + text[1:] + "."


def _heading(rng: random.Random) -> str:
    return " ".join(w.capitalize() for w in _words(rng, 2, 5).split())


def describe(seed: int) -> dict[str, Any]:
    """The seeded description of one document: its title and a list of parts."""
    rng = random.Random(seed)
    title_words = rng.randint(3, 12)  # long titles wrap over two or three lines
    title = " ".join(w.capitalize() for w in (rng.choice(WORDS) for _ in range(title_words)))
    parts: list[tuple[str, Any]] = []
    sections = rng.randint(3, 5)
    names = [f"{n} {_heading(rng)}" for n in range(1, sections + 1)]
    if seed % 3 == 0:
        parts.append(("toc", names))
    if seed % 4 == 1:
        parts.append(("p", "* " + _sentence(rng)))  # a judged example, not a list item
    for n, name in enumerate(names, start=1):
        parts.append(("h2", name))
        parts.append(("p", " ".join(_sentence(rng) for _ in range(rng.randint(2, 5)))))
        for sub in range(1, rng.randint(1, 3) + 1):
            parts.append(("h3", f"{n}.{sub} {_heading(rng)}"))
            kind = rng.choice(("ul", "ol", "pre", "table", "p", "h4"))
            if kind in ("ul", "ol"):
                parts.append((kind, [_words(rng, 3, 14) for _ in range(rng.randint(2, 5))]))
            elif kind == "pre":
                a, b, c = rng.sample(WORDS, 3)
                start = rng.randint(0, 3)
                lines = CODE_LINES[start:start + rng.randint(3, 6)]
                parts.append(("pre", "\n".join(line.format(a=a, b=b, c=c) for line in lines)))
            elif kind == "table":
                cols, rows = rng.randint(2, 4), rng.randint(2, 5)
                header = [w.capitalize() for w in rng.sample(WORDS, cols)]
                body = [[rng.choice(WORDS) if col == 0 else str(rng.randint(1, 999))
                         for col in range(cols)] for _ in range(rows)]
                parts.append(("table", [header, *body]))
            elif kind == "h4":
                parts.append(("h4", _heading(rng)))
            parts.append(("p", " ".join(_sentence(rng) for _ in range(rng.randint(1, 4)))))
    return {"title": title, "parts": parts}


def to_html(description: dict[str, Any]) -> str:
    """The HTML of a description (what ``Story`` lays out)."""
    esc = html.escape
    out = [f"<h1>{esc(description['title'])}</h1>"]
    for kind, value in description["parts"]:
        if kind == "toc":
            out.append("<h2>Contents</h2>")
            out.extend(f"<p>{esc(name)} {' .' * 30} {page}</p>"
                       for page, name in enumerate(value, start=2))
        elif kind in ("ul", "ol"):
            items = "".join(f"<li>{esc(item)}</li>" for item in value)
            out.append(f"<{kind}>{items}</{kind}>")
        elif kind == "pre":
            out.append(f"<pre>{esc(value)}</pre>")
        elif kind == "table":
            rows = []
            for i, row in enumerate(value):
                tag = "th" if i == 0 else "td"
                rows.append("<tr>" + "".join(f'<{tag} style="{BORDER}">{esc(cell)}</{tag}>'
                                             for cell in row) + "</tr>")
            out.append('<table style="border-collapse: collapse">' + "".join(rows) + "</table>")
        else:
            out.append(f"<{kind}>{esc(value)}</{kind}>")
    return "\n".join(out)


def labels(description: dict[str, Any]) -> dict[str, Any]:
    """What a reader sees in the rendered document, by structure."""
    found: dict[str, Any] = {"title": description["title"], "headings": [], "list_items": [],
                             "code": [], "tables": []}
    for kind, value in description["parts"]:
        if kind == "toc":
            found["headings"].append([2, "Contents"])
            found["list_items"].extend(value)
        elif kind in ("h2", "h3", "h4"):
            found["headings"].append([int(kind[1]), value])
        elif kind in ("ul", "ol"):
            found["list_items"].extend(value)
        elif kind == "pre":
            found["code"].append(value)
        elif kind == "table":
            found["tables"].append(value)
    return found


def render(description: dict[str, Any], path: Path) -> None:
    """Lay the description's HTML out on A4 pages with PyMuPDF's ``Story``."""
    import pymupdf

    story = pymupdf.Story(html=to_html(description))
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


def build_set(directory: Path, documents: int = DOCUMENTS) -> list[tuple[Path, dict[str, Any]]]:
    """The set's PDFs and labels under ``directory`` (built unless already there)."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = directory / "set.json"
    wanted = {"version": SET_VERSION, "documents": documents}
    built = json.loads(stamp.read_text()) if stamp.exists() else None
    docs = []
    for seed in range(documents):
        description = describe(seed)
        path = directory / f"story-{seed:02d}.pdf"
        if built != wanted or not path.exists():
            render(description, path)
        docs.append((path, labels(description)))
    stamp.write_text(json.dumps(wanted))
    return docs
