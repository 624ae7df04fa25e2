"""``rayorch run pdf`` as a user runs it, on the shipped PDFs and the session's Ray: by
default every stage's pool sizes itself (the plan, the stored plan and the summary say so,
and the summary names the binding stage); ``--replicas 2`` fixes the OCR pool at two.
The video job's counterpart is in test_video_pipeline.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rayorch.cli import main as cli_main
from rayorch.core.plan import Plan
from rayorch.store.registry import open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
pytest.importorskip("pymupdf")
pytest.importorskip("rapidocr_onnxruntime")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pdfs"
DOCUMENTS = len(list(EXAMPLES.glob("*.pdf")))


def run_pdf(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    capsys.readouterr()
    code = cli_main(["run", "pdf", "--input", str(EXAMPLES), "--no-progress", "--json", *argv])
    out = capsys.readouterr().out
    summary: dict[str, Any] = json.loads(out)  # stdout: the summary only
    assert code == 0, summary
    assert summary["succeeded"] == DOCUMENTS
    return summary


def test_the_pdf_jobs_pools_size_themselves_by_default_and_a_number_fixes_one(
        ray_local: None, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        quick_pool_sizing: None) -> None:
    summary = run_pdf(capsys, "--output", str(tmp_path / "auto"), "--store", redis_url)
    pools = summary["pools"]
    assert {name: pool["replicas"] for name, pool in pools.items()} == {
        "render": "auto", "ocr": "auto", "assemble": "1"}
    assert summary["bound_by"] in pools, summary
    assert pools["assemble"] == {"replicas": "1", "start": 1, "most": 1, "end": 1,
                                 "changes": 0}
    # The stored plan keeps the ranges: its explain() lists them.
    with open_store(redis_url) as store:
        text = Plan.from_description(store.run_info(summary["run_id"]).plan).explain()
    assert "  render                   replicas=auto " in text, text
    assert "  ocr                      replicas=auto " in text, text
    assert "  assemble                 replicas=1 " in text, text

    assert "cost_usd" not in summary  # no price, no cost

    fixed = run_pdf(capsys, "--output", str(tmp_path / "fixed"), "--replicas", "2",
                    "--render-replicas", "1-2", "--cpu-price", "0.04", "--gpu-price", "2.5")
    # the cost of the cluster the job ran on, over its wall time, per million pages
    cpus, gpus = fixed["cpus"], fixed["gpus"]
    assert cpus >= 1 and fixed["cpu_price_per_h"] == 0.04
    expected = fixed["wall_s"] / 3600 * (cpus * 0.04 + gpus * 2.5)
    assert fixed["cost_usd"] == pytest.approx(expected, rel=1e-3)
    assert fixed["usd_per_million_pages"] == pytest.approx(
        expected / fixed["pages"] * 1e6, rel=1e-3)
    assert fixed["pools"]["ocr"] == {"replicas": "2", "start": 2, "most": 2, "end": 2,
                                     "changes": 0}
    render = fixed["pools"]["render"]
    assert render["replicas"] == "1-2" and 1 <= render["end"] <= render["most"] <= 2
