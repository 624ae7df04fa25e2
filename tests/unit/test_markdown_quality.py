"""bench/markdown_quality.py: its parser, and rayorch's scores on the labeled set.

The scores are deterministic (the same PDFs, the same code): rayorch's Markdown of the
generated set and of the labeled example pages must score at least the floors below,
which are the figures recorded in bench/RESULTS.md ("Markdown quality").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pymupdf")

from bench.markdown_quality import real_pages, score, structures
from bench.markdown_set import build_set
from rayorch.pipelines.pdf import AssembleDocument, RenderPdf

GENERATED_FLOOR = {"title": (1.0, 1.0), "headings": (1.0, 1.0), "list_items": (1.0, 1.0),
                   "code": (1.0, 1.0), "tables": (1.0, 1.0)}
"""(precision, recall) of ``rayorch run pdf --tables`` on the generated set."""
EXAMPLES_FLOOR = {"title": (1.0, 1.0), "headings": (1.0, 1.0), "list_items": (1.0, 1.0),
                  "code": (1.0, 0.5), "tables": (1.0, 1.0)}
"""The same on the labeled pages of examples/pdfs (gb4e-doc pages 1-3)."""


def rayorch_markdown(path: str, pages: list[int] | None, tables: bool = True) -> str:
    [(_, meta)] = RenderPdf(tables=tables)([path])
    [doc] = AssembleDocument()([[]], [meta])
    markdown = str(doc["markdown"])
    if pages is None:
        return markdown
    head, *rest = markdown.split("<!-- page ")
    kept = [p for p in rest if int(p.split()[0]) in pages]
    return (head if 1 in pages else "") + "".join("<!-- page " + p for p in kept)


def assert_floor(scores: dict[str, dict[str, Any]], floor: dict[str, tuple[float, float]]
                 ) -> None:
    for name, (precision, recall) in floor.items():
        got = scores[name]
        assert got["precision"] is not None and got["precision"] >= precision, (name, got)
        assert got["recall"] is not None and got["recall"] >= recall, (name, got)


def test_the_parser_reads_each_structure_as_a_markdown_reader_would() -> None:
    markdown = ("# A Title\n\n## 1 Start\n\nText with * no item.\n\\* Not an item.\n\n"
                "- one\n  continued\n- two\n\n1. three\n\n```\ncode line\n```\n\n"
                "| A | B |\n| --- | --- |\n| 1 | 2 |\n\n### 1.1 Next\n")
    got = structures(markdown)
    assert got["title"] == "A Title"
    assert got["headings"] == [[2, "1 Start"], [3, "1.1 Next"]]
    assert got["list_items"] == ["one continued", "two", "three"]
    assert got["code"] == ["code line"] and got["tables"] == [[["A", "B"], ["1", "2"]]]


def test_a_repeated_title_a_toc_as_headings_and_a_bullet_example_score_lower() -> None:
    label = {"title": "A Long Title", "headings": [[2, "Contents"], [2, "1 Intro"]],
             "list_items": ["1 Intro"], "code": ["x = 1"], "tables": [[["A", "B"], ["1", "2"]]]}
    good = ("# A Long Title\n\n## Contents\n\n- 1 Intro\n\n## 1 Intro\n\n```\nx = 1\n```\n\n"
            "| A | B |\n| --- | --- |\n| 1 | 2 |\n")
    bad = ("# A Long\n\n## A Long Title\n\n## Contents\n\n#### 1 Intro 2\n\n## 1 Intro\n\n"
           "- Here another is.\n\nx = 1\n\n| A | Col2 |\n| --- | --- |\n| 1<br>2 | |\n")
    perfect = score([good], [label])
    assert all(s["precision"] == 1.0 and s["recall"] == 1.0 for s in perfect.values())
    worse = score([bad], [label])
    assert worse["title"]["recall"] == 0.0 and worse["headings"]["precision"] == 0.5
    assert worse["list_items"]["precision"] == 0.0 and worse["code"]["recall"] == 0.0
    assert worse["tables"]["recall"] == 0.0


def test_rayorch_scores_at_least_its_floor_on_the_generated_set(tmp_path: Path) -> None:
    docs = build_set(tmp_path)
    scores = score([rayorch_markdown(str(p), None) for p, _ in docs],
                   [label for _, label in docs])
    assert_floor(scores, GENERATED_FLOOR)


def test_rayorch_scores_at_least_its_floor_on_the_labeled_example_pages() -> None:
    real, _ = real_pages()
    shipped = [r for r in real if "/examples/pdfs/" in r["path"]]
    assert len(shipped) >= 3
    scores = score([rayorch_markdown(r["path"], r["pages"]) for r in shipped],
                   [r["label"] for r in shipped])
    assert_floor(scores, EXAMPLES_FLOOR)
