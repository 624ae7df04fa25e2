"""Exactly-once delivery through the public API: a ``Pipeline.run`` caller killed, stopped,
woken, resumed (docs/ARCHITECTURE.md, "Delivery").

The caller is a real process (``python -m bench.caller_run``) running ``Pipeline.run`` on a
private redis-server and the session's local Ray; faults are real signals; the resume is
the real CLI. Every test counts what the caller printed plus what the resume wrote.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rayorch.cli import main as cli_main
from rayorch.core.facts import GrainCommitted, OutputEmitted
from rayorch.inspect.audit import audit_run
from rayorch.runtime.sinks import read_outputs
from rayorch.store.registry import open_store

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
ITEMS = 20


class Caller:
    """``bench.caller_run`` in a subprocess; ``received`` are the indexes it printed."""

    def __init__(self, redis_url: str, run_id: str, *args: str) -> None:
        import ray

        address = ray.get_runtime_context().gcs_address
        cmd = [sys.executable, "-m", "bench.caller_run", "--store", redis_url, "--run-id",
               run_id, "--address", address, "--items", str(ITEMS), *args]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.received: list[int] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def drain(self) -> list[int]:
        while True:
            try:
                self.received.append(int(self.lines.get_nowait()))
            except queue.Empty:
                return self.received

    def wait_received(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.drain()) < count:
            assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
            assert time.monotonic() < deadline, f"caller received only {self.received}"
            time.sleep(0.05)

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def ended(self, timeout: float = 60) -> str:
        """Wait for the process to exit and read all it printed; its stderr."""
        self.proc.wait(timeout)
        self._reader.join(timeout)
        self.drain()
        return self.stderr()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        time.sleep(0.2)
        self.drain()


def committed(redis_url: str, run_id: str) -> int:
    store = open_store(redis_url)
    try:
        return sum(1 for facts in store.read_run(run_id).values() for s in facts
                   if isinstance(s.fact, GrainCommitted))
    except Exception:  # the run is not created yet
        return 0
    finally:
        store.close()


def commit_seq(redis_url: str, run_id: str, index: int) -> int:
    """The seq of the commit of source ``index``'s Grain (the pipeline has one Call)."""
    store = open_store(redis_url)
    try:
        return next(s.seq for facts in store.read_run(run_id).values() for s in facts
                    if isinstance(s.fact, GrainCommitted) and s.fact.path[0] == index)
    finally:
        store.close()


