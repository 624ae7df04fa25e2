"""Leases across a Redis restore from an older RDB snapshot (or an async replica promoted).

A restore forgets every lease acquired after the snapshot, so the epoch counter goes
back and two drivers can end up with the same epoch number. The fence must still let
only the current holder write (docs/topics/FAILOVER.md, "Leases, holder tokens and rollback").
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from bench.faults import PacedPipeline
from rayorch.cli import main as cli_main
from rayorch.core.facts import (
    GrainCommitted,
    GrainDispatched,
    GrainFailed,
    GrainRetried,
    LeaseAcquired,
    OutputEmitted,
    SourceAdmitted,
)
from rayorch.inspect.audit import audit_run
from rayorch.replicas import create_run
from rayorch.runtime.sinks import delivered_count, read_outputs
from rayorch.store import (
    AppendBasis,
    FencedError,
    LeaseRolledBackError,
    LineageStore,
    StoreRolledBackError,
    open_store,
)
from rayorch.store.records.sink import PartName
from rayorch.store.scripted_run import scripted_plan
from rayorch.testing import RedisServer

pytestmark = pytest.mark.integration

RUN = "rollback"
REPO = Path(__file__).resolve().parents[2]


def snapshot(server: RedisServer, to: Path) -> None:
    """SAVE an RDB snapshot now and keep a copy of it."""
    redis.Redis.from_url(server.url).save()
    shutil.copy(server.workdir / "dump.rdb", to)


def restore(server: RedisServer, snap: Path) -> None:
    """Crash the server and bring it back from the older snapshot."""
    server.kill()
    shutil.copy(snap, server.workdir / "dump.rdb")
    server.start()


def admitted(store: LineageStore) -> list[SourceAdmitted]:
    return [s.fact for s in store.read(RUN, 0) if isinstance(s.fact, SourceAdmitted)]


@pytest.fixture
def stores(redis_server: RedisServer) -> tuple[LineageStore, LineageStore]:
    """Two clients of one server, as two driver processes would have."""
    first, second = (open_store(redis_server.url + "?retries=20") for _ in range(2))
    first.open_run(RUN, scripted_plan())
    epoch = first.acquire_lease(RUN, 0, "driver-x", ttl_s=60)
    first.release_lease(RUN, 0, "driver-x", epoch)
    return first, second


@pytest.mark.parametrize("second_driver", ["driver-b", "driver-a"])
def test_two_holders_of_one_epoch_number_only_the_current_one_writes(
    redis_server: RedisServer, stores: tuple[LineageStore, LineageStore], tmp_path: Path,
    second_driver: str,
) -> None:
    # driver-b is another driver; driver-a again is a second process reusing the same
    # driver id (e.g. `rayorch driver --driver-id`): only the holder token tells them apart.
    store_a, store_b = stores
    snap = tmp_path / "old.rdb"
    snapshot(redis_server, snap)                      # epoch counter 1
    epoch_a = store_a.acquire_lease(RUN, 0, "driver-a", ttl_s=60)
    store_a.append(RUN, 0, epoch_a, [SourceAdmitted(0, ("a-before",))], driver="driver-a")
    restore(redis_server, snap)                       # driver-a's lease is forgotten
    epoch_b = store_b.acquire_lease(RUN, 0, second_driver, ttl_s=60)
    assert epoch_b == epoch_a == 2                    # the same epoch number, twice
    store_b.append(RUN, 0, epoch_b, [SourceAdmitted(0, ("b",))], driver=second_driver)
    lost = f"continued by driver '{second_driver}' \\(epoch 2\\)"
    with pytest.raises(FencedError, match=lost):
        store_a.append(RUN, 0, epoch_a, [SourceAdmitted(1, ("a-after",))], driver="driver-a")
    with pytest.raises(FencedError, match=lost):
        store_a.renew_lease(RUN, 0, "driver-a", epoch_a, ttl_s=60)
    with pytest.raises(FencedError, match=lost):
        store_a.acquire_lease(RUN, 0, "driver-a", ttl_s=60, after_epoch=epoch_a)
    store_b.append(RUN, 0, epoch_b, [SourceAdmitted(1, ("b",))], driver=second_driver)
    assert admitted(store_b) == [SourceAdmitted(0, ("b",)), SourceAdmitted(1, ("b",))]
    assert store_b.lease_holder(RUN, 0) == (second_driver, epoch_b)


def test_a_driver_returning_after_a_restore_is_told_and_raises_the_epoch(
    redis_server: RedisServer, stores: tuple[LineageStore, LineageStore], tmp_path: Path,
) -> None:
    store_a, store_b = stores
    snap = tmp_path / "old.rdb"
    snapshot(redis_server, snap)
    epoch_a = store_a.acquire_lease(RUN, 0, "driver-a", ttl_s=60)
    restore(redis_server, snap)
    with pytest.raises(LeaseRolledBackError, match="has no record of this driver's epoch 2 "
                                                   "\\(its last lease is epoch 1 by driver "
                                                   "'driver-x'\\)"):
        store_a.append(RUN, 0, epoch_a, [SourceAdmitted(0, ("a",))], driver="driver-a")
    # once a driver has shown its epoch, a new holder numbers above it
    assert store_b.acquire_lease(RUN, 0, "driver-b", ttl_s=60) == epoch_a + 1
    leases = [s.fact for s in store_b.read(RUN, 0) if isinstance(s.fact, LeaseAcquired)]
    assert [(f.driver, f.epoch) for f in leases] == [("driver-x", 1), ("driver-b", 3)]
    assert admitted(store_b) == []


def test_two_clients_with_one_driver_id_only_the_later_acquirer_writes(
    stores: tuple[LineageStore, LineageStore],
) -> None:
    first, second = stores
    epoch = first.acquire_lease(RUN, 0, "driver-a", ttl_s=60)
    assert second.acquire_lease(RUN, 0, "driver-a", ttl_s=60) == epoch  # same id: same epoch
    with pytest.raises(FencedError, match=f"continued by driver 'driver-a' \\(epoch {epoch}\\)"):
        first.append(RUN, 0, epoch, [SourceAdmitted(0, ("first",))], driver="driver-a")
    second.append(RUN, 0, epoch, [SourceAdmitted(0, ("second",))], driver="driver-a")
    assert admitted(second) == [SourceAdmitted(0, ("second",))]


# -- an AOF cut short by an OS crash, under a driver that keeps its lease ----------------------
def _aof_tail(server: RedisServer) -> Path:
    return sorted((server.workdir / "appendonlydir").glob("*.incr.aof"))[-1]


def _wait_for(what: str, done: Callable[[], bool], proc: subprocess.Popen[bytes],
              log: Path) -> None:
    deadline = time.monotonic() + 120
    while not done():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{what}: " + log.read_text()[-3000:]
        time.sleep(0.05)


def _in_flight(url: str, run_id: str) -> int:
    """Grains dispatched and not yet decided, by the store's facts."""
    with open_store(url) as store:
        flying: set[tuple[Any, Any]] = set()
        for stored in store.read(run_id, 0):
            fact = stored.fact
            if isinstance(fact, GrainDispatched):
                flying.add((fact.call, fact.path))
            elif isinstance(fact, GrainCommitted | GrainRetried | GrainFailed):
                flying.discard((fact.call, fact.path))
        return len(flying)


