"""``rayorch run pdf --ocr layout`` end to end, as a user runs it (a real subprocess each),
on a generated report (a title, a section heading, a ruled table, a raster figure) and on
its scanned copy (every page an image, no text layer).

Both must come back with the table as a table, the headings as Markdown headings, the
figure as an image file referenced from the ``.md``, a content list of those block types,
and ``rayorch show`` and ``rayorch status`` listing the regions as children of the pages.
Real models from wheels on the CPU (the ``layout`` extra): ``bash scripts/test_layout.sh``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.layout, pytest.mark.integration, pytest.mark.timeout(900)]

pytest.importorskip("pymupdf")
pytest.importorskip("rapid_layout")

from rayorch.testing_documents import (  # noqa: E402  (after the extra's check)
    HEADINGS,
    TABLE_ROWS,
    TITLE,
    write_scanned_copy,
    write_structured_pdf,
)

REPO = Path(__file__).resolve().parents[2]


def rayorch(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({"PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled",
                "RAY_USAGE_STATS_ENABLED": "0"})
    return subprocess.run([sys.executable, "-m", "rayorch.cli", *argv], env=env,
                          capture_output=True, text=True, timeout=800, check=False)


def pipe_tables(markdown: str) -> list[list[list[str]]]:
    """The pipe tables of a Markdown text, each as rows of stripped cells (no rule row)."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    return tables


def html_table_cells(markdown: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", c).strip()
            for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", markdown, re.S)]


def cells_in_place(markdown: str) -> float:
    """The share of the labelled table's cells found in a table of the Markdown."""
    want = [cell for row in TABLE_ROWS for cell in row]
    found = [cell for table in pipe_tables(markdown) for row in table for cell in row]
    found += html_table_cells(markdown)
    return sum(1 for cell in want if cell in found) / len(want)


def test_layout_job_on_a_report_and_its_scan_keeps_structure_and_shows_regions(
        tmp_path: Path, redis_url: str) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_structured_pdf(inputs / "report.pdf")
    write_scanned_copy(inputs / "report.pdf", inputs / "report-scan.pdf")
    out = tmp_path / "out"
    done = rayorch("run", "pdf", "--input", str(inputs), "--output", str(out), "--ocr",
                   "layout", "--json", "--no-progress", "--store", redis_url)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {Path(r["source"]).stem: r
            for r in map(json.loads, (out / "documents.jsonl").read_text().splitlines())}
    for stem in ("report", "report-scan"):
        check_document(out, rows[stem])
    run_id = json.loads(done.stdout)["run_id"]
    for index in range(2):
        check_show(rayorch("show", run_id, str(index), "--store", redis_url))
    status = rayorch("status", run_id, "--store", redis_url)
    assert status.returncode == 0, status.stdout + status.stderr
    domains = re.findall(r"domain \S+: (\d+) child(?:ren)? of (\d+) parents?", status.stdout)
    assert [int(parents) for _, parents in domains] == [2, 2], status.stdout  # docs, pages
    assert int(domains[1][0]) >= 8, status.stdout  # the regions of both pages


def check_document(out: Path, row: dict[str, Any]) -> None:
    """The table as a table, the headings as headings, the figure as a referenced file, the
    content list with those block types."""
    assert row["status"] == "ok", row
    markdown = (out / row["markdown"]).read_text()
    assert f"# {TITLE}" in markdown.splitlines(), (row["source"], markdown)
    squeezed = "".join(markdown.split())  # OCR of a scan may lose the spaces
    for heading in HEADINGS:  # the CDLA model reads section headings as text or captions
        assert "".join(heading.split()) in squeezed, (row["source"], heading, markdown)
    assert cells_in_place(markdown) >= 0.75, (row["source"], markdown)
    [figure] = row["figures"]
    assert (out / figure).read_bytes().startswith(b"\x89PNG")
    assert f"![]({figure})" in markdown
    content = json.loads((out / row["content_list"]).read_text())
    types = {entry["type"] for entry in content}
    assert {"title", "table", "image", "text"} <= types, (row["source"], types)
    assert all(entry["page_idx"] == 0 and len(entry["bbox"]) == 4 for entry in content)
    assert [e["img_path"] for e in content if e["type"] == "image"] == [figure]


def check_show(show: subprocess.CompletedProcess[str]) -> None:
    """``rayorch show RUN N``: the document's one page, and that page's regions below it."""
    assert show.returncode == 0, show.stdout + show.stderr
    text = show.stdout
    assert re.search(r"expansion \S+: \w+, 1 child\b", text), text
    regions = re.search(r"expansion \S+: \w+, (\d+) children", text)
    assert regions and int(regions.group(1)) >= 4, text
    assert "recognise" in text and "layout" in text, text
