"""The PDF job's shard formats on an object store: ``--output s3://… --format parquet|wds``.

A real ``rayorch run pdf`` subprocess writes to a bucket of a real S3-API server on
loopback (conftest.py); pyarrow.dataset reads the Parquet shards straight from the bucket,
the ``webdataset`` library the tars (fetched by boto3, independent of rayorch): one row per
source each, with the Markdown ``--format files`` writes locally.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from s3_tools import keys

from rayorch.runtime.sinks import read_outputs
from rayorch.store.records.sink import PartName

pytestmark = [pytest.mark.s3, pytest.mark.timeout(900)]

pytest.importorskip("pymupdf")
pytest.importorskip("obstore")

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "pdfs"
SMALL = ["phonrule-doc.pdf", "poemscol-cheatsheet.pdf", "qtree-qarrows.pdf", "parallel.pdf"]
TARGET = 24_000


def job(argv: list[str], home: Path) -> dict[str, object]:
    import os

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(home)}
    done = subprocess.run([sys.executable, "-m", "rayorch.cli", "run", "pdf", "--ocr", "text",
                           "--no-progress", "--json", *argv], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary: dict[str, object] = json.loads(done.stdout)
    return summary


def test_parquet_and_wds_shards_on_s3_read_with_one_row_per_source(
        s3_endpoint: str, bucket: str, tmp_path: Path) -> None:
    import boto3
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs
    import webdataset as wds

    inputs = tmp_path / "in"
    inputs.mkdir()
    for copy in range(2):
        for name in SMALL:
            shutil.copyfile(EXAMPLES / name, inputs / f"{copy}-{name}")
    home = tmp_path / "home"
    home.mkdir()
    job(["--input", str(inputs), "--output", str(tmp_path / "files")], home)
    rows = [json.loads(line) for line in
            (tmp_path / "files" / "documents.jsonl").read_text().splitlines()]
    expected = {r["source"]: (tmp_path / "files" / r["markdown"]).read_text() for r in rows}

    for fmt in ("parquet", "wds"):
        job(["--input", str(inputs), "--output", f"s3://{bucket}/{fmt}", "--format", fmt,
             "--shard-size", str(TARGET)], home)
        names = [k.rpartition("/")[2] for k in keys(s3_endpoint, bucket, f"{fmt}/")]
        parts = sorted(n for n in names if PartName.parse(n) is not None)
        assert len(parts) > 1 and "_index.parquet" in names
        assert not [n for n in names if n.startswith(".rayorch-tmp-")]
        assert sorted(r["index"] for r in read_outputs(f"s3://{bucket}/{fmt}")) == \
            list(range(len(expected)))
        if fmt == "parquet":
            host = urlsplit(s3_endpoint)
            s3 = pafs.S3FileSystem(endpoint_override=host.netloc, scheme=host.scheme,
                                   access_key="testing", secret_key="testing",
                                   region="us-east-1")
            table = ds.dataset([f"{bucket}/{fmt}/{p}" for p in parts], format="parquet",
                               filesystem=s3).to_table(columns=["source", "markdown"])
            got = dict(zip(table.column("source").to_pylist(),
                           table.column("markdown").to_pylist(), strict=True))
        else:
            client = boto3.client("s3", endpoint_url=s3_endpoint)
            local = []
            for part in parts:
                local.append(str(tmp_path / part))
                client.download_file(bucket, f"{fmt}/{part}", local[-1])
            samples = list(wds.WebDataset(local, shardshuffle=False).decode())
            got = {s["json"]["source"]: s["md"].decode() for s in samples}
        assert len(got) == len(expected)
        assert got == expected, fmt
