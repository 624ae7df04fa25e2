"""Finished lineage archived to object storage (``archive=`` / ``--archive``), on a real
redis-server and real Ray: the facts leave Redis, and every reader (audit, show, status, the
timeline, the web view, ``read_outputs``, ``--reuse``, ``resume``, ``rayorch driver``) reads
archive and stream as one source. Each case ends with every output once and audit OK
(docs/topics/ARCHIVE.md, "Archived lineage"). The object-store cases (an S3 archive, one
unreachable for 10 s) are tests/storage/test_s3_archive.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import ray
import redis

import rayorch as ro
from bench.faults import PacedPipeline
from rayorch.cli import EXIT_OK, main
from rayorch.core.facts import LeaseAcquired, OutputEmitted
from rayorch.inspect.audit import audit_run
from rayorch.replicas import create_run
from rayorch.runtime.sinks import delivered_count, read_outputs
from rayorch.store.archive import encode_segment, segment_key
from rayorch.store.records.facts import encode_fact
from rayorch.store.registry import open_store
from rayorch.store.scripted_run import write_scripted_run
from rayorch.testing import RedisServer

pytestmark = pytest.mark.integration
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
REPO = Path(__file__).resolve().parents[2]


def live_facts(url: str) -> int:
    """Entries left in every fact stream of the server (redis-py, not rayorch)."""
    client = redis.Redis.from_url(url.partition("?")[0])
    return sum(client.xlen(key) for key in client.scan_iter("ro:*:facts:*"))


def segments(archive: Path, run_id: str) -> list[Path]:
    return sorted((archive / run_id).rglob("*.facts"))


def emitted(url: str, run_id: str) -> Counter[int]:
    with open_store(url) as store:
        return Counter(s.fact.index for k in range(store.run_info(run_id).shards)
                       for s in store.read(run_id, k) if isinstance(s.fact, OutputEmitted))


def check_once(out: Path, items: list[str]) -> None:
    records = list(read_outputs(out))
    assert sorted(r["index"] for r in records) == list(range(len(items)))  # each once
    assert all(r["value"] == f"done:{items[r['index']]}" for r in records)


def test_a_scripted_run_reads_the_same_from_the_archive_and_a_crash_before_the_trim_changes_nothing(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """A run archived every 5 facts reads back fact for fact as it was written; the facts a
    crash left both in a segment and in Redis (written, not trimmed) are read once; a reader
    that was not told the archive finds it; the audit says where the facts live."""
    archive = tmp_path / "archive"
    url = f"{redis_server.url}?archive={archive}&archive_every=5"
    plain = open_store(redis_server.url)
    write_scripted_run(plain, "plain", shards=2)
    expected = {k: [(s.seq, s.domain, s.fact.tag) for s in facts]
                for k, facts in plain.read_run("plain").items()}
    store = open_store(url)
    write_scripted_run(store, "arch", shards=2)
    assert store.wait_archived()
    assert segments(archive, "arch")  # archived mid-way, every 5 facts
    assert store.read_run("arch") == open_store(redis_server.url).read_run("arch")
    got = {k: [(s.seq, s.domain, s.fact.tag) for s in v]
           for k, v in open_store(redis_server.url).read_run("arch").items()}
    assert got == expected
    # the crash: a shard's first facts written to a segment, the process dies before the
    # trim (archive_shard writes the segment first); the rest are only in Redis
    crash = open_store(f"{redis_server.url}?archive={archive}&archive_every=100000")
    write_scripted_run(crash, "crash", shards=2)
    assert live_facts(redis_server.url) > 0
    with open_store(redis_server.url) as reader:
        before = reader.read_run("crash")
    for shard, facts in before.items():
        head = facts[:-3]
        (archive / segment_key("crash", shard, head[0].seq, head[-1].seq)).parent.mkdir(
            parents=True, exist_ok=True)
        (archive / segment_key("crash", shard, head[0].seq, head[-1].seq)).write_bytes(
            encode_segment("crash", shard, [(s.seq, s.domain, encode_fact(s.fact))
                                            for s in head]))
    with open_store(redis_server.url) as reader:
        assert reader.read_run("crash") == before  # each seq once, none lost
        assert audit_run(reader, "crash").ok
    streams_before = live_facts(redis_server.url)
    assert main(["archive", "crash", "--store", redis_server.url]) == EXIT_OK
    assert live_facts(redis_server.url) == streams_before - sum(map(len, before.values()))
    with open_store(redis_server.url) as reader:
        assert reader.read_run("crash") == before
        report = audit_run(reader, "crash")
    assert report.ok, report.violations
    count = {k: len(list((archive / "crash" / str(k)).glob("*.facts"))) for k in (0, 1)}
    assert report.places == [
        f"shard {k}: seq 1-{before[k][-1].seq} archived ({count[k]} segments in {archive}), "
        "0 live in the store" for k in (0, 1)]
    assert main(["delete", "crash", "--store", redis_server.url]) == EXIT_OK
    assert not segments(archive, "crash") and segments(archive, "arch")
    for opened in (store, crash, plain):
        opened.close()


@pytest.mark.long
@pytest.mark.timeout(300)
def test_a_run_archived_mid_way_killed_and_resumed_has_every_output_once_and_every_reader_reads_it(
        ray_local: None, redis_server: RedisServer, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`rayorch driver --archive` archives every 6 facts and is killed (SIGKILL) once some
    facts are archived and some outputs written; `rayorch resume --archive` finishes the run.
    Every output is written once, the audit is OK and says the facts are archived, Redis
    holds no fact, and show, status, the timeline, the web view and read_outputs read the
    archived run."""
    archive = tmp_path / "archive"
    url = f"{redis_server.url}?archive_every=6"
    items = [f"item{i}" for i in range(16)]
    out = tmp_path / "out"
    run_id = create_run(PacedPipeline, [items], store=url, kwargs={"slow_s": 0.0, "each_s": 0.3},
                        out_dir=str(out), shards=2, micro_batch=2, max_active_sources=4)
    log = tmp_path / "driver.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rayorch.cli", "driver", run_id, "--store", url, "--archive",
             str(archive), "--address", ray.get_runtime_context().gcs_address,
             "--lease-ttl", "3", "--quiet"],
            env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO, stdout=sink,
            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not (segments(archive, run_id) and delivered_count(out) >= 4):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert delivered_count(out) < len(items), "killed mid-way"
    assert main(["resume", run_id, "--store", url, "--archive", str(archive),
                 "--lease-ttl", "3", "--quiet"]) == EXIT_OK
    check_once(out, items)
    assert emitted(url, run_id) == Counter(range(len(items)))
    assert live_facts(url) == 0  # every shard is done and archived
    capsys.readouterr()
    assert main(["audit", run_id, "--store", redis_server.url]) == EXIT_OK
    said = capsys.readouterr().out
    assert "OK" in said and "shard 0: seq 1-" in said and "archived (" in said, said
    assert "0 live in the store" in said, said
    assert main(["show", run_id, "3", "--store", redis_server.url]) == EXIT_OK
    assert "work[3]" in capsys.readouterr().out
    assert main(["status", run_id, "--store", redis_server.url]) == EXIT_OK
    status = capsys.readouterr().out
    assert "call work" in status and "complete" in status, status
    png = tmp_path / "run.png"
    assert main(["timeline", run_id, "--store", redis_server.url, "-o", str(png)]) == EXIT_OK
    assert png.stat().st_size > 0
    check_web_view(redis_server.url, run_id)


