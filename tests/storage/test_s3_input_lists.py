"""``--input-list`` on the loopback S3 server: a manifest object (JSONL.zst, or Parquet read by
ranged reads) naming PDFs in the bucket, one of them missing; outputs in the bucket.

Protects: the manifest is read from the object store (no local copy), its other columns reach
``documents.jsonl`` under ``metadata``, and the missing object fails that source alone with
its cause while the others succeed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rayorch.testing_inputs import input_list_bytes, pdf_archives

pytestmark = [pytest.mark.s3, pytest.mark.timeout(900)]

pytest.importorskip("pymupdf")
pytest.importorskip("obstore")
pytest.importorskip("pyarrow")
pytest.importorskip("zstandard")

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "pdfs"
SMALL = ["phonrule-doc.pdf", "poemscol-cheatsheet.pdf"]


@pytest.mark.parametrize("name", ["list.jsonl.zst", "list.parquet"])
def test_an_input_list_in_the_bucket_runs_its_rows_and_a_missing_object_fails_alone(
        s3_endpoint: str, bucket: str, tmp_path: Path, name: str) -> None:
    import boto3

    client = boto3.client("s3")
    for pdf in SMALL:
        client.put_object(Bucket=bucket, Key=f"in/{pdf}", Body=(EXAMPLES / pdf).read_bytes())
    rows = [{"url": f"s3://{bucket}/in/{SMALL[0]}", "license": "cc-by"},
            {"url": f"s3://{bucket}/in/gone.pdf", "license": "cc0"},
            {"url": f"s3://{bucket}/in/{SMALL[1]}", "license": "mit"}]
    client.put_object(Bucket=bucket, Key=f"lists/{name}", Body=input_list_bytes(name, rows))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([sys.executable, "-m", "rayorch.cli", "run", "pdf", "--ocr", "text",
                           "--input-list", f"s3://{bucket}/lists/{name}", "--output",
                           f"s3://{bucket}/out", "--json", "--no-progress"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 1, done.stderr[-3000:]  # one source failed
    summary = json.loads(done.stdout)
    assert (summary["documents"], summary["succeeded"], summary["failed"]) == (3, 2, 1)
    got = [json.loads(line) for line in client.get_object(
        Bucket=bucket, Key="out/documents.jsonl")["Body"].read().decode().splitlines()]
    assert [(r["source"], r["status"]) for r in got] == [
        (rows[0]["url"], "ok"), (rows[1]["url"], "failed"), (rows[2]["url"], "ok")]
    assert "failed: missing: " in got[1]["cause"] and "gone.pdf" in got[1]["cause"]
    assert [r["metadata"] for r in got] == [{"license": r["license"]} for r in rows]
    assert list(tmp_path.iterdir()) == []  # nothing of the manifest landed on local disk


def test_archives_in_the_bucket_are_read_member_by_member_and_a_corrupt_one_fails_alone(
        s3_endpoint: str, bucket: str, tmp_path: Path) -> None:
    import boto3

    client = boto3.client("s3")
    made = tmp_path / "made"
    zipped, tarred = pdf_archives(made, [EXAMPLES / name for name in
                                         ["phonrule-doc.pdf", "poemscol-cheatsheet.pdf",
                                          "qtree-qarrows.pdf"]])
    for archive in (zipped, tarred):
        client.put_object(Bucket=bucket, Key=f"shards/{archive.name}", Body=archive.read_bytes())
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([sys.executable, "-m", "rayorch.cli", "run", "pdf", "--ocr", "text",
                           "--input", f"s3://{bucket}/shards", "--output", f"s3://{bucket}/out",
                           "--json", "--no-progress"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 1, done.stderr[-3000:]
    got = [json.loads(line) for line in client.get_object(
        Bucket=bucket, Key="out/documents.jsonl")["Body"].read().decode().splitlines()]
    base = f"s3://{bucket}/shards"
    assert [(r["source"], r["status"]) for r in got] == [
        (f"{base}/a.zip#phonrule-doc.pdf", "ok"), (f"{base}/a.zip#poemscol-cheatsheet.pdf", "ok"),
        (f"{base}/a.zip#bad.pdf", "failed"), (f"{base}/b.tar.gz#docs/qtree-qarrows.pdf", "ok")]
    assert "failed: damaged: " in got[2]["cause"]
    assert list(cwd.iterdir()) == []  # nothing extracted to local disk