@pytest.mark.long
@pytest.mark.timeout(240)
def test_commits_the_store_lost_after_acknowledging_them_are_run_again_not_built_on(
    ray_local: None, redis_aof_server: RedisServer, tmp_path: Path,
) -> None:
    """`rayorch driver` on Redis, stopped while batches are in flight; they commit (the
    store acknowledges), then the server loses those commits: an OS crash under
    ``appendfsync everysec`` (the AOF cut back to where the driver stopped) and a restart.
    The driver keeps its lease and never sees the outage; it wakes up and folds the
    commits from its batches' answers. The store refuses facts built on them, the shard
    is rebuilt from the store, the lost Grains run again, the parts already written are
    adopted: every source is written once and recorded once, and the audit is clean."""
    import ray

    url = redis_aof_server.url
    items = [f"item{i}" for i in range(14)]
    out = tmp_path / "out"
    run_id = create_run(PacedPipeline, [items], store=url, kwargs={"slow_s": 0.0, "each_s": 0.3},
                        out_dir=str(out), shards=1, micro_batch=2, max_active_sources=4)
    log = tmp_path / "driver.log"
    address = ray.get_runtime_context().gcs_address
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rayorch.cli", "driver", run_id, "--store", url, "--address",
             address, "--driver-id", "keeper", "--lease-ttl", "60"],
            env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO, stdout=sink,
            stderr=subprocess.STDOUT)
    try:
        _wait_for("fewer than 4 delivered", lambda: delivered_count(out) >= 4, proc, log)
        while True:  # stop it with batches in flight (their dispatches are in the store)
            proc.send_signal(signal.SIGSTOP)
            cut = _aof_tail(redis_aof_server).stat().st_size  # what the crash will keep
            if _in_flight(url, run_id):
                break
            proc.send_signal(signal.SIGCONT)
            time.sleep(0.05)
        _wait_for("batches still running", lambda: not _in_flight(url, run_id), proc, log)
        redis_aof_server.kill()  # their commits were acknowledged: now they are lost
        with open(_aof_tail(redis_aof_server), "r+b") as aof:
            aof.truncate(cut)
        redis_aof_server.start()
        assert _in_flight(url, run_id)
        proc.send_signal(signal.SIGCONT)
        assert proc.wait(180) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
    records = list(read_outputs(out))
    assert sorted(r["index"] for r in records) == list(range(len(items)))  # each once
    assert all(r["value"] == f"done:{items[r['index']]}" for r in records)
    with open_store(url) as store:
        emitted = Counter(s.fact.index for s in store.read(run_id, 0)
                          if isinstance(s.fact, OutputEmitted))
        assert emitted == Counter(range(len(items)))
        report = audit_run(store, run_id)
    assert report.ok, report.violations
    text = log.read_text()
    # The store refused an append built on what it lost: which check saw it first (the
    # accepted commit gone, or the driver's latest append gone) depends on whether the driver
    # appended between its stop and the crash's cut.
    assert re.search(r"the lineage store went back on shard 0: (it no longer holds the "
                     r"accepted commit|the driver's latest append, from seq \d+, is gone)",
                     text), text[-3000:]