def wait_committed(caller: Caller, redis_url: str, run_id: str, count: int,
                   timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while committed(redis_url, run_id) < count:
        if caller.proc.poll() is not None or time.monotonic() > deadline:
            caller.proc.kill()
            _, err = caller.proc.communicate(timeout=10)
            raise AssertionError(f"the caller's run did not progress: {err[-2000:]}")
        time.sleep(0.1)


def resume(redis_url: str, run_id: str, out: Path) -> dict[int, dict[str, object]]:
    assert cli_main(["resume", run_id, "--store", redis_url, "--out-dir", str(out),
                     "--lease-ttl", "2", "--quiet"]) == 0
    return {record["index"]: record for record in read_outputs(out)}


def finished_exactly_once(caller: Caller, redis_url: str, run_id: str) -> None:
    """The caller process ended normally (its last items drained) and every source was
    delivered exactly once, none a second time."""
    time.sleep(0.2)
    caller.drain()
    assert caller.proc.stderr is not None
    assert caller.proc.returncode == 0, caller.proc.stderr.read()
    check_exactly_once(redis_url, run_id, caller.received, {}, redelivered=0)


def check_exactly_once(redis_url: str, run_id: str, caller: list[int],
                       written: dict[int, dict[str, object]], *, redelivered: int) -> None:
    counts = Counter(caller) + Counter(written.keys())
    assert sorted(counts) == list(range(ITEMS)), f"lost: {set(range(ITEMS)) - set(counts)}"
    twice = [i for i, n in counts.items() if n > 1]
    assert all(counts[i] == 2 for i in twice) and len(twice) <= redelivered, counts
    for index, record in written.items():
        assert record["value"] == f"done:{'slow' if index == 0 else 'item'}{index}"
    store = open_store(redis_url)
    try:
        emitted = Counter(s.fact.index for facts in store.read_run(run_id).values()
                          for s in facts if isinstance(s.fact, OutputEmitted))
        assert sorted(emitted) == list(range(ITEMS)) and set(emitted.values()) == {1}
        report = audit_run(store, run_id)
        assert report.ok, report.violations
    finally:
        store.close()


@pytest.mark.long
@pytest.mark.timeout(180)
def test_ordered_caller_killed_while_source_0_is_slow_loses_nothing(
    ray_local: None, redis_url: str, tmp_path: Path
) -> None:
    """Sources 1-19 finish while 0 is slow; the ordered caller received nothing; SIGKILL;
    ``rayorch resume --out-dir`` writes all 20 (buffered for order is not delivered)."""
    run_id = f"ordered-{uuid.uuid4().hex[:6]}"
    caller = Caller(redis_url, run_id, "--slow-first", "--slow-s", "6")
    wait_committed(caller, redis_url, run_id, ITEMS - 2)  # item 1 may queue behind item 0
    caller.kill()
    assert caller.received == []
    written = resume(redis_url, run_id, tmp_path / "out")
    check_exactly_once(redis_url, run_id, caller.received, written, redelivered=0)


@pytest.mark.timeout(180)
def test_unordered_caller_killed_mid_loop_gets_the_rest_from_resume(
    ray_local: None, redis_url: str, tmp_path: Path
) -> None:
    """An unordered caller is killed after receiving some outputs: the resume delivers
    the rest; at most the one item the caller held is delivered twice."""
    run_id = f"unordered-{uuid.uuid4().hex[:6]}"
    caller = Caller(redis_url, run_id, "--unordered", "--each-s", "0.25")
    caller.wait_received(6)
    caller.kill()
    written = resume(redis_url, run_id, tmp_path / "out")
    check_exactly_once(redis_url, run_id, caller.received, written, redelivered=1)


@pytest.mark.timeout(180)
def test_resume_of_a_caller_run_without_out_dir_refuses(
    ray_local: None, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = f"nosink-{uuid.uuid4().hex[:6]}"
    caller = Caller(redis_url, run_id, "--unordered", "--each-s", "0.25")
    caller.wait_received(2)
    caller.kill()
    code = cli_main(["resume", run_id, "--store", redis_url, "--lease-ttl", "2", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert "--out-dir" in err and len(err.splitlines()) == 1, err
    store = open_store(redis_url)
    try:  # nothing was marked delivered by the refused resume
        emitted = {s.fact.index for facts in store.read_run(run_id).values()
                   for s in facts if isinstance(s.fact, OutputEmitted)}
        assert emitted <= set(caller.received)
    finally:
        store.close()


@pytest.mark.timeout(180)
def test_deposed_caller_driver_wakes_up_and_hands_nothing_over(
    ray_local: None, redis_url: str, redis_server: Any, tmp_path: Path
) -> None:
    """The ordered caller's driver is SIGSTOPped just after the acknowledgement of item 0
    lands (a proxy holds its reply until the stop), with items 1-19 finished and due to be
    handed over in that same turn; past its lease TTL a resume takes the shard over and runs
    the run to the end; SIGCONT: the woken driver hands nothing more to its caller (its
    lease is checked before each hand-over, issue 32) and stops with 'lease lost'."""
    from rayorch.testing import ReplyDroppingProxy

    run_id = f"deposed-{uuid.uuid4().hex[:6]}"
    with ReplyDroppingProxy(redis_server.port) as proxy:
        # The msgpack string "caller" (a Lua script's text has the bare word): the sink of
        # a caller's OutputEmitted, here item 0's, the first.
        proxy.hold_next_reply(b"\xa6caller")
        caller = Caller(f"redis://127.0.0.1:{proxy.port}/0", run_id, "--slow-first",
                        "--slow-s", "4", "--depth", "1")
        if not proxy.reply_held.wait(90):
            caller.proc.kill()
            raise AssertionError(f"item 0 was never acknowledged: {caller.stderr()[-2000:]}")
        caller.proc.send_signal(signal.SIGSTOP)
        proxy.release_reply()  # it waits in the stopped process's socket
        try:  # the resume takes the shard over once the stopped caller's lease lapses
            written = resume(redis_url, run_id, tmp_path / "out")
        finally:
            caller.proc.send_signal(signal.SIGCONT)
        err = caller.ended()
    assert commit_seq(redis_url, run_id, 1) < commit_seq(redis_url, run_id, 0), \
        "item 1 was not waiting when item 0 was handed over: the scenario did not happen"
    assert caller.received == [0], f"the deposed driver handed {caller.received[1:]} over " \
        "after its shard was taken over"
    assert caller.proc.returncode == 3 and "lease lost" in err, err
    check_exactly_once(redis_url, run_id, caller.received, written, redelivered=0)


@pytest.mark.long
@pytest.mark.timeout(180)
def test_caller_rides_out_a_redis_restart_longer_than_its_quick_retries(
    ray_local: None, redis_aof_server: Any
) -> None:
    """Redis (AOF) is down for 3 s while an unordered caller iterates: the caller's driver
    backs off and re-takes its leases, and the caller gets every source exactly once.

    Found by the fault soak (bench/faults.py): the Pipeline.run driver re-raised the
    outage from its first re-take attempt and the caller stopped with "cannot reach the
    lineage store" (docs/topics/FAILOVER.md, "Driver replicas and failover": store outages)."""
    url = redis_aof_server.url
    run_id = f"outage-{uuid.uuid4().hex[:6]}"
    caller = Caller(url, run_id, "--unordered", "--each-s", "0.25")
    caller.wait_received(3)
    redis_aof_server.kill()
    time.sleep(3.0)
    redis_aof_server.start()
    caller.proc.wait(120)
    finished_exactly_once(caller, url, run_id)


@pytest.mark.long
@pytest.mark.timeout(180)
def test_an_acknowledgement_lost_in_an_outage_is_recorded_not_delivered_again(
    ray_local: None, redis_url: str, redis_server: Any
) -> None:
    """The caller asks for the next item; the ``OutputEmitted`` of the one it had never
    reaches Redis and the store is unreachable for 3 s. The driver rebuilds its shard
    from the store (which shows that source finished, not emitted): it must write the
    fact, not hand the caller the same output a second time."""
    from rayorch.testing import ReplyDroppingProxy

    run_id = f"ackloss-{uuid.uuid4().hex[:6]}"
    with ReplyDroppingProxy(redis_server.port) as proxy:
        caller = Caller(f"redis://127.0.0.1:{proxy.port}/0", run_id, "--unordered",
                        "--each-s", "0.25")
        caller.wait_received(3)
        proxy.drop_next_request(b"caller", refuse_s=3.0)  # the sink of a caller's fact
        caller.proc.wait(120)
        assert proxy.swallowed == 1
    finished_exactly_once(caller, redis_url, run_id)


@pytest.mark.timeout(180)
def test_caller_rides_out_an_outage_while_it_takes_its_leases(
    ray_local: None, redis_url: str, redis_server: Any
) -> None:
    """The store becomes unreachable (3 s) just as the caller's driver takes its first
    lease: it backs off and takes it then, instead of stopping the caller."""
    from rayorch.store.scripts import ACQUIRE_LEASE
    from rayorch.testing import ReplyDroppingProxy

    run_id = f"takeall-{uuid.uuid4().hex[:6]}"
    with ReplyDroppingProxy(redis_server.port) as proxy:
        proxy.drop_next_request(ACQUIRE_LEASE.sha.encode(), refuse_s=3.0)
        caller = Caller(f"redis://127.0.0.1:{proxy.port}/0", run_id, "--unordered")
        caller.proc.wait(120)
        assert proxy.swallowed == 1
    finished_exactly_once(caller, redis_url, run_id)


@pytest.mark.timeout(180)
def test_caller_stopped_before_its_first_lease_wakes_deposed(
    ray_local: None, redis_url: str, tmp_path: Path
) -> None:
    """The caller is SIGSTOPped after it created its run but before it took a lease; a
    resume runs the whole run; SIGCONT: the woken caller must stop with 'lease lost', not
    take the free lease and end its iterator normally with nothing (found by the soak)."""
    from rayorch.core.facts import LeaseAcquired
    from rayorch.store.errors import RunNotFoundError

    run_id = f"prestart-{uuid.uuid4().hex[:6]}"
    caller = Caller(redis_url, run_id, "--unordered", "--slow-first", "--slow-s", "0.5")
    store = open_store(redis_url)
    try:
        deadline = time.monotonic() + 60
        while True:  # the manifest is saved right after the run is opened
            with contextlib.suppress(RunNotFoundError):
                if store.load_manifest(run_id) is not None:
                    break
            assert time.monotonic() < deadline and caller.proc.poll() is None
            time.sleep(0.01)
        caller.proc.send_signal(signal.SIGSTOP)
        leases = [s.fact for facts in store.read_run(run_id).values() for s in facts
                  if isinstance(s.fact, LeaseAcquired)]
    finally:
        store.close()
    try:
        assert leases == [], "the caller took its lease before the stop (pools were ready)"
        written = resume(redis_url, run_id, tmp_path / "out")
    finally:
        caller.proc.send_signal(signal.SIGCONT)
    caller.proc.wait(60)
    time.sleep(0.2)
    assert caller.proc.stderr is not None
    err = caller.proc.stderr.read()
    assert caller.drain() == []
    assert caller.proc.returncode == 3 and "lease lost" in err, err
    check_exactly_once(redis_url, run_id, caller.received, written, redelivered=0)