def check_web_view(url: str, run_id: str) -> None:
    """``rayorch ui``'s pages of an archived run: the run, a source's lineage, its audit."""
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from rayorch.ui.app import build_app

    with open_store(url) as store:
        client = TestClient(build_app(store))
        index = client.get("/")
        assert index.status_code == 200 and run_id in index.text
        run = client.get(f"/runs/{run_id}")
        assert run.status_code == 200, run.text
        source = client.get(f"/runs/{run_id}/sources/3")
        assert source.status_code == 200 and "work" in source.text, source.text[-2000:]
        assert "Traceback" not in run.text + source.text


# -- --reuse from an archived run ------------------------------------------------------------
class Pages:
    def __call__(self, docs: list[int]) -> list[list[str]]:
        return [[f"doc{d}-page{i}-" + "x" * 60 for i in range(d % 3 + 1)] for d in docs]


class Ocr:
    def __call__(self, pages: list[str]) -> list[str]:
        return [p[:12] for p in pages]


class Join:
    def __init__(self, sep: str = "|") -> None:
        self.sep = sep

    def __call__(self, texts: list[list[str]]) -> list[str]:
        return [self.sep.join(t) for t in texts]


class Docs(ro.Pipeline):
    def __init__(self, sep: str = "|") -> None:
        super().__init__()
        self.pages = ro.RayModule(Pages, num_cpus=0.25)
        self.ocr = ro.RayModule(Ocr, num_cpus=0.25, batch_size=4)
        self.join = ro.RayModule(Join, sep=sep, num_cpus=0.25)

    def forward(self, docs: Any) -> Any:
        return self.join(ro.F.reduce(self.ocr(ro.F.expand(self.pages(docs)))))


