"""Driver replicas: registry, manifest, fencing of a deposed driver, resume, and fault injection.

Real Ray (the session's local instance, or the harness's own in a subprocess) and real
redis-server (private, on a free port; AOF where Redis is killed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import rayorch as ro
from bench.faults import FaultPipeline, make_docs
from rayorch import F
from rayorch.cli import main as cli_main
from rayorch.core.facts import LeaseAcquired, OutputEmitted
from rayorch.core.reference import evaluate
from rayorch.inspect.audit import audit_run
from rayorch.replicas import create_run, join_run
from rayorch.runtime.sinks import delivered_count, read_outputs
from rayorch.store.base import LineageStore
from rayorch.store.records import ManifestError
from rayorch.store.registry import open_store

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]


def outputs_match_reference(out_dir: Path, docs: list[str]) -> None:
    reference = evaluate(FaultPipeline(gpu_ms=0).compile(), [(d,) for d in docs]).outputs
    files = {record["index"]: record for record in read_outputs(out_dir)}
    assert sorted(files) == sorted(reference)
    for index, (item,) in reference.items():
        record = files[index]
        assert (record["outcome"] == "present") == item.present, index
        if item.present:
            assert record["value"] == item.value, index


def emitted_counts(store: LineageStore, run_id: str) -> Counter[int]:
    counts: Counter[int] = Counter()
    for facts in store.read_run(run_id).values():
        for stored in facts:
            if isinstance(stored.fact, OutputEmitted):
                counts[stored.fact.index] += 1
    return counts


# -- manifest -------------------------------------------------------------------------------
class LocalModule:
    def __call__(self, xs: list[Any]) -> list[Any]:
        return xs


@pytest.mark.timeout(30)
def test_create_run_refuses_a_class_other_drivers_cannot_import(redis_url: str) -> None:
    class Local(ro.Pipeline):
        def __init__(self) -> None:
            super().__init__()
            self.m = ro.RayModule(LocalModule)

        def forward(self, xs: Any) -> Any:
            return self.m(xs)

    with pytest.raises(ManifestError, match="inside a function"):
        create_run(Local, [[1, 2]], store=redis_url)
    Local.__module__ = "__main__"
    with pytest.raises(ManifestError, match="__main__"):
        create_run(Local, [[1, 2]], store=redis_url)
    with pytest.raises(ManifestError, match="cannot be imported"):
        create_run("no_such_module_xyz:Pipe", [[1]], store=redis_url)
    bad = FaultPipeline
    with pytest.raises(ManifestError, match="source 0 cannot be recorded"):
        create_run(bad, [[{1, 2}]], store=redis_url)


@pytest.mark.timeout(60)
def test_a_run_id_reopened_with_other_inputs_is_refused_naming_what_differs(
        redis_url: str, tmp_path: Path) -> None:
    """The same id with the same plan and inputs reopens; other inputs, another source count,
    other constructor arguments or another output directory are one line, not a silent
    run of the first inputs."""
    from rayorch.store.errors import RunMismatchError

    docs = make_docs(5)
    first = create_run(FaultPipeline, [docs], store=redis_url, kwargs={"gpu_ms": 5},
                       run_id="same-id", shards=1)
    assert create_run(FaultPipeline, [docs], store=redis_url, kwargs={"gpu_ms": 5},
                      run_id=first, shards=1) == first
    with pytest.raises(RunMismatchError, match=r"started with inputs 5 sources \(digest "
                       r"\w+\), but it was reopened with inputs 10 sources"):
        create_run(FaultPipeline, [make_docs(10)], store=redis_url, kwargs={"gpu_ms": 5},
                   run_id=first, shards=1)
    other = [doc + "x" for doc in docs]
    with pytest.raises(RunMismatchError, match=r"inputs 5 sources .* inputs 5 sources"):
        create_run(FaultPipeline, [other], store=redis_url, kwargs={"gpu_ms": 5},
                   run_id=first, shards=1)
    with pytest.raises(RunMismatchError, match="constructor arguments"):
        create_run(FaultPipeline, [docs], store=redis_url, kwargs={"gpu_ms": 6},
                   run_id=first, shards=1)
    with pytest.raises(RunMismatchError, match="output directory"):
        create_run(FaultPipeline, [docs], store=redis_url, kwargs={"gpu_ms": 5},
                   run_id=first, shards=1, out_dir=str(tmp_path / "out"))
    assert cli_main(["runs", "--store", redis_url]) == 0  # the store still reads cleanly


# -- a deposed driver is fenced off --------------------------------------------------------------
@pytest.mark.timeout(150)
def test_deposed_driver_is_fenced_and_the_run_completes_once(
    ray_local: None, redis_url: str, tmp_path: Path
) -> None:
    """Driver A stalls past its lease TTL (as under SIGSTOP); B takes over and finishes;
    when A wakes up every write it tries is rejected and it stops touching the shards."""
    docs = make_docs(16)
    out = tmp_path / "out"
    run_id = create_run(FaultPipeline, [docs], store=redis_url, kwargs={"gpu_ms": 30},
                        out_dir=str(out), shards=2, micro_batch=2, max_active_sources=4)
    a = join_run(run_id, store=redis_url, driver_id="a", lease_ttl_s=1.0, quiet=True)
    first = next(a)
    holders = open_store(redis_url)
    assert {holders.lease_holder(run_id, k).driver for k in (0, 1)} == {"a"}  # type: ignore[union-attr]
    holders.close()
    time.sleep(1.6)  # A is frozen: its leases and its heartbeat expire
    b = join_run(run_id, store=redis_url, driver_id="b", lease_ttl_s=1.0, quiet=True)
    b_emitted = [index for index, _ in b]
    rest = [index for index, _ in a]  # A wakes up: fenced everywhere
    assert rest == []
    assert a.stats.shards_lost >= 1
    store = open_store(redis_url)
    counts = emitted_counts(store, run_id)
    assert set(counts.values()) == {1}, "every output is emitted exactly once"
    assert sorted([first[0], *b_emitted]) == sorted(counts) == list(range(len(docs)))
    epochs = [s.fact.epoch for facts in store.read_run(run_id).values() for s in facts
              if isinstance(s.fact, LeaseAcquired) and s.fact.driver == "b"]
    assert epochs and min(epochs) >= 2
    outputs_match_reference(out, docs)
    assert audit_run(store, run_id).ok


# -- resume after every driver died; status ----------------------------------------------------
def driver_cmd(run_id: str, url: str, address: str, driver_id: str) -> list[str]:
    return [sys.executable, "-m", "rayorch.cli", "driver", run_id, "--store", url,
            "--address", address, "--driver-id", driver_id, "--lease-ttl", "2"]


def kill_driver_once_delivered(run_id: str, url: str, out: Path, at_least: int = 1) -> None:
    """Run ``rayorch driver`` in a subprocess on this test's Ray; SIGKILL it once
    ``at_least`` outputs are delivered to ``out`` (or after 90 s)."""
    import ray

    env = dict(os.environ, PYTHONPATH=str(REPO))
    address = ray.get_runtime_context().gcs_address
    proc = subprocess.Popen(driver_cmd(run_id, url, address, "doomed"), env=env,
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    while delivered_count(out) < at_least and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


@pytest.mark.long
@pytest.mark.timeout(150)
def test_resume_after_all_drivers_died_and_status(
    ray_local: None, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    docs = make_docs(24)
    out = tmp_path / "out"
    run_id = create_run(FaultPipeline, [docs], store=redis_url, kwargs={"gpu_ms": 40},
                        out_dir=str(out), shards=3, micro_batch=2, max_active_sources=4)
    kill_driver_once_delivered(run_id, redis_url, out)
    assert cli_main(["status", run_id, "--store", redis_url, "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert not before["complete"]
    assert cli_main(["resume", run_id, "--store", redis_url, "--lease-ttl", "2"]) == 0
    capsys.readouterr()
    assert cli_main(["status", run_id, "--store", redis_url, "--json"]) == 0
    after = json.loads(capsys.readouterr().out)
    assert after["complete"] and after["parents"]["in_progress"] == 0
    assert after["parents"]["done"] + after["parents"]["failed"] == len(docs)
    store = open_store(redis_url)
    assert set(emitted_counts(store, run_id).values()) == {1}
    outputs_match_reference(out, docs)
    assert audit_run(store, run_id).ok


# -- Redis killed and restarted mid-run (AOF) ----------------------------------------------------
@pytest.mark.long
@pytest.mark.timeout(180)
def test_redis_restart_mid_run_loses_no_fact_and_the_run_completes(
    ray_local: None, redis_aof_server: Any, tmp_path: Path
) -> None:
    import ray

    url = redis_aof_server.url
    docs = make_docs(30)
    out = tmp_path / "out"
    run_id = create_run(FaultPipeline, [docs], store=url, kwargs={"gpu_ms": 40},
                        out_dir=str(out), shards=2, micro_batch=2, max_active_sources=4)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    address = ray.get_runtime_context().gcs_address
    log = tmp_path / "driver.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(driver_cmd(run_id, url, address, "survivor"), env=env,
                                cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while delivered_count(out) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    store = open_store(url)
    before = store.read_run(run_id)
    store.close()
    redis_aof_server.kill()
    time.sleep(2.0)
    redis_aof_server.start()
    assert proc.wait(150) == 0, log.read_text()[-3000:]
    after = open_store(url).read_run(run_id)
    for shard, facts in before.items():
        assert after[shard][: len(facts)] == facts, "a fact written before the crash is gone"
    text = log.read_text()
    assert "cannot reach the lineage store" in text and "reachable again" in text
    assert set(emitted_counts(open_store(url), run_id).values()) == {1}
    outputs_match_reference(out, docs)
    assert audit_run(open_store(url), run_id).ok


# -- API: join_run on the memory store (one process) ------------------------------------------
class Double:
    def __call__(self, xs: list[int]) -> list[Any]:
        return [[x, x] for x in xs]


class Sum:
    def __call__(self, groups: list[list[int]]) -> list[int]:
        return [sum(g) for g in groups]


class Pairs(ro.Pipeline):
    def __init__(self) -> None:
        super().__init__()
        self.double = ro.RayModule(Double, num_cpus=0.1, batch_size=3)
        self.sum = ro.RayModule(Sum, num_cpus=0.1, batch_size=3)

    def forward(self, xs: Any) -> Any:
        return self.sum(F.reduce(F.expand(self.double(xs))))


@pytest.mark.timeout(90)
def test_join_run_on_the_memory_store(ray_local: None) -> None:
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    url = f"memory://join-{time.monotonic_ns()}"
    held = open_store(url)  # a memory store lives while it is open: from create to join
    run_id = create_run(Pairs, [list(range(10))], store=url, shards=2, micro_batch=3)
    with join_run(run_id, store=url, quiet=True) as handle:
        results = dict(handle)
    assert results == {i: 2 * i for i in range(10)}
    assert audit_run(held, run_id).ok
    held.close()


# -- the fault-injection harness, short (CI runs it after the default suite: .ci/run) -----------
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_fault_harness_short(tmp_path: Path) -> None:
    """2 drivers under SIGKILL of a driver and of actors, SIGSTOP/SIGCONT, a Redis restart,
    lost replies; a Pipeline.run caller killed and one stopped, both resumed."""
    result_file = tmp_path / "result.json"
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_AUTH_MODE="disabled",
               RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.faults", "--docs", "60", "--drivers", "2", "--shards", "4",
         "--driver-kills", "1", "--actor-kills", "2", "--stops", "1", "--redis-restarts", "1",
         "--gpu-ms", "60", "--interval", "2", "--lease-ttl", "3", "--timeout", "180",
         "--json", str(result_file)],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=230)
    assert result_file.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(result_file.read_text())
    assert result["outputs_lost"] == 0
    assert result["outputs_duplicated"] == 0
    assert result["outputs_wrong"] == 0
    assert result["audit_ok"], result["audit_violations"]
    assert sum(result["faults"].values()) >= 3, result["faults"]
    # the caller path (one caller killed, one stopped, each resumed) and lost replies
    assert result["caller_runs"] == 2 and result["resumes"] >= 1, result
    assert result["lost_replies"] >= 1, result["faults"]
    assert proc.returncode == 0, proc.stdout[-3000:]


# -- Pipeline.run on Redis records a manifest: resume after SIGKILL -----------------------------
_PLAIN_RUN = """
import sys
from bench.faults import FaultPipeline, make_docs
from rayorch.runtime.sinks import FileSink
url, address, run_id, out = sys.argv[1:5]
sink = FileSink(out, run_id=run_id)
handle = FaultPipeline(gpu_ms=40).run(make_docs(24), store=url, address=address, run_id=run_id,
                                      micro_batch=2, max_active_sources=4, lease_ttl_s=2.0,
                                      progress=False)
