"""``rayorch run pdf --reuse``: on real PDFs, a re-run renders and OCRs only what changed.

Ten PDFs (two of them scans, so there are OCR Grains), then the same ten and one new file
(10% more): only the new one is rendered and assembled. Then only an assemble option
changes (``--no-page-markers``): no render or OCR Grain runs, every document is assembled
again. On a real redis-server and on a named memory store that the test holds open (the
CLI runs in this process).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rayorch.cli import main
from rayorch.runtime.status import run_status
from rayorch.store.registry import open_store
from rayorch.testing import write_scanned_pdf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
pytest.importorskip("pymupdf")
pytest.importorskip("rapidocr_onnxruntime")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pdfs"


def corpus(tmp_path: Path) -> Path:
    pdfs = tmp_path / "pdfs"
    pdfs.mkdir()
    for pdf in sorted(EXAMPLES.glob("*.pdf")):
        shutil.copy(pdf, pdfs / pdf.name)
    write_scanned_pdf(EXAMPLES / "qtree-qarrows.pdf", pdfs / "scan-1.pdf")
    write_scanned_pdf(EXAMPLES / "phonrule-doc.pdf", pdfs / "scan-2.pdf")
    return pdfs


def run_pdf(pdfs: Path, out: Path, store: str, capsys: pytest.CaptureFixture[str],
            *extra: str) -> dict[str, Any]:
    code = main(["run", "pdf", "--input", str(pdfs), "--output", str(out), "--store", store,
                 "--render-replicas", "1", "--no-progress", "--json", *extra])
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert code == 0, result
    return result


def ran(store_url: str, run_id: str) -> dict[str, int]:
    """Grains dispatched per Call (Grains that ran; reused ones are not dispatched)."""
    with open_store(store_url) as store:
        return {call: c["dispatched"] for call, c in run_status(store, run_id).calls.items()}


def documents(out: Path) -> dict[str, str]:
    return {Path(p).name: p.read_text() for p in map(Path, sorted(out.rglob("*.md")))}


# The memory variant is `slow` (-m slow): the same runs, ~25 s more; the memory store's reuse is
# in the default suite through tests/integration/test_reuse.py (one ro.Executor).
@pytest.mark.parametrize("kind", ["redis", pytest.param("memory", marks=pytest.mark.slow)])
def test_rerun_renders_only_new_pdfs_and_an_assemble_change_runs_no_ocr(
        kind: str, ray_local: None, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("redis_url") if kind == "redis" else "memory://reuse-cli"
    held = open_store(url)  # a memory store lives while someone holds it (here: the test)
    try:
        pdfs = corpus(tmp_path)
        first = run_pdf(pdfs, tmp_path / "a", url, capsys)
        counts = ran(url, first["run_id"])
        assert counts["render"] == 10 and counts["ocr"] >= 2 and counts["assemble"] == 10

        shutil.copy(EXAMPLES / "parallel.pdf", pdfs / "zz-new.pdf")
        second = run_pdf(pdfs, tmp_path / "b", url, capsys, "--reuse", "latest")
        assert ran(url, second["run_id"]) == {"render": 1, "ocr": 0, "assemble": 1}
        old, new = documents(tmp_path / "a"), documents(tmp_path / "b")
        assert set(new) - set(old) == {"00010-zz-new.md"}
        assert {name: new[name] for name in old} == old

        third = run_pdf(pdfs, tmp_path / "c", url, capsys, "--reuse", second["run_id"],
                        "--no-page-markers")
        assert ran(url, third["run_id"]) == {"render": 0, "ocr": 0, "assemble": 11}
        unmarked = documents(tmp_path / "c")
        assert set(unmarked) == set(new) and "<!-- page" not in "".join(unmarked.values())
    finally:
        held.close()