def expected(docs: list[int], sep: str = "|") -> list[str]:
    return [sep.join((f"doc{d}-page{i}-" + "x" * 60)[:12] for i in range(d % 3 + 1))
            for d in docs]


@pytest.mark.long
@pytest.mark.timeout(240)
def test_a_run_archived_after_it_finished_is_reused_by_the_next_run(
        ray_local: None, redis_server: RedisServer, tmp_path: Path) -> None:
    """A run made before archiving (no ``archive=``) is archived by `rayorch archive RUN
    --archive DIR`; a later run with ``reuse=`` takes its Grains from the archived facts and
    runs only the changed stage; both audits are OK."""
    archive = tmp_path / "archive"
    url = f"{redis_server.url}?payload_dir={tmp_path / 'payloads'}&payload_threshold=40&keep=all"
    docs = [1, 2, 5, 7]
    first = Docs().run(docs, store=url, quiet=True)
    assert first.collect() == expected(docs)
    assert main(["archive", first.run_id, "--store", url, "--archive", str(archive)]) == EXIT_OK
    assert live_facts(url) == 0 and segments(archive, first.run_id)
    second = Docs(sep="+").run(docs, store=url, quiet=True, reuse=first.run_id)
    assert second.collect() == expected(docs, sep="+")
    with open_store(url) as store:
        from rayorch.inspect.status import run_status

        calls = run_status(store, second.run_id).calls
        assert calls["pages"]["reused"] == len(docs) and calls["pages"]["dispatched"] == 0
        assert calls["ocr"]["dispatched"] == 0 and calls["join"]["dispatched"] == len(docs)
        for run in (first.run_id, second.run_id):
            report = audit_run(store, run)
            assert report.ok, report.violations


# -- a rollback after an archive ---------------------------------------------------------------
def _aof_tail(server: RedisServer) -> Path:
    return sorted((server.workdir / "appendonlydir").glob("*.incr.aof"))[-1]


def _cut_before_fact(server: RedisServer, seq: int) -> None:
    """Crash the server and cut its AOF back to just before the script that appended fact
    ``seq`` (as tests/integration/test_store_rollback.py does): an OS crash under
    ``appendfsync everysec``. Everything after is lost, the trims of the archive included."""
    server.kill()
    path = _aof_tail(server)
    aof = path.read_bytes()
    at = aof.find(b"\r\n%d-0\r\n" % seq)
    assert at > 0, f"fact {seq} is not in {path}"
    cut = aof.rfind(b"*1\r\n$5\r\nMULTI\r\n", 0, at)
    assert cut > 0
    with open(path, "r+b") as f:
        f.truncate(cut)
    server.start()


