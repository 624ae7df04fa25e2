"""Server-time heartbeats, one-line TLS/AUTH errors, retention (delete, gc) and the runs listing.

Measured before (issue 12): a driver 2 h ahead evicted every other driver from the
registry; a TLS certificate failure read "check that redis-server is running"; nothing
was ever deleted; ``rayorch runs`` showed no time, status or counts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis

from rayorch.cli import main as cli_main
from rayorch.core.facts import (
    GrainCommitted,
    GrainDispatched,
    OutputEmitted,
    RunCompleted,
    SourceAdmitted,
)
from rayorch.store import open_store
from rayorch.store.base import LineageStore
from rayorch.store.errors import StoreAuthError, StoreTLSError
from rayorch.testing import EchoPipeline, RedisServer, free_port, redis_server_path

pytestmark = [pytest.mark.integration]


# -- heartbeats in server time -------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_a_driver_two_hours_ahead_evicts_nobody(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(redis_url)
    store.open_run("hb", EchoPipeline().compile())
    store.heartbeat("hb", "steady", 30)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 7200)  # this process's clock: +2 h
    fast = open_store(redis_url)
    fast.heartbeat("hb", "fast", 30)
    assert fast.live_drivers("hb") == ["fast", "steady"]
    monkeypatch.undo()
    assert store.live_drivers("hb") == ["fast", "steady"]
    store.heartbeat("hb", "brief", 0.3)
    time.sleep(0.5)
    assert store.live_drivers("hb") == ["fast", "steady"]  # expiry still works
    store.heartbeat("hb", "fast", 0)
    assert store.live_drivers("hb") == ["steady"]


# -- one-line errors -------------------------------------------------------------------------------
def _tls_server(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    if shutil.which("openssl") is None or redis_server_path() is None:
        pytest.skip("needs openssl and redis-server")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"],
                   check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen(
        [str(redis_server_path()), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file",
         str(cert), "--tls-auth-clients", "no", "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            redis.Redis(port=port, ssl=True, ssl_cert_reqs="none").ping()
            return proc, port
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    pytest.skip("this redis-server has no TLS support")


@pytest.mark.timeout(60)
def test_tls_certificate_failure_has_its_own_one_line_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc, port = _tls_server(tmp_path)
    try:
        url = f"rediss://127.0.0.1:{port}/0"
        started = time.monotonic()
        with pytest.raises(StoreTLSError, match="certificate verify failed"):
            open_store(url).list_runs()
        assert time.monotonic() - started < 5, "a refused certificate is not retried"
        assert cli_main(["runs", "--store", url]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "TLS" in err and "ssl_ca_certs" in err
        assert "redis-server is running" not in err
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.timeout(60)
def test_auth_failures_have_their_own_one_line_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = RedisServer(tmp_path, password="s3cret")
    server.start()
    try:
        for url in (f"redis://127.0.0.1:{server.port}/0",
                    f"redis://:wrong@127.0.0.1:{server.port}/0"):
            with pytest.raises(StoreAuthError, match="refused the login"):
                open_store(url).list_runs()
            assert cli_main(["runs", "--store", url]) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and "USER:PASSWORD" in err, err
            assert "redis-server is running" not in err and "wrong" not in err
        assert open_store(server.url).list_runs() == []
    finally:
        server.stop()


# -- retention and the runs listing ------------------------------------------------------------
def _write_run(store: LineageStore, run_id: str, *, complete: bool, sources: int = 2,
               failed: int = 0, big: bool = False) -> None:
    store.open_run(run_id, EchoPipeline().compile(), config={"sources": sources})
    epoch = store.acquire_lease(run_id, 0, "d", 30)
    for i in range(sources if complete else 1):
        store.append(run_id, 0, epoch, driver="d", facts=[SourceAdmitted(i, (f"s{i}",)),
                                        GrainDispatched("echo", (i,), 0)])
        value = ("v" * 300 if big else f"s{i}",)
        if i < failed:
            store.commit(run_id, [GrainCommitted("echo", (i,), 0, "record_failure", None, "x")])
        else:
            store.commit(run_id, [GrainCommitted("echo", (i,), 0, "present", value)])
        outcome = "failed" if i < failed else "present"
        store.append(run_id, 0, epoch, driver="d", facts=[OutputEmitted(i, outcome)])
    if complete:
        store.append(run_id, 0, epoch, driver="d", facts=[RunCompleted(sources)])
    store.release_lease(run_id, 0, "d", epoch)


def _keys_of(url: str, run_id: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    return [k for k in client.scan_iter(f"ro:{{{run_id}*") if run_id.encode() in k]


def _payload_store(redis_url: str, tmp_path: Path, *runs: tuple[str, bool]
                   ) -> tuple[str, LineageStore, Path]:
    """A Redis store with payload files for every output, holding ``runs`` (id, complete)."""
    root = tmp_path / "payloads"
    url = f"{redis_url}?payload_dir={root}&payload_threshold=64"
    store = open_store(url)
    for run_id, complete in runs:
        _write_run(store, run_id, complete=complete, big=True)
    return url, store, root


@pytest.mark.timeout(60)
def test_delete_removes_keys_and_payload_files(
        redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, store, root = _payload_store(redis_url, tmp_path, ("gone", True), ("stays", True))
    assert len(list((root / "gone").rglob("*.seg"))) == 2 and _keys_of(redis_url, "gone")
    assert cli_main(["delete", "gone", "--store", url]) == 0
    assert "deleted" in capsys.readouterr().out
    assert not _keys_of(redis_url, "gone") and not (root / "gone").exists()  # no empty folder
    assert [i.run_id for i in store.list_runs()] == ["stays"]
    assert len(list((root / "stays").rglob("*.seg"))) == 2
    assert cli_main(["delete", "gone", "--store", url]) == 2  # not found: one line
    assert "not found" in capsys.readouterr().err
    store.heartbeat("stays", "alive", 30)
    assert cli_main(["delete", "stays", "--store", url]) == 2
    assert "--force" in capsys.readouterr().err
    assert cli_main(["delete", "stays", "--store", url, "--force"]) == 0


@pytest.mark.timeout(60)
def test_gc_removes_orphaned_payloads_and_old_runs(
        redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, store, root = _payload_store(redis_url, tmp_path, ("old", True), ("live", False))
    store.heartbeat("live", "driver-1", 60)
    kept = sorted((root / "live").rglob("*.seg"))
    orphan = root / "live" / "echo" / "9.g0.dead.msgpack"
    fresh = root / "live" / "echo" / "8.g0.inflight.msgpack"
    for path in (orphan, fresh):
        path.write_bytes(b"\x91\x01")
    hour_ago = time.time() - 7200
    os.utime(orphan, (hour_ago, hour_ago))
    # A root shared by several stores: a folder this store wrote whose run's keys are gone
    # is listed; another store's folder (or one no store marked) is not.
    from rayorch.store.payload import OWNER_FILE, store_identity

    for name, owner in (("lost-here", store_identity(url)), ("not-a-run-here", None),
                        ("other-store", "redis://10.0.0.9:6379/0")):
        (root / name).mkdir()
        (root / name / "x.msgpack").write_bytes(b"\x91\x01")
        if owner is not None:
            (root / name / OWNER_FILE).write_text(owner)
    assert (root / "live" / OWNER_FILE).read_text() == store_identity(url)  # written by it

    assert cli_main(["gc", "--store", url, "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["orphaned_payloads"] == ["live/echo/9.g0.dead.msgpack"]
    assert plan["delete_runs"] == [] and plan["unknown_payload_dirs"] == ["lost-here"]
    assert orphan.exists()  # a dry run removes nothing

    time.sleep(1.1)
    assert cli_main(["gc", "--store", url, "--older-than", "1s"]) == 0
    out = capsys.readouterr().out
    assert "deleted 1 run and 1 orphaned payload file" in out
    assert "kept run live" in out
    assert not orphan.exists() and fresh.exists()  # too young: maybe a commit in flight
    assert sorted((root / "live").rglob("*.seg")) == kept and kept
    assert not (root / "old").exists()  # no empty folders left behind
    assert [i.run_id for i in store.list_runs()] == ["live"]
    assert (root / "not-a-run-here" / "x.msgpack").exists()  # maybe another store's
    assert cli_main(["gc", "--store", url, "--older-than", "soon"]) == 2
    assert "not a duration" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["memory", "redis"])
@pytest.mark.timeout(60)
def test_runs_lists_created_time_age_status_and_counts(
        kind: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]) -> None:
    url = (f"memory://runs-{time.monotonic_ns()}" if kind == "memory"
           else request.getfixturevalue("redis_url"))
    store = open_store(url)
    _write_run(store, "done", complete=True, sources=3, failed=1)
    _write_run(store, "running", complete=False, sources=3)
    store.heartbeat("running", "d1", 60)
    _write_run(store, "abandoned", complete=False, sources=3)
    assert cli_main(["runs", "--store", url, "--json"]) == 0
    rows = {r["run"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["done"]["status"] == "complete" and rows["done"]["sources_done"] == 3
    assert rows["done"]["sources_total"] == 3 and rows["done"]["failures"] == 1
    assert rows["running"]["status"] == "running" and rows["running"]["sources_done"] == 1
    assert rows["abandoned"]["status"] == "abandoned" and rows["abandoned"]["failures"] == 0
    for row in rows.values():
        assert 0 <= row["age_s"] < 60 and abs(row["created_ts"] - time.time()) < 60
    assert cli_main(["runs", "--store", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["RUN", "CREATED", "AGE", "STATUS", "SOURCES", "FAILURES", "PLAN"]
    done = next(line for line in lines if line.startswith("done "))
    assert "complete" in done and "3/3" in done and done.split()[-2] == "1"