def _cut_before_fact(server: RedisServer, seq: int) -> None:
    """Crash the server and cut its AOF back to just before the write of fact ``seq`` (the
    transaction of the script that appended it): what an OS crash under ``appendfsync
    everysec`` loses."""
    server.kill()
    path = _aof_tail(server)
    aof = path.read_bytes()
    at = aof.find(b"\r\n%d-0\r\n" % seq)  # the XADD of the fact (its stream entry id)
    assert at > 0, f"fact {seq} is not in {path}"
    cut = aof.rfind(b"*1\r\n$5\r\nMULTI\r\n", 0, at)
    assert cut > 0
    with open(path, "r+b") as f:
        f.truncate(cut)
    server.start()


def test_an_append_after_the_store_lost_only_the_drivers_latest_append_is_refused(
    redis_aof_server: RedisServer,
) -> None:
    """Redis loses the driver's latest append and nothing else (the AOF cut back to just
    before it, a restart; the lease survives): the driver's next append, built on what it
    appended, is refused with nothing written; rebuilt from what the store holds, it
    appends again. Only the latest-append check of ``append-fenced-5.lua`` sees this loss:
    the store still holds every fact the driver read and the driver folded no commit since
    (issue 32)."""
    store = open_store(redis_aof_server.url + "?retries=20")
    try:
        store.open_run(RUN, scripted_plan())
        epoch = store.acquire_lease(RUN, 0, "driver-a", ttl_s=600)
        read_seq = store.read(RUN, 0)[-1].seq  # the rebuild
        first = store.append(RUN, 0, epoch, [SourceAdmitted(0, ("a",))], driver="driver-a",
                             basis=AppendBasis(read_seq))
        latest = store.append(RUN, 0, epoch, [SourceAdmitted(1, ("b",)),
                                              GrainDispatched("render", (0,), 0)],
                              driver="driver-a", basis=AppendBasis(read_seq, first[0]))
        _cut_before_fact(redis_aof_server, latest[0])  # only the latest append is lost
        before = store.read(RUN, 0)
        assert [s.seq for s in before][-1] == first[-1] and admitted(store) == [
            SourceAdmitted(0, ("a",))]
        with pytest.raises(StoreRolledBackError) as err:
            store.append(RUN, 0, epoch, [GrainDispatched("render", (1,), 0)],
                         driver="driver-a", basis=AppendBasis(read_seq, latest[0]))
        assert err.value.detail == (f"the driver's latest append, from seq {latest[0]}, is "
                                    f"gone (the store's latest starts at seq {first[0]})")
        assert store.read(RUN, 0) == before  # nothing written
        assert store.grain_phase(RUN, 0, "render", (1,)) is None
        rebuilt = AppendBasis(before[-1].seq)
        store.append(RUN, 0, epoch, [SourceAdmitted(1, ("b",))], driver="driver-a",
                     basis=rebuilt)
        assert admitted(store) == [SourceAdmitted(0, ("a",)), SourceAdmitted(1, ("b",))]
    finally:
        store.close()


