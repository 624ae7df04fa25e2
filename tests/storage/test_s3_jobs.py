"""The data plane on an object store: the PDF job and replica drivers with inputs, sink and
payloads in a bucket of a real S3-API server on loopback (conftest.py), nothing on disk.

Every run is a real ``rayorch`` subprocess, as a user starts it, with a private Ray and,
where the test needs one, a real redis-server. Each test checks from the outside: the
bucket's keys (boto3), ``read_outputs``, ``rayorch audit`` and the working directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from s3_tools import keys

from rayorch.runtime.sinks import delivered_count, read_outputs

pytestmark = [pytest.mark.s3, pytest.mark.timeout(900)]

pytest.importorskip("pymupdf")
pytest.importorskip("obstore")

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "pdfs"
SMALL = ["phonrule-doc.pdf", "poemscol-cheatsheet.pdf", "qtree-qarrows.pdf", "parallel.pdf"]


def cli_env(home: Path) -> dict[str, str]:
    """The user's environment: credentials and endpoint from AWS_*, a HOME of its own (so a
    stray write to ~/.cache shows), no Ray address."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return {**env, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(home)}


def upload(bucket: str, prefix: str, files: list[Path]) -> None:
    import boto3

    client = boto3.client("s3")
    for path in files:
        client.put_object(Bucket=bucket, Key=f"{prefix}/{path.name}", Body=path.read_bytes())


def read_key(bucket: str, key: str) -> bytes:
    import boto3

    return bytes(boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read())


def no_rayorch_files(cwd: Path, home: Path) -> list[str]:
    """Files in the working directory, and rayorch's under HOME (its payload cache): a run
    on S3 writes none. (Libraries' own caches under HOME, e.g. onnxruntime's, are theirs.)"""
    return sorted([str(p) for p in cwd.rglob("*")] +
                  [str(p) for p in home.rglob("*") if "rayorch" in str(p.relative_to(home))])


def run_cli(argv: list[str], cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rayorch.cli", *argv], cwd=cwd,
                          env=cli_env(home), capture_output=True, text=True, timeout=600,
                          check=False)


def test_the_pdf_job_from_s3_to_s3_writes_what_a_local_run_writes(
        s3_endpoint: str, bucket: str, tmp_path: Path) -> None:
    local_in = tmp_path / "in"
    local_in.mkdir()
    for name in SMALL:
        shutil.copyfile(EXAMPLES / name, local_in / name)
    upload(bucket, "corpus/in", sorted(local_in.iterdir()))
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()

    remote = run_cli(["run", "pdf", "--input", f"s3://{bucket}/corpus/in", "--output",
                      f"s3://{bucket}/corpus/out", "--json", "--no-progress"], cwd, home)
    assert remote.returncode == 0, remote.stderr[-3000:]
    local = run_cli(["run", "pdf", "--input", str(local_in), "--output",
                     str(tmp_path / "out"), "--json", "--no-progress"], tmp_path, home)
    assert local.returncode == 0, local.stderr[-3000:]
    assert json.loads(remote.stdout)["succeeded"] == len(SMALL)

    stored = keys(s3_endpoint, bucket, "corpus/out/")
    md = sorted(k.rpartition("/")[2] for k in stored if k.endswith(".md"))
    assert md == sorted(p.name for p in (tmp_path / "out").glob("*.md"))
    for name in md:  # the same documents, byte for byte but the line naming their source
        remote_md = read_key(bucket, f"corpus/out/{name}").decode()
        local_md = (tmp_path / "out" / name).read_text()
        source = f"<!-- source: s3://{bucket}/corpus/in/{name.partition('-')[2][:-3]}.pdf -->"
        assert source in remote_md
        assert remote_md.replace(source, "") == re.sub(r"<!-- source: [^>]* -->", "", local_md)
    rows = [json.loads(line) for line in
            read_key(bucket, "corpus/out/documents.jsonl").decode().splitlines()]
    local_rows = [json.loads(line) for line in
                  (tmp_path / "out" / "documents.jsonl").read_text().splitlines()]
    assert [r["source"] for r in rows] == [f"s3://{bucket}/corpus/in/{n}" for n in sorted(SMALL)]
    drop = ("source",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in rows] == \
        [{k: v for k, v in r.items() if k not in drop} for r in local_rows]
    records = list(read_outputs(f"s3://{bucket}/corpus/out"))
    assert sorted(r["index"] for r in records) == list(range(len(SMALL)))
    # nothing of the run landed on local disk, in the working directory or in HOME
    assert no_rayorch_files(cwd, home) == []
    assert not [k for k in stored if ".rayorch-tmp-" in k]


