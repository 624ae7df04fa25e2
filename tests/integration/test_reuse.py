"""``reuse=``: a run re-computes only the Grains whose Call or inputs changed (real Ray).

On the memory store within one ``ro.Executor`` and on a real redis-server (with payload
files, referenced by the later run, never copied).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import ray

import rayorch as ro
from rayorch.cli import EXIT_OK, main
from rayorch.inspect.audit import audit_run
from rayorch.inspect.status import run_status
from rayorch.store.registry import open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Pages:
    def __call__(self, docs: list[int]) -> list[list[str]]:
        return [[f"doc{d}-page{i}-" + "x" * 60 for i in range(d % 3 + 1)] for d in docs]


class Ocr:
    def __init__(self, upper: bool = False) -> None:
        self.upper = upper

    def __call__(self, pages: list[str]) -> list[str]:
        return [p.upper() if self.upper else p[:12] for p in pages]


class Join:
    def __init__(self, sep: str = "|") -> None:
        self.sep = sep

    def __call__(self, texts: list[list[str]]) -> list[str]:
        return [self.sep.join(t) for t in texts]


class Docs(ro.Pipeline):
    def __init__(self, upper: bool = False, sep: str = "|") -> None:
        super().__init__()
        self.pages = ro.RayModule(Pages, num_cpus=0.25)
        self.ocr = ro.RayModule(Ocr, upper=upper, num_cpus=0.25, batch_size=4)
        self.join = ro.RayModule(Join, sep=sep, num_cpus=0.25)

    def forward(self, docs: Any) -> Any:
        return self.join(ro.F.reduce(self.ocr(ro.F.expand(self.pages(docs)))))


def counts(store_url: str, run_id: str) -> dict[str, dict[str, int]]:
    """Per Call: how many Grains ran (dispatched) and how many were reused (status)."""
    with open_store(store_url) as store:
        calls = run_status(store, run_id).calls
    return {call: {"ran": c["dispatched"], "reused": c["reused"]} for call, c in calls.items()}


def expected(docs: list[int], upper: bool = False, sep: str = "|") -> list[str]:
    out = []
    for d in docs:
        pages = [f"doc{d}-page{i}-" + "x" * 60 for i in range(d % 3 + 1)]
        out.append(sep.join(p.upper() if upper else p[:12] for p in pages))
    return out


def test_memory_executor_reruns_only_new_sources_and_changed_calls(ray_local: None) -> None:
    with ro.Executor(Docs()) as executor:
        first = executor.run([1, 2, 3], quiet=True)
        second = executor.run([1, 2, 3, 4], quiet=True, reuse=first.run_id)
        assert second.outputs == expected([1, 2, 3, 4])
        got = counts(executor.store_url, second.run_id)
        assert got["pages"] == {"ran": 1, "reused": 3}
        assert got["ocr"] == {"ran": 2, "reused": 6}  # doc 4 has 2 pages
        assert got["join"] == {"ran": 1, "reused": 3}
        third = executor.run([1, 2, 3, 4], quiet=True, reuse="latest")
        assert third.outputs == expected([1, 2, 3, 4])
        assert all(c["ran"] == 0 for c in counts(executor.store_url, third.run_id).values())
        with open_store(executor.store_url) as store:
            assert audit_run(store, third.run_id).ok


@pytest.mark.long
def test_redis_changed_last_stage_runs_no_earlier_grain(
        ray_local: None, redis_url: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # keep=all: every value outlives its source's delivery, so every stage can be reused
    url = f"{redis_url}?payload_dir={tmp_path / 'payloads'}&payload_threshold=40&keep=all"
    first = Docs().run([1, 2, 5], store=url, quiet=True)
    assert first.collect() == expected([1, 2, 5])
    second = Docs(sep="+").run([1, 2, 5], store=url, quiet=True, reuse=first.run_id)
    assert second.collect() == expected([1, 2, 5], sep="+")
    got = counts(url, second.run_id)
    assert got["pages"]["ran"] == 0 and got["ocr"]["ran"] == 0 and got["join"]["ran"] == 3
    third = Docs(upper=True, sep="+").run([1, 2, 5], store=url, quiet=True, reuse="latest",
                                          no_reuse=["pages"])
    assert third.collect() == expected([1, 2, 5], upper=True, sep="+")
    got = counts(url, third.run_id)
    assert got["pages"]["ran"] == 3 and got["ocr"] == {"ran": 8, "reused": 0}
    with open_store(url) as store:
        for run in (second.run_id, third.run_id):
            report = audit_run(store, run)
            assert report.ok, report
    assert main(["show", second.run_id, "2", "--store", url]) == EXIT_OK
    shown = capsys.readouterr().out
    assert f"ocr[2.1]: reused from run {first.run_id} (ocr[2.1])" in shown
    assert main(["status", second.run_id, "--store", url]) == EXIT_OK
    assert "call ocr: reused 8" in capsys.readouterr().out
    # the second run reads the first run's payload files: deleting the first keeps them
    files = lambda run: sorted((tmp_path / "payloads" / run).rglob("*.seg"))  # noqa: E731
    held = [f for f in files(first.run_id) if f.parent.name != "join"]  # join ran again
    assert held and main(["gc", "--store", url]) == EXIT_OK
    assert main(["delete", first.run_id, "--store", url]) == EXIT_OK
    assert files(first.run_id) == held
    assert main(["show", second.run_id, "2", "--store", url]) == EXIT_OK
    with open_store(url) as store:
        report = audit_run(store, second.run_id)
    assert not report.ok and f"reused from run {first.run_id}, which is not in" in str(report)
    assert main(["delete", second.run_id, "--store", url]) == EXIT_OK
    assert main(["delete", third.run_id, "--store", url]) == EXIT_OK
    assert main(["gc", "--store", url]) == EXIT_OK
    assert files(first.run_id) == held  # a folder without a run is never touched by gc
