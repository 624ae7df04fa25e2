"""Lineage archived to a bucket of a real S3-API server (``--archive s3://...``), the archive
unreachable for 10 s mid-run: the run goes on (its facts stay in Redis meanwhile), the
segments land once the archive is back, every output is written once and the audit is OK.
A real ``rayorch driver`` subprocess on a real redis-server; the outage is a proxy that
resets every connection (``rayorch/testing_s3.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
from s3_tools import keys

from rayorch.runtime.sinks import delivered_count, read_outputs

pytestmark = [pytest.mark.s3, pytest.mark.timeout(600)]
pytest.importorskip("obstore")

REPO = Path(__file__).resolve().parents[2]


def _live_facts(url: str) -> int:
    client = redis.Redis.from_url(url)
    return sum(client.xlen(key) for key in client.scan_iter("ro:*:facts:*"))


def test_an_archive_unreachable_for_10_s_stalls_only_the_archive(
        s3_endpoint: str, ray_local: None, bucket: str, redis_url: str, tmp_path: Path) -> None:
    import ray

    from bench.faults import PacedPipeline
    from rayorch.cli import EXIT_OK, main
    from rayorch.core.facts import OutputEmitted
    from rayorch.replicas import create_run
    from rayorch.store.registry import open_store
    from rayorch.testing_s3 import FaultyProxy

    items = [f"item{i}" for i in range(24)]
    out = tmp_path / "out"
    archive = f"s3://{bucket}/lineage"
    run_id = create_run(PacedPipeline, [items], store=redis_url,
                        kwargs={"slow_s": 0.0, "each_s": 0.2}, out_dir=str(out), shards=3,
                        micro_batch=2, max_active_sources=4)
    log = tmp_path / "driver.log"
    with FaultyProxy(s3_endpoint) as proxy:
        env = {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint, "PYTHONPATH": str(REPO)}
        with open(log, "wb") as sink:
            driver = subprocess.Popen(
                [sys.executable, "-m", "rayorch.cli", "driver", run_id, "--store",
                 f"{redis_url}?archive_every=8", "--archive", archive, "--quiet",
                 "--address", ray.get_runtime_context().gcs_address],
                env=env, cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while not keys(s3_endpoint, bucket, f"lineage/{run_id}/"):
                assert driver.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.05)
            before = delivered_count(out)
            proxy.down(10)  # from the first segment on: gated on progress, not on time
            assert driver.wait(300) == 0, log.read_text()[-3000:]
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait(30)
    text = log.read_text()
    assert proxy.resets >= 1 and "unreachable" in text, text[-3000:]
    assert before < len(items)  # the outage began mid-run
    records = list(read_outputs(out))
    assert sorted(r["index"] for r in records) == list(range(len(items)))  # each once
    assert _live_facts(redis_url) == 0  # archived once the archive was back
    segments = keys(s3_endpoint, bucket, f"lineage/{run_id}/")
    assert segments and all(k.endswith(".facts") for k in segments)
    with open_store(redis_url) as store:
        emitted = Counter(s.fact.index for k in range(3) for s in store.read(run_id, k)
                          if isinstance(s.fact, OutputEmitted))
    assert emitted == Counter(range(len(items)))
    assert main(["audit", run_id, "--store", redis_url]) == EXIT_OK