@pytest.mark.long
@pytest.mark.timeout(240)
def test_audit_names_a_rollback_as_the_cause_and_a_resume_repairs_it(
    ray_local: None, redis_aof_server: RedisServer, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run completes; then Redis loses its last acknowledged facts (the AOF cut back, a
    restart). `rayorch audit` names the cause: parts written after the store had
    acknowledged more facts than it holds now. `rayorch resume` records the lost deliveries
    from those parts (each source once) and the audit is clean again."""
    url = redis_aof_server.url
    items = [f"item{i}" for i in range(10)]
    out = tmp_path / "out"
    run_id = create_run(PacedPipeline, [items], store=url, kwargs={"slow_s": 0.0, "each_s": 0.0},
                        out_dir=str(out), shards=1, micro_batch=2, max_active_sources=2)
    assert cli_main(["resume", run_id, "--store", url, "--lease-ttl", "10"]) == 0
    with open_store(url) as store:
        emits = [s.seq for s in store.read(run_id, 0) if isinstance(s.fact, OutputEmitted)]
    assert len(emits) == len(items)
    # The last 4 deliveries are forgotten, and so is at least one fact the last part's writer
    # saw acknowledged (its name's q): what tells a rollback from a driver that died before
    # recording (one part may hold several deliveries: the writer batches what is ready).
    acked = max(p.acked for p in map(PartName.parse, (f.name for f in out.iterdir())) if p)
    _cut_before_fact(redis_aof_server, min(emits[-4], acked))
    capsys.readouterr()
    assert cli_main(["audit", run_id, "--store", url]) == 1
    said = capsys.readouterr().out
    assert "the store lost facts it had acknowledged (rolled back" in said, said
    assert "died while deposed" not in said, said
    assert cli_main(["resume", run_id, "--store", url, "--lease-ttl", "10"]) == 0
    records = list(read_outputs(out))
    assert sorted(r["index"] for r in records) == list(range(len(items)))  # each once
    capsys.readouterr()
    assert cli_main(["audit", run_id, "--store", url]) == 0, capsys.readouterr().out