def test_a_killed_job_resumed_on_s3_has_every_document_once(
        s3_endpoint: str, bucket: str, tmp_path: Path) -> None:
    files = []
    for copy in ("a", "b", "c"):
        for name in SMALL:
            target = tmp_path / f"{copy}-{name}"
            shutil.copyfile(EXAMPLES / name, target)
            files.append(target)
    upload(bucket, "in", files)
    out = f"s3://{bucket}/out"
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    argv = [sys.executable, "-m", "rayorch.cli", "run", "pdf", "--input", f"s3://{bucket}/in",
            "--output", out, "--render-replicas", "1", "--no-progress"]
    first = subprocess.Popen(argv, cwd=cwd, env=cli_env(home), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not delivered_count(out) and time.monotonic() < deadline:
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            time.sleep(0.05)
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait(60)
    delivered = {r["index"] for r in read_outputs(out)}
    assert 0 < len(delivered) < len(files), "the kill must land mid-run"

    again = subprocess.run([*argv, "--resume", "--json"], cwd=cwd, env=cli_env(home),
                           capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads(again.stdout)
    assert (summary["succeeded"], summary["failed"]) == (len(files), 0)
    records = sorted(read_outputs(out), key=lambda r: r["index"])  # a source twice raises
    assert [r["index"] for r in records] == list(range(len(files)))
    rows = [json.loads(line) for line in
            read_key(bucket, "out/documents.jsonl").decode().splitlines()]
    assert [r["value"] for r in records] == rows
    stored = keys(s3_endpoint, bucket, "out/")
    assert sorted(k.rpartition("/")[2] for k in stored if k.endswith(".md")) == \
        sorted(r["markdown"] for r in rows)  # one .md each, none stale
    assert no_rayorch_files(cwd, home) == []


# -- replica drivers: store in Redis, sink and payloads in the bucket ---------------------------
def _address() -> str:
    """The session's Ray (conftest ``ray_local``: GPUs declared for the fault pipeline)."""
    import ray

    return str(ray.get_runtime_context().gcs_address)


def _driver(run_id: str, url: str, driver_id: str, cwd: Path, home: Path, log: Path
            ) -> subprocess.Popen[bytes]:
    with open(log, "wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "rayorch.cli", "driver", run_id, "--store", url,
             "--driver-id", driver_id, "--lease-ttl", "2", "--address", _address()], cwd=cwd,
            env=cli_env(home), stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)


def emitted(url: str, run_id: str) -> Counter[int]:
    from rayorch.core.facts import OutputEmitted
    from rayorch.store.registry import open_store

    counts: Counter[int] = Counter()
    for facts in open_store(url).read_run(run_id).values():
        counts.update(s.fact.index for s in facts if isinstance(s.fact, OutputEmitted))
    return counts


def check_outputs(out: str, docs: list[str]) -> None:
    from bench.faults import FaultPipeline
    from rayorch.core.reference import evaluate

    reference = evaluate(FaultPipeline(gpu_ms=0).compile(), [(d,) for d in docs]).outputs
    found = {r["index"]: r for r in read_outputs(out)}
    assert sorted(found) == sorted(reference)
    for index, (item,) in reference.items():
        assert (found[index]["outcome"] == "present") == item.present, index
        if item.present:
            assert found[index]["value"] == item.value, index


def test_replica_drivers_with_sink_and_payloads_in_the_bucket_one_killed(
        s3_endpoint: str, ray_local: None, bucket: str, redis_url: str, tmp_path: Path) -> None:
    from bench.faults import FaultPipeline, make_docs
    from rayorch.replicas import create_run

    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    url = f"{redis_url}?payload_dir=s3://{bucket}/payloads&payload_threshold=64"
    out = f"s3://{bucket}/out"
    docs = make_docs(24)
    run_id = create_run(FaultPipeline, [docs], store=url, kwargs={"gpu_ms": 40}, out_dir=out,
                        shards=3, micro_batch=2, max_active_sources=4)
    doomed = _driver(run_id, url, "doomed", cwd, home, tmp_path / "doomed.log")
    survivor = _driver(run_id, url, "survivor", cwd, home, tmp_path / "survivor.log")
    try:
        deadline = time.monotonic() + 120
        while delivered_count(out) < 2 and time.monotonic() < deadline:
            assert doomed.poll() is None, (tmp_path / "doomed.log").read_text()[-3000:]
            time.sleep(0.1)
        os.killpg(doomed.pid, signal.SIGKILL)
        assert survivor.wait(300) == 0, (tmp_path / "survivor.log").read_text()[-3000:]
    finally:
        for proc in (doomed, survivor):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
    assert set(emitted(url, run_id).values()) == {1}, "every output emitted once"
    check_outputs(out, docs)
    audit = run_cli(["audit", run_id, "--store", url], cwd, home)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    payloads = keys(s3_endpoint, bucket, f"payloads/{run_id}/")
    assert any(k.endswith(".seg") for k in payloads), payloads
    assert no_rayorch_files(cwd, home) == []


def test_an_outage_and_throttling_stall_the_run_then_it_completes(
        s3_endpoint: str, ray_local: None, bucket: str, redis_url: str, tmp_path: Path) -> None:
    from bench.faults import FaultPipeline, make_docs
    from rayorch.replicas import create_run
    from rayorch.testing_s3 import FaultyProxy

    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    out = f"s3://{bucket}/out"
    docs = make_docs(24)
    run_id = create_run(FaultPipeline, [docs], store=redis_url, kwargs={"gpu_ms": 60},
                        out_dir=out, shards=2, micro_batch=2, max_active_sources=4)
    log = tmp_path / "driver.log"
    with FaultyProxy(s3_endpoint) as proxy:
        env: dict[str, Any] = {"AWS_ENDPOINT_URL": proxy.endpoint}
        with open(log, "wb") as sink:
            driver = subprocess.Popen(
                [sys.executable, "-m", "rayorch.cli", "driver", run_id, "--store", redis_url,
                 "--lease-ttl", "5", "--address", _address()], cwd=cwd,
                env={**cli_env(home), **env}, stdout=sink,
                stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while delivered_count(out) < 2 and time.monotonic() < deadline:
                assert driver.poll() is None, log.read_text()[-3000:]
                time.sleep(0.1)
            # Both from the first deliveries on, gated on progress, not on time: every
            # connection is reset for 25 s (the run cannot deliver meanwhile), then the next
            # six requests answer 503 SlowDown.
            proxy.down(25)
            proxy.throttle(6)
            assert driver.wait(300) == 0, log.read_text()[-3000:]
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait(30)
    text = log.read_text()
    assert proxy.throttled >= 1 and proxy.resets >= 1, (proxy.throttled, proxy.resets)
    assert "unreachable" in text and "reachable again" in text, text[-3000:]
    assert set(emitted(redis_url, run_id).values()) == {1}
    check_outputs(out, docs)
    audit = run_cli(["audit", run_id, "--store", redis_url], cwd, home)
    assert audit.returncode == 0, audit.stdout + audit.stderr