@pytest.mark.long
@pytest.mark.timeout(240)
def test_a_rollback_after_the_archive_loses_nothing_and_new_facts_follow_the_archive(
        ray_local: None, redis_aof_server: RedisServer, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A run completes and is archived; then Redis loses its last acknowledged writes (the
    AOF cut back before the last 4 deliveries: the archive's trims go too). The archive still
    holds every fact: the audit is OK, `rayorch resume` has nothing to redo, its lease fact
    follows the archived ones (no seq used twice), every output is there once."""
    archive = tmp_path / "archive"
    url = f"{redis_aof_server.url}?archive={archive}"
    items = [f"item{i}" for i in range(10)]
    out = tmp_path / "out"
    run_id = create_run(PacedPipeline, [items], store=url, kwargs={"slow_s": 0.0, "each_s": 0.0},
                        out_dir=str(out), shards=1, micro_batch=2, max_active_sources=2)
    assert main(["resume", run_id, "--store", url, "--lease-ttl", "10", "--quiet"]) == EXIT_OK
    assert live_facts(url) == 0
    with open_store(url) as store:
        facts = store.read(run_id, 0)
    emits = [s.seq for s in facts if isinstance(s.fact, OutputEmitted)]
    _cut_before_fact(redis_aof_server, emits[-4])
    assert 0 < live_facts(url) < len(facts)  # the trims are lost, and the last facts
    with open_store(url) as store:
        assert store.read(run_id, 0) == facts  # the archive holds what Redis lost
        report = audit_run(store, run_id)
    assert report.ok, report.violations
    capsys.readouterr()
    assert main(["resume", run_id, "--store", url, "--lease-ttl", "10", "--quiet"]) == EXIT_OK
    check_once(out, items)
    with open_store(url) as store:
        now = store.read(run_id, 0)
        assert now[:len(facts)] == facts
        seqs = [s.seq for s in now]
        assert seqs == sorted(set(seqs))
        leases = [s for s in now[len(facts):] if isinstance(s.fact, LeaseAcquired)]
        assert leases and leases[0].seq > facts[-1].seq  # after the archive, never inside
        assert Counter(s.fact.index for s in now if isinstance(s.fact, OutputEmitted)) \
            == Counter(range(len(items)))
        report = audit_run(store, run_id)
    assert report.ok, report.violations
    assert main(["audit", run_id, "--store", url]) == EXIT_OK


def test_a_trim_after_the_shard_changed_hands_is_refused_and_loses_nothing(
        redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trim is fenced: another driver takes the shard's lease between the archive's read
    of the facts and its trim (here, while the segment is written). The trim is refused with
    its cause, nothing leaves Redis, every seq reads once (segment and stream overlap), audit
    is OK; the new holder's own archive then trims them."""
    from rayorch.store.archive import FactArchive

    archive = tmp_path / "archive"
    url = f"{redis_server.url}?archive={archive}&archive_every=1000000"  # none in the background
    store = open_store(url)
    write_scripted_run(store, "fence", shards=1)
    with open_store(redis_server.url) as reader:
        before = reader.read_run("fence")
    live = live_facts(redis_server.url)
    write = FactArchive.write
    other = open_store(redis_server.url)

    def write_then_lose_the_lease(self: FactArchive, run_id: str, shard: int, facts: Any
                                  ) -> Any:
        segs = write(self, run_id, shard, facts)
        other.acquire_lease(run_id, shard, "driver-b", ttl_s=60)  # the shard changes hands
        return segs

    monkeypatch.setattr(FactArchive, "write", write_then_lose_the_lease)
    with pytest.raises(ro.RayorchError, match="not trimmed from Redis: its lease was taken"):
        store.archive_shard("fence", 0, done=True)
    assert segments(archive, "fence")  # the segment was written ...
    with open_store(redis_server.url) as reader:
        after = reader.read_run("fence")
        report = audit_run(reader, "fence")
    assert live_facts(redis_server.url) >= live  # ... and nothing was trimmed
    assert [s.seq for s in after[0]][:len(before[0])] == [s.seq for s in before[0]]
    assert len({s.seq for s in after[0]}) == len(after[0])  # each seq once
    assert report.ok, report.violations
    monkeypatch.setattr(FactArchive, "write", write)
    assert store.archive_shard("fence", 0, done=True) > 0  # the holder is stable now
    assert live_facts(redis_server.url) == 0
    with open_store(redis_server.url) as reader:
        assert reader.read_run("fence") == after
        assert audit_run(reader, "fence").ok
    for opened in (store, other):
        opened.close()
