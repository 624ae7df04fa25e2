"""The driver reads no input: every input object is downloaded once, by the actor that
renders it, and a run that reuses an earlier one downloads none (issue 38, item 1).

Each run is a real ``rayorch run pdf`` subprocess, s3 -> s3, against the loopback S3 server
(conftest.py) behind a counting proxy (``rayorch.testing_s3.FaultyProxy``): the proxy sees
the requests of every process of the run, so a second GET or any HEAD of an input is the
driver's (the render actor reads each input whole, in one GET, with no HEAD).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rayorch.testing import one_page_pdf

pytestmark = [pytest.mark.s3, pytest.mark.timeout(900)]

pytest.importorskip("pymupdf")
pytest.importorskip("obstore")

REPO = Path(__file__).resolve().parents[2]
DOCS = 12


def cli(argv: list[str], cwd: Path, endpoint: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(cwd), "AWS_ENDPOINT_URL": endpoint}
    return subprocess.run([sys.executable, "-m", "rayorch.cli", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def test_each_input_is_downloaded_once_and_a_reusing_run_downloads_none(
        s3_endpoint: str, bucket: str, redis_url: str, tmp_path: Path) -> None:
    import boto3

    from rayorch.testing_s3 import FaultyProxy

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    inputs: dict[str, bytes] = {}
    for i in range(DOCS):
        key = f"in/doc{i:03d}.pdf"
        inputs[key] = one_page_pdf(i)
        client.put_object(Bucket=bucket, Key=key, Body=inputs[key])
    paths = {f"/{bucket}/{key}": data for key, data in inputs.items()}
    # keep=all: every value outlives its source, so a later run can reuse every stage
    argv = ["run", "pdf", "--ocr", "text", "--input", f"s3://{bucket}/in", "--store",
            f"{redis_url}?keep=all", "--json", "--no-progress"]

    with FaultyProxy(s3_endpoint) as proxy:
        first = cli([*argv, "--output", f"s3://{bucket}/out1"], tmp_path, proxy.endpoint)
        assert first.returncode == 0, first.stderr[-3000:]
        gets = {p: proxy.by_path[("GET", p)] for p in paths}
        heads = {p: proxy.by_path[("HEAD", p)] for p in paths}
        downloaded = sum(proxy.bytes_out[p] for p in paths)
    assert json.loads(first.stdout)["succeeded"] == DOCS
    assert set(gets.values()) == {1}, gets  # the render actor's read; the driver's none
    assert set(heads.values()) == {0}, heads
    assert downloaded / sum(map(len, inputs.values())) <= 1.02
    rows = [json.loads(line) for line in client.get_object(
        Bucket=bucket, Key="out1/documents.jsonl")["Body"].read().decode().splitlines()]
    # the content digest, computed by the actor that read the bytes
    assert {r["source"]: r["sha256"] for r in rows} == {
        f"s3://{bucket}/{key}": hashlib.sha256(data).hexdigest() for key, data in inputs.items()}

    # Reused by their listed identity (size and ETag): not one byte of an input is read.
    changed = "in/doc000.pdf"
    inputs[changed] = one_page_pdf(999)
    client.put_object(Bucket=bucket, Key=changed, Body=inputs[changed])
    with FaultyProxy(s3_endpoint) as proxy:
        again = cli([*argv, "--output", f"s3://{bucket}/out2", "--reuse", "latest"], tmp_path,
                    proxy.endpoint)
        assert again.returncode == 0, again.stderr[-3000:]
        gets = {p: proxy.by_path[("GET", p)] for p in paths}
    assert json.loads(again.stdout)["succeeded"] == DOCS
    assert gets == {p: int(p.endswith(changed)) for p in paths}  # only the changed one


HOOK = '''
import atexit, os, threading
if os.environ.get("RAYORCH_TEST_CALLS_DIR"):
    from rayorch.storage import objects as _objects
    _orig, _seen = _objects.ObjectStorage._call, []

    def _call(self, what, key, op):
        if threading.current_thread() is threading.main_thread():
            _seen.append(f"{what}\\t{key}")
        return _orig(self, what, key, op)

    _objects.ObjectStorage._call = _call

    def _dump():
        path = os.path.join(os.environ["RAYORCH_TEST_CALLS_DIR"], f"{os.getpid()}.txt")
        with open(path, "w") as f:
            f.write("\\n".join(_seen))

    atexit.register(_dump)
'''


def test_the_driver_loop_writes_no_document_or_part_itself(
        s3_endpoint: str, bucket: str, tmp_path: Path) -> None:
    """The ``.md`` files and part files are written by the delivery writer's threads: the
    driver's main thread (its loop) makes no object-store call for them."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    for i in range(DOCS):
        client.put_object(Bucket=bucket, Key=f"in/doc{i:03d}.pdf", Body=one_page_pdf(i))
    hook, calls = tmp_path / "hook", tmp_path / "calls"
    hook.mkdir()
    calls.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"PYTHONPATH": f"{hook}:{REPO}", "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(tmp_path),
            "RAYORCH_TEST_CALLS_DIR": str(calls)}
    proc = subprocess.Popen([sys.executable, "-m", "rayorch.cli", "run", "pdf", "--ocr", "text",
                             "--input", f"s3://{bucket}/in", "--output", f"s3://{bucket}/out",
                             "--json", "--no-progress"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out)["succeeded"] == DOCS
    made = [line.split("\t") for line in (calls / f"{proc.pid}.txt").read_text().splitlines()]
    assert ("list", "") in [tuple(c) for c in made]  # the hook saw the driver's own calls
    on_loop = [key for what, key in made if what == "write"
               and (key.endswith(".md") or key.startswith("part-"))]
    assert on_loop == []
