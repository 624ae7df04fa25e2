"""Intermediate values are freed once their source is delivered (real Ray, real redis-server,
payload segments on disk): what is left is the delivered outputs; a resumed run after a
driver was killed, a reader of a finished run and a reuse of it still work, each output
once and the audit clean (docs/topics/PAYLOADS.md, "Freeing values").
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import ray
from test_failover import emitted_counts, kill_driver_once_delivered, outputs_match_reference

import rayorch as ro
from bench.faults import FaultPipeline, make_docs
from rayorch.cli import EXIT_OK, main
from rayorch.core.facts import GrainCommitted
from rayorch.inspect.audit import audit_run
from rayorch.inspect.status import run_status
from rayorch.replicas import create_run
from rayorch.store.registry import open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Scan:
    """A document's pages: large values (a page image stands in)."""

    def __call__(self, docs: list[int]) -> list[list[bytes]]:
        return [[bytes([65 + i]) * 3000 for i in range(d % 3 + 1)] for d in docs]


class Read:
    def __call__(self, pages: list[bytes]) -> list[str]:
        return [f"text of {p[:1].decode()} " * 20 for p in pages]


class Bind:
    def __init__(self, sep: str = "\n") -> None:
        self.sep = sep

    def __call__(self, texts: list[list[str]]) -> list[str]:
        return [self.sep.join(t) for t in texts]


class Book(ro.Pipeline):
    def __init__(self, sep: str = "\n") -> None:
        super().__init__()
        self.scan = ro.RayModule(Scan, num_cpus=0.25)
        self.read = ro.RayModule(Read, num_cpus=0.25, batch_size=4)
        self.bind = ro.RayModule(Bind, sep=sep, num_cpus=0.25)

    def forward(self, docs: Any) -> Any:
        return self.bind(ro.F.reduce(self.read(ro.F.expand(self.scan(docs)))))


def expected(docs: list[int], sep: str = "\n") -> list[str]:
    return [sep.join(f"text of {chr(65 + i)} " * 20 for i in range(d % 3 + 1)) for d in docs]


def objects(root: Path, run_id: str) -> dict[str, int]:
    """Payload bytes per Call folder of the run."""
    out: dict[str, int] = {}
    for path in (root / run_id).rglob("*.seg"):
        out[path.parent.name] = out.get(path.parent.name, 0) + path.stat().st_size
    return out


def test_values_are_freed_once_their_source_is_delivered_and_readers_still_work(
        ray_local: None, redis_url: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "payloads"
    url = f"{redis_url}?payload_dir={root}"
    docs = list(range(1, 9))
    first = Book().run(docs, store=url, quiet=True)
    assert first.collect() == expected(docs)
    left = objects(root, first.run_id)
    assert set(left) == {"bind"}  # scan's and read's segments are gone
    delivered = sum(len(v.encode()) for v in expected(docs))
    assert left["bind"] <= 1.2 * delivered
    with open_store(url) as store:
        report = audit_run(store, first.run_id)
        assert report.ok, report
        assert report.counts["payloads"]["freed"] >= len(docs)  # scan's and read's values
    assert main(["show", first.run_id, "2", "--store", url]) == EXIT_OK
    assert "scan[2]" in capsys.readouterr().out
    # a reuse of it: what was freed runs again, what was kept is reused; the same outputs
    second = Book().run(docs, store=url, quiet=True, reuse=first.run_id)
    assert second.collect() == expected(docs)
    with open_store(url) as store:
        calls = run_status(store, second.run_id).calls
        assert calls["scan"]["dispatched"] == len(docs) and calls["bind"]["reused"] == len(docs)
        assert audit_run(store, second.run_id).ok
    # one new input and one changed stage: the same outputs as a run from scratch
    third = Book(sep=" | ").run([*docs, 11], store=url, quiet=True, reuse="latest")
    assert third.collect() == expected([*docs, 11], sep=" | ")
    with open_store(url) as store:
        assert audit_run(store, third.run_id).ok


def test_keep_all_keeps_every_value_for_a_whole_reuse(
        ray_local: None, redis_url: str, tmp_path: Path) -> None:
    root = tmp_path / "payloads"
    url = f"{redis_url}?payload_dir={root}&keep=all"
    first = Book().run([1, 2, 3], store=url, quiet=True)
    assert first.collect() == expected([1, 2, 3])
    assert set(objects(root, first.run_id)) == {"scan", "read", "bind"}
    second = Book().run([1, 2, 3], store=url, quiet=True, reuse=first.run_id)
    assert second.collect() == expected([1, 2, 3])
    with open_store(url) as store:
        calls = run_status(store, second.run_id).calls
    assert all(c["dispatched"] == 0 for c in calls.values())


@pytest.mark.long
@pytest.mark.timeout(200)
def test_a_driver_killed_mid_run_then_resumed_frees_and_loses_nothing(
        ray_local: None, redis_url: str, tmp_path: Path) -> None:
    """Values freed before the kill are not needed by the resume's rebuild (it folds their
    outlines); every output once, the audit clean, only delivered values left."""
    root = tmp_path / "payloads"
    url = f"{redis_url}?payload_dir={root}&payload_threshold=16"
    docs = make_docs(24)
    out = tmp_path / "out"
    run_id = create_run(FaultPipeline, [docs], store=url, kwargs={"gpu_ms": 40},
                        out_dir=str(out), shards=3, micro_batch=2, max_active_sources=4)
    kill_driver_once_delivered(run_id, url, out, at_least=6)
    assert main(["resume", run_id, "--store", url, "--lease-ttl", "2", "--quiet"]) == 0
    outputs_match_reference(out, docs)
    with open_store(url) as store:
        assert set(emitted_counts(store, run_id).values()) == {1}
        assert len(emitted_counts(store, run_id)) == len(docs)
        committed = sum(isinstance(s.fact, GrainCommitted)
                        for facts in store.read_run(run_id, payloads=False).values()
                        for s in facts)
        report = audit_run(store, run_id)
        assert report.ok, report
        assert report.counts["payloads"]["freed"] > committed // 2


def test_every_reader_finds_the_values_where_the_run_put_them(
        ray_local: None, redis_url: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The run records its first opener's payload root: a reader whose store URL names none,
    # in another home (its default root is elsewhere), audits, shows and reuses the run.
    root = tmp_path / "payloads"
    docs = [1, 2, 3, 4]
    first = Book().run(docs, store=f"{redis_url}?payload_dir={root}", quiet=True)
    assert first.collect() == expected(docs)
    assert objects(root, first.run_id)  # its delivered values are there
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    monkeypatch.delenv("RAYORCH_PAYLOAD_DIR", raising=False)
    with open_store(redis_url) as store:
        report = audit_run(store, first.run_id)
        assert report.ok, report
        values = [s.fact.outputs for s in store.iter_facts(first.run_id, 0)
                  if isinstance(s.fact, GrainCommitted) and s.fact.call == "bind"]
        assert values and all(v and isinstance(v[0], str) for v in values)
    assert main(["audit", first.run_id, "--store", redis_url]) == EXIT_OK
    capsys.readouterr()
    second = Book().run(docs, store=redis_url, quiet=True, reuse=first.run_id)
    assert second.collect() == expected(docs)
    with open_store(redis_url) as store:
        assert run_status(store, second.run_id).calls["bind"]["reused"] == len(docs)
        assert audit_run(store, second.run_id).ok
