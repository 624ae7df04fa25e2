"""Size-rolled parts with driver replicas: a driver SIGKILLed while it fills a part.

Two real ``rayorch driver`` subprocesses share a run whose sink rolls WebDataset parts by
size (``create_run(out_format="wds", shard_size=...)``); one is SIGKILLed once parts appear.
The survivor takes its shards over (lease TTL 2 s): the part the dead driver was filling is
never visible, its sources are delivered again, and every source is in exactly one part,
with one ``OutputEmitted`` each, the reference's values, and a passing audit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from bench.faults import FaultPipeline, make_docs
from rayorch.core.facts import OutputEmitted
from rayorch.core.reference import evaluate
from rayorch.inspect.audit import audit_run
from rayorch.replicas import create_run
from rayorch.runtime.sinks import read_outputs
from rayorch.store.records.sink import PartName
from rayorch.store.registry import open_store

pytestmark = [pytest.mark.integration, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]


def driver(run_id: str, url: str, address: str, name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "rayorch.cli", "driver", run_id, "--store", url, "--address",
         address, "--driver-id", name, "--lease-ttl", "2", "--quiet"],
        env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)


def parts(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if PartName.parse(p.name)) if out.is_dir() \
        else []


@pytest.mark.timeout(300)
def test_a_driver_killed_mid_part_leaves_every_source_in_one_part(
        ray_local: None, redis_url: str, tmp_path: Path) -> None:
    import ray

    docs = make_docs(40)
    out = tmp_path / "out"
    run_id = create_run(FaultPipeline, [docs], store=redis_url, kwargs={"gpu_ms": 30},
                        out_dir=str(out), out_format="wds", shard_size=3_000, shards=4,
                        micro_batch=2, max_active_sources=6)
    address = ray.get_runtime_context().gcs_address
    doomed = driver(run_id, redis_url, address, "doomed")
    survivor = driver(run_id, redis_url, address, "survivor")
    try:
        deadline = time.monotonic() + 120
        while not parts(out) and time.monotonic() < deadline and doomed.poll() is None:
            time.sleep(0.05)
        assert parts(out), "no part appeared while the run went on"
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
        assert survivor.wait(240) == 0
    finally:
        for proc in (doomed, survivor):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    store = open_store(redis_url)
    emitted: Counter[int] = Counter()
    for facts in store.read_run(run_id).values():
        emitted.update(s.fact.index for s in facts if isinstance(s.fact, OutputEmitted))
    assert sorted(emitted) == list(range(len(docs))) and set(emitted.values()) == {1}
    records = {r["index"]: r for r in read_outputs(out)}  # a source in two parts raises
    reference = evaluate(FaultPipeline(gpu_ms=0).compile(), [(d,) for d in docs]).outputs
    assert sorted(records) == sorted(reference)
    for index, (item,) in reference.items():
        assert (records[index]["outcome"] == "present") == item.present
        if item.present:
            assert records[index]["value"] == item.value
    assert len(parts(out)) > 2
    assert audit_run(store, run_id).ok
