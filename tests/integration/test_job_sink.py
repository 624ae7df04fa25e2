"""A job's ``--output`` is its run's file sink, as ``rayorch driver``'s ``--out-dir`` is.

Each run is a real ``rayorch run pdf`` subprocess (its own private Ray) with a real
redis-server. A run killed (SIGKILL) once its first part file is there and then
``--resume``-d has every document exactly once: in the part files (readable with
``read_outputs``, each record its ``documents.jsonl`` row), in ``documents.jsonl`` and as
one ``.md`` each, each document under its id in the lineage (``rayorch show``); the
resumed run passes ``rayorch audit`` (which finds the directory from
the run), and a changed record fails it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rayorch.pipelines.job.cli import DOCUMENT_NAME, MARKER
from rayorch.runtime.sinks import SINK_MANIFEST, read_outputs
from rayorch.testing_cli import cli_env
from rayorch.testing_cli import run_rayorch as rayorch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

pytest.importorskip("pymupdf")
pytest.importorskip("rapidocr_onnxruntime")

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "pdfs"


def rows_of(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "documents.jsonl").read_text().splitlines()]


def parts_of(out: Path) -> list[Path]:
    return sorted(out.glob("part-*.jsonl"))


@pytest.mark.long
def test_a_killed_job_resumed_has_every_document_once_readable_and_audited(
    redis_url: str, tmp_path: Path,
) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    for copy in ("a", "b"):  # 16 documents, rendered one at a time: a run of many deliveries
        for pdf in sorted(EXAMPLES.glob("*.pdf")):
            shutil.copyfile(pdf, inputs / f"{copy}-{pdf.name}")
    total = len(list(inputs.iterdir()))
    out = tmp_path / "out"
    argv = ["run", "pdf", "--input", str(inputs), "--output", str(out), "--store", redis_url,
            "--render-replicas", "1", "--no-progress"]
    first = subprocess.Popen([sys.executable, "-m", "rayorch.cli", *argv], env=cli_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        while not parts_of(out):  # the first delivery: then kill the whole job
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            time.sleep(0.02)
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait(60)
    assert json.loads((out / MARKER).read_text())["status"] == "running"  # killed mid-run
    delivered = {r["index"] for r in read_outputs(out)}
    assert 0 < len(delivered) < total

    again = subprocess.run([sys.executable, "-m", "rayorch.cli", *argv, "--resume", "--json"],
                           env=cli_env(), capture_output=True, text=True, timeout=600,
                           check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads(again.stdout)
    assert (summary["documents"], summary["succeeded"], summary["failed"]) == (total, total, 0)
    assert summary["kept"] >= len(delivered)

    records = sorted(read_outputs(out), key=lambda r: r["index"])  # a source twice raises
    assert [r["index"] for r in records] == list(range(total))
    rows = rows_of(out)
    assert [(r["id"], r["status"]) for r in rows] == [(i, "ok") for i in range(total)]
    assert [r["value"] for r in records] == rows  # each record is its document's row
    assert json.loads((out / SINK_MANIFEST).read_text())["run"] == summary["run_id"]
    documents = sorted(p.name for p in out.iterdir() if DOCUMENT_NAME.match(p.name))
    assert documents == sorted(r["markdown"] for r in rows)  # one .md each, none stale
    assert not [p.name for p in out.iterdir() if p.name.startswith(".rayorch-tmp-")]
    # Each document keeps its id as its lineage index: the resumed run admitted those left
    # under their ids, and holds no facts of those it kept.
    left = min(set(range(total)) - delivered)
    show = rayorch("show", summary["run_id"], str(left), "--store", redis_url)
    assert show.returncode == 0, show.stderr
    assert f"source {left}: admitted with [{rows[left]['source']!r}]" in show.stdout
    kept = min(delivered)
    not_run = rayorch("show", summary["run_id"], str(kept), "--store", redis_url)
    assert not_run.returncode == 1 and f"no facts about entity {kept}" in not_run.stdout
    audit = rayorch("audit", summary["run_id"], "--store", redis_url)  # finds --output itself
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert f"run {summary['run_id']}: OK" in audit.stdout

    part = parts_of(out)[0]  # a changed record fails the audit
    part.write_text(part.read_text().replace('"status":"ok"', '"status":"OK"', 1))
    altered = rayorch("audit", summary["run_id"], "--store", redis_url)
    assert altered.returncode != 0 and f"in part {part.name} was altered" in altered.stdout
