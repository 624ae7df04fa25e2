"""``rayorch run pdf`` with data-quality stages, as a user runs it: real subprocesses, a
real redis-server, real PDFs.

Byte copies and text copies of a PDF are delivered once: the other copies are listed in
``dropped.jsonl`` naming the kept one, counted in the summary by reason, shown by
``rayorch show`` and ``status``; the run passes ``rayorch audit``, whose check of the
dedup index catches a claim that disagrees with a verdict. A job killed mid-run and
``--resume``-d keeps the survivor of each group it had chosen.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rayorch.runtime.sinks import read_outputs
from rayorch.testing_cli import cli_env
from rayorch.testing_cli import run_rayorch as rayorch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

pymupdf: Any = pytest.importorskip("pymupdf")
pytest.importorskip("rensa")

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "pdfs"


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def delivered_one(out: Path) -> bool:
    """Whether the job delivered a document (not only drops) to its part files."""
    if not list(out.glob("part-*.jsonl")):
        return False
    try:
        return any(r["outcome"] == "present" for r in read_outputs(out))
    except Exception:  # a sink being set up: look again
        return False


def resaved(src: Path, dst: Path) -> None:
    """The same document with other bytes (another producer): a text copy, not a byte copy."""
    with pymupdf.open(src) as doc:
        doc.set_metadata({**doc.metadata, "producer": "rayorch test", "keywords": "copy"})
        doc.save(dst, garbage=4, deflate=True)
    assert dst.read_bytes() != src.read_bytes()


def test_exact_dedup_delivers_one_copy_and_lists_the_others(redis_url: str,
                                                            tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copyfile(EXAMPLES / "gb4e-doc.pdf", inputs / "a-gb4e.pdf")
    shutil.copyfile(EXAMPLES / "gb4e-doc.pdf", inputs / "b-gb4e-bytes.pdf")  # a byte copy
    resaved(EXAMPLES / "gb4e-doc.pdf", inputs / "c-gb4e-resaved.pdf")       # a text copy
    shutil.copyfile(EXAMPLES / "verse.pdf", inputs / "d-verse.pdf")
    out = tmp_path / "out"
    run = rayorch("run", "pdf", "--input", str(inputs), "--output", str(out), "--ocr", "text",
                  "--store", redis_url, "--dedup", "exact", "--no-progress", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert (summary["documents"], summary["succeeded"], summary["dropped"]) == (4, 2, 2)
    assert summary["failed"] == 0

    rows = jsonl(out / "documents.jsonl")
    ok = [r["id"] for r in rows if r["status"] == "ok"]
    assert 3 in ok and len(ok) == 2  # verse, and one copy of gb4e
    [kept] = [i for i in ok if i != 3]
    dropped = jsonl(out / "dropped.jsonl")
    assert sorted(d["id"] for d in dropped) == sorted({0, 1, 2} - {kept})
    for d in dropped:
        assert d["kept_id"] == kept and d["kept"] == str(inputs / rows[kept]["source"]
                                                         .split("/")[-1])
        assert d["stage"] in ("dedup_bytes", "dedup_text") and d["reason"] == "duplicate"
        row = rows[d["id"]]
        assert row["status"] == "dropped" and row["cause"] == f"{d['stage']}: duplicate"
    # the byte copies are dropped before rendering, a text copy after (if it was not kept)
    if kept != 2:
        assert {d["stage"] for d in dropped if d["id"] == 2} == {"dedup_text"}
    assert summary["drops"] == dict(Counter(f"{d['stage']}: duplicate" for d in dropped))
    assert len(list(out.glob("*.md"))) == 2
    assert {r["index"]: r["outcome"] for r in read_outputs(out)} == {
        i: ("present" if i in ok else "dropped") for i in range(4)}

    run_id = summary["run_id"]
    first = dropped[0]
    show = rayorch("show", run_id, str(first["id"]), "--store", redis_url)
    assert show.returncode == 0, show.stderr
    assert f"dropped by {first['stage']}: duplicate (" in show.stdout
    assert f"kept: {first['kept']}" in show.stdout
    status = rayorch("status", run_id, "--store", redis_url)
    assert "dropped 2 by data-quality stages" in status.stdout, status.stdout
    as_json = json.loads(rayorch("status", run_id, "--store", redis_url, "--json").stdout)
    assert as_json["dropped"] == summary["drops"]
    audit = rayorch("audit", run_id, "--store", redis_url)
    assert audit.returncode == 0 and f"run {run_id}: OK" in audit.stdout, audit.stdout

    # The audit reads the dedup index: a claim that disagrees with a verdict is a finding.
    import redis

    client = redis.Redis.from_url(redis_url)
    scope = json.loads((out / ".rayorch-output.json").read_text())["dedup_scope"]
    [key] = [k for k in client.keys(f"ro:{{claims:{scope}}}")]
    client.hset(key, first["key"], "someone-else.pdf")
    broken = rayorch("audit", run_id, "--store", redis_url)
    assert broken.returncode != 0 and "dedup index holds" in broken.stdout, broken.stdout


def test_a_memory_store_cannot_resume_a_dedup_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / ".rayorch-output.json").write_text("{}")
    run = rayorch("run", "pdf", "--input", str(EXAMPLES), "--output", str(out), "--resume",
                  "--dedup", "exact")
    assert run.returncode == 2 and "--store redis://" in run.stderr, run.stderr


@pytest.mark.long
def test_a_killed_dedup_job_resumed_keeps_its_survivors(redis_url: str,
                                                         tmp_path: Path) -> None:
    """Killed after its first delivery, resumed: each group of byte copies is delivered
    exactly once, and a copy dropped before the kill names the same survivor after it."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for copy in ("a", "b"):
        for pdf in sorted(EXAMPLES.glob("*.pdf")):
            shutil.copyfile(pdf, inputs / f"{copy}-{pdf.name}")
    # The kill must land mid-run; on a loaded machine one part may hold every source before
    # the first is seen (the delivery writer batches what is ready): then try again afresh.
    for attempt in range(4):
        out = tmp_path / f"out{attempt}"
        argv = ["run", "pdf", "--input", str(inputs), "--output", str(out), "--store",
                redis_url, "--ocr", "text", "--dedup", "exact", "--render-replicas", "1",
                "--no-progress"]
        first = subprocess.Popen([sys.executable, "-m", "rayorch.cli", *argv], env=cli_env(),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
        try:
            while not delivered_one(out):  # then kill the whole job
                assert first.poll() is None, first.stderr.read() if first.stderr else ""
                time.sleep(0.02)
            os.killpg(first.pid, signal.SIGKILL)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
            first.wait(60)
        before = {r["index"]: r["outcome"] for r in read_outputs(out)}
        if len(before) < 16:
            break
    assert "present" in before.values() and len(before) < 16, "every try ended before its kill"
    again = rayorch(*argv, "--resume", "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    names = sorted(p.name for p in inputs.iterdir())
    rows = jsonl(out / "documents.jsonl")
    delivered = {r["id"] for r in rows if r["status"] == "ok"}
    groups: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        groups.setdefault(name[2:], []).append(i)
    for members in groups.values():
        assert len(delivered & set(members)) == 1, (members, delivered)
    dropped = jsonl(out / "dropped.jsonl")
    assert {d["id"] for d in dropped} == set(range(len(names))) - delivered
    for d in dropped:
        assert d["kept_id"] in delivered
    for index, outcome in before.items():  # delivered before the kill: still the survivor
        if outcome == "present":
            assert index in delivered


@pytest.mark.long
def test_dedup_against_an_earlier_run_drops_what_it_delivered(redis_url: str,
                                                               tmp_path: Path) -> None:
    """``--dedup-against latest``: a second job drops the documents the first one delivered
    (found in the first run's dedup index through the store's record of its output)."""
    first_in, second_in = tmp_path / "in1", tmp_path / "in2"
    first_in.mkdir()
    second_in.mkdir()
    shutil.copyfile(EXAMPLES / "gb4e-doc.pdf", first_in / "gb4e.pdf")
    shutil.copyfile(EXAMPLES / "gb4e-doc.pdf", second_in / "again.pdf")
    shutil.copyfile(EXAMPLES / "verse.pdf", second_in / "verse.pdf")
    common = ["--ocr", "text", "--store", redis_url, "--dedup", "exact", "--no-progress",
              "--json"]
    first = rayorch("run", "pdf", "--input", str(first_in), "--output",
                    str(tmp_path / "out1"), *common)
    assert first.returncode == 0, first.stderr[-3000:]
    second = rayorch("run", "pdf", "--input", str(second_in), "--output",
                     str(tmp_path / "out2"), *common, "--dedup-against", "latest")
    assert second.returncode == 0, second.stdout[-3000:]
    assert json.loads(second.stdout)["drops"] == {"dedup_bytes: delivered_before": 1}
    [dropped] = jsonl(tmp_path / "out2" / "dropped.jsonl")
    assert dropped["source"].endswith("again.pdf")
    assert dropped["kept"] == str(first_in / "gb4e.pdf") and dropped["kept_id"] is None
    own = rayorch("run", "pdf", "--input", str(second_in), "--output",
                  str(tmp_path / "out2"), *common, "--resume", "--dedup-against", "latest")
    assert own.returncode == 2 and "own run" in own.stderr, own.stderr
    marker = json.loads((tmp_path / "out2" / ".rayorch-output.json").read_text())
    assert marker["status"] == "complete"  # refused before --output was touched


def test_language_and_quality_drops_carry_their_scores(tmp_path: Path) -> None:
    """``--lang de --quality default`` on English documents (the default memory store):
    each is dropped for its language with the model's score, the run still succeeds."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name in ("gb4e-doc.pdf", "verse.pdf"):
        shutil.copyfile(EXAMPLES / name, inputs / name)
    out = tmp_path / "out"
    run = rayorch("run", "pdf", "--input", str(inputs), "--output", str(out), "--ocr", "text",
                  "--lang", "de", "--quality", "default", "--no-progress")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "dropped 2 documents (listed in dropped.jsonl): language: language 2" in run.stdout
    dropped = jsonl(out / "dropped.jsonl")
    assert [(d["id"], d["stage"], d["reason"], d["lang"]) for d in dropped] == [
        (0, "language", "language", "en"), (1, "language", "language", "en")]
    assert all(0.5 < d["score"] <= 1.0 for d in dropped)
    bad = rayorch("run", "pdf", "--input", str(inputs), "--output", str(tmp_path / "x"),
                  "--lang", "english")
    assert bad.returncode == 2 and "ISO 639-1" in bad.stderr, bad.stderr