for index, value in handle:
    sink.write_part(0, [(index, value)])
"""


def last_written_index(out_dir: Path) -> int:
    """The source of the part file written last in ``out_dir`` (one source per part)."""
    parts = [p for p in out_dir.iterdir() if p.suffix == ".jsonl"]
    last = max(parts, key=lambda p: p.stat().st_mtime_ns)
    return int(json.loads(last.read_text().splitlines()[0])["index"])


@pytest.mark.long
@pytest.mark.timeout(150)
def test_plain_pipeline_run_on_redis_is_resumable_after_sigkill(
    ray_local: None, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import ray

    docs = make_docs(24)
    mine, out = tmp_path / "mine", tmp_path / "out"  # the caller's own files; the resume's
    run_id = f"plain-{time.monotonic_ns()}"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    address = ray.get_runtime_context().gcs_address
    proc = subprocess.Popen([sys.executable, "-c", _PLAIN_RUN, redis_url, address, run_id,
                             str(mine)], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 90
    while delivered_count(mine) < 2 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=10)
    assert b"will not be resumable" not in stderr
    store = open_store(redis_url)
    emitted_before = set(emitted_counts(store, run_id))
    assert 0 < len(emitted_before) < len(docs), "the kill must land mid-run"
    assert cli_main(["resume", run_id, "--store", redis_url, "--lease-ttl", "2", "--quiet",
                     "--out-dir", str(out)]) == 0
    assert cli_main(["audit", run_id, "--store", redis_url, "--out-dir", str(out)]) == 0
    capsys.readouterr()
    assert set(emitted_counts(store, run_id).values()) == {1}, "every output emitted once"
    reference = evaluate(FaultPipeline(gpu_ms=0).compile(), [(d,) for d in docs]).outputs
    files = {r["index"]: r for d in (mine, out) for r in read_outputs(d)}
    # At-least-once at the caller's boundary (docs/ARCHITECTURE.md, "Delivery"): the item the
    # caller held when it was killed (the last one it wrote) may come again from the resume;
    # no other source may.
    twice = {r["index"] for r in read_outputs(mine)} & {r["index"] for r in read_outputs(out)}
    assert twice <= {last_written_index(mine)}, f"sources {sorted(twice)} twice"
    # The killed process may have had outputs emitted in the store but not yet written by its
    # caller; every other source has its file, from the caller or from the resume.
    assert set(reference) - set(files) <= emitted_before
    for index, record in files.items():
        (item,) = reference[index]
        assert (record["outcome"] == "present") == item.present, index
        if item.present:
            assert record["value"] == item.value, index


def test_plain_run_manifest_refusals_say_why() -> None:
    from rayorch.runtime.manifest import manifest_of_run

    pipe = FaultPipeline(gpu_ms=7)
    manifest = manifest_of_run(pipe, [["a", "b"]], max_active_sources=4, depth=None)
    assert manifest.pipeline == "bench.faults:FaultPipeline"
    assert manifest.kwargs == {"gpu_ms": 7} and manifest.sources == (("a",), ("b",))
    with pytest.raises(ManifestError, match="not a list or tuple"):
        manifest_of_run(pipe, [iter(["a"])], max_active_sources=4, depth=None)
    with pytest.raises(ManifestError, match="source 0 cannot be recorded"):
        manifest_of_run(pipe, [[{1}]], max_active_sources=4, depth=None)
    with pytest.raises(ManifestError, match="constructor arguments"):
        manifest_of_run(FaultPipeline(pid_dir=Path("pids")),  # type: ignore[arg-type]
                        [["a"]], max_active_sources=4, depth=None)
