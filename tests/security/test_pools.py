"""Shared (detached) pools are released when no driver of their run is alive.

Measured before (issue 12): 20 s after the only driver was SIGKILLed, its shared pools
still answered and still held their CPUs (a GPU pool would hold its GPUs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.faults import FaultPipeline, make_docs
from rayorch.actors.orphan_watch import GRACE_ENV, OrphanWatch
from rayorch.actors.pool import SHARED_NAMESPACE
from rayorch.replicas import create_run
from rayorch.runtime.sinks import delivered_count

REPO = Path(__file__).resolve().parents[2]
RELEASE_BOUND_S = 45.0  # lease TTL 2 s + grace 2 s + checks every 2 s + Ray's own cleanup


def _run_actors(ray: object, run_id: str) -> list[str]:
    import ray as ray_mod

    names = ray_mod.util.list_named_actors(all_namespaces=True)
    return [a["name"] for a in names
            if a["namespace"] == SHARED_NAMESPACE and a["name"].startswith(f"rayorch:{run_id}:")]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_killing_the_only_driver_releases_its_pools(
        ray_local: None, redis_url: str, tmp_path: Path) -> None:
    import ray

    before = ray.available_resources()
    out = tmp_path / "out"
    run_id = create_run(FaultPipeline, [make_docs(400)], store=redis_url,
                        kwargs={"gpu_ms": 150}, out_dir=str(out), shards=2, micro_batch=2,
                        max_active_sources=4)
    env = dict(os.environ, PYTHONPATH=str(REPO), **{GRACE_ENV: "2"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "rayorch.cli", "driver", run_id, "--store", redis_url,
         "--address", ray.get_runtime_context().gcs_address, "--driver-id", "only",
         "--lease-ttl", "2", "--quiet"],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=(tmp_path / "err").open("w"))
    try:
        deadline = time.monotonic() + 120
        while not delivered_count(out) and time.monotonic() < deadline:
            assert proc.poll() is None, f"the driver exited early: {(tmp_path / 'err').read_text()}"
            time.sleep(0.2)
        actors = _run_actors(ray, run_id)
        # split, regions, join, assemble, and the OCR pool (it sizes itself: 1 to 4)
        assert 5 <= len(actors) <= 8, actors
        assert ray.available_resources().get("CPU", 0) < before["CPU"] - 1
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    killed = time.monotonic()
    while time.monotonic() - killed < RELEASE_BOUND_S:
        now = ray.available_resources()
        if (not _run_actors(ray, run_id) and now.get("CPU", 0) >= before["CPU"] - 1e-6
                and now.get("GPU", 0) >= before.get("GPU", 0) - 1e-6):
            break
        time.sleep(0.5)
    released = time.monotonic() - killed
    assert not _run_actors(ray, run_id), f"shared actors still alive {released:.0f}s after"
    now = ray.available_resources()
    assert now.get("CPU", 0) >= before["CPU"] - 1e-6, (before, now)
    assert now.get("GPU", 0) >= before.get("GPU", 0) - 1e-6, (before, now)
    print(f"pools of run {run_id} released {released:.1f}s after SIGKILL of the only driver")


def test_orphan_watch_decisions() -> None:
    watch = OrphanWatch(grace_s=5, startup_s=60)
    assert not watch.orphaned(0, [])  # pool being built, no driver yet: wait
    assert not watch.orphaned(10, [-100])  # an old driver of an earlier session
    assert not watch.orphaned(20, [22])  # alive
    assert not watch.orphaned(24, [22]) and not watch.orphaned(26.9, [22])
    assert watch.orphaned(27, [22])  # nobody alive for the grace period after the deadline
    missed = OrphanWatch(grace_s=5, startup_s=60)
    assert not missed.orphaned(0, [])
    assert not missed.orphaned(8, [7]) and missed.orphaned(12, [7])  # never sampled alive
    never = OrphanWatch(grace_s=5, startup_s=60)
    assert not never.orphaned(0, []) and not never.orphaned(59, [-1])
    assert never.orphaned(61, [-1])  # a driver that never came
    clean = OrphanWatch(grace_s=5, startup_s=60)
    assert not clean.orphaned(0, [30]) and not clean.orphaned(40, [])  # left cleanly
    assert clean.orphaned(45, [])
    # Started mid-run (grown, adopted, replaced): its driver died while it started
    grown = OrphanWatch(grace_s=5, startup_s=60, driver_seen=True)
    assert not grown.orphaned(10, [8]) and not grown.orphaned(12.9, [8])
    assert grown.orphaned(13, [8])  # not 60 s: the run had a driver, gone since its deadline
    first = OrphanWatch(grace_s=5, startup_s=60)
    assert not first.orphaned(13, [8])  # a pool's first actors wait for its first heartbeat
