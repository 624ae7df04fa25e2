"""``rayorch run pdf --ocr layout`` end to end, as a user runs it (a real subprocess each),
on a labeled document of the region set (a title, section headings, two ruled tables, a
raster figure; ``bench/region_set.py``) and on its scanned copy (every page an image, no
text layer).

Both must come back with the tables as tables, most headings as Markdown headings, the
figure as an image file referenced from the ``.md``, a content list of those block types,
and ``rayorch show`` and ``rayorch status`` listing the regions as children of the pages.
Real models from wheels on the CPU (the ``layout`` extra): ``bash scripts/test_layout.sh``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.layout, pytest.mark.integration, pytest.mark.timeout(900)]

pytest.importorskip("pymupdf")
pytest.importorskip("rapid_layout")

from bench.region_quality import score_document  # noqa: E402  (after the extras' checks)
from bench.region_set import build_set  # noqa: E402
from rayorch.testing_cli import run_rayorch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def rayorch(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_rayorch(*argv, timeout=800)


def test_layout_job_on_a_document_and_its_scan_keeps_structure_and_shows_regions(
        tmp_path: Path, redis_url: str) -> None:
    [(pdf, scanned, label)] = build_set(tmp_path / "set", documents=1)
    inputs = tmp_path / "in"
    inputs.mkdir()
    for path in (pdf, scanned):
        shutil.copy(path, inputs / path.name)
    out = tmp_path / "out"
    done = rayorch("run", "pdf", "--input", str(inputs), "--output", str(out), "--ocr",
                   "layout", "--json", "--no-progress", "--store", redis_url)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in (out / "documents.jsonl").read_text().splitlines()]
    assert sorted(Path(r["source"]).name for r in rows) == sorted([pdf.name, scanned.name])
    for row in rows:
        check_document(out, row, label)
    run_id = json.loads(done.stdout)["run_id"]
    for index in range(2):
        check_show(rayorch("show", run_id, str(index), "--store", redis_url))
    status = rayorch("status", run_id, "--store", redis_url)
    assert status.returncode == 0, status.stdout + status.stderr
    domains = re.findall(r"domain \S+: (\d+) child(?:ren)? of (\d+) parents?", status.stdout)
    assert [int(parents) for _, parents in domains] == [2, 4], status.stdout  # docs, pages
    assert int(domains[1][0]) >= 16, status.stdout  # the regions of the four pages


def check_document(out: Path, row: dict[str, Any], label: dict[str, Any]) -> None:
    """The tables as tables, most headings as headings, the figure as a referenced file,
    the content list with those block types."""
    assert row["status"] == "ok", row
    markdown = (out / row["markdown"]).read_text()
    scores = score_document(markdown, label)
    assert scores["tables"] == [2, 2], (row["source"], scores, markdown)
    right, labeled = scores["headings"]
    assert right >= 2 and labeled == 3, (row["source"], scores, markdown)
    [figure] = row["figures"]
    assert (out / figure).read_bytes().startswith(b"\x89PNG")
    assert f"![]({figure})" in markdown
    content = json.loads((out / row["content_list"]).read_text())
    types = {entry["type"] for entry in content}
    assert {"title", "table", "image", "text"} <= types, (row["source"], types)
    assert {entry["page_idx"] for entry in content} == {0, 1}
    assert all(len(entry["bbox"]) == 4 for entry in content)
    assert [e["img_path"] for e in content if e["type"] == "image"] == [figure]


def check_show(show: subprocess.CompletedProcess[str]) -> None:
    """``rayorch show RUN N``: the document's two pages, and each page's regions below it."""
    assert show.returncode == 0, show.stdout + show.stderr
    counts = [int(n) for n in re.findall(r"expansion \S+: \w+, (\d+) child", show.stdout)]
    assert counts[0] == 2 and len(counts) == 3 and min(counts[1:]) >= 3, show.stdout
    assert "recognise" in show.stdout and "layout" in show.stdout, show.stdout
