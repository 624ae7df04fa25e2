"""``rayorch timeline``: windows, throughput, failovers and retries computed from stored facts.

Runs are real: a pipeline on Ray with a real redis-server, and the scripted run
(no Ray) written through the Redis store; failovers are real lease takeovers.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
import zlib
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import rayorch as ro
from rayorch import F
from rayorch.cli import EXIT_ERROR, EXIT_OK, main
from rayorch.core.facts import (
    GrainCommitted,
    GrainDispatched,
    GrainRetried,
    LeaseAcquired,
    SourceAdmitted,
)
from rayorch.inspect.pool_log import PoolHistory
from rayorch.inspect.timeline import (
    NoFactsError,
    Timeline,
    compute_timeline,
    draw_timeline,
    load_timeline,
    nice_bin_width,
)
from rayorch.store import open_store
from rayorch.store.base import StoredFact
from rayorch.store.errors import RunNotFoundError
from rayorch.store.scripted_run import scripted_plan, write_scripted_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ray_cloudpickle = pytest.importorskip("ray.cloudpickle")
ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG, after checking its signature and the IHDR chunk's CRC."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, "not a PNG signature"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    body = data[16:16 + length]
    (crc,) = struct.unpack(">I", data[16 + length:20 + length])
    assert crc == zlib.crc32(kind + body), "corrupt IHDR chunk"
    assert data.endswith(b"IEND\xaeB`\x82"), "PNG not terminated"
    width, height = struct.unpack(">II", body[:8])
    return width, height


def committed_per_call(facts: dict[int, list[StoredFact]]) -> Counter[str]:
    return Counter(s.fact.call for shard in facts.values() for s in shard
                   if isinstance(s.fact, GrainCommitted))


def assert_consistent_with_facts(timeline: Timeline, facts: dict[int, list[StoredFact]]) -> None:
    """Windows and bins agree with the raw facts they were computed from."""
    by_call = committed_per_call(facts)
    assert {w.call: w.committed for w in timeline.windows if w.committed} == dict(by_call)
    assert timeline.committed == sum(by_call.values())
    flat = [s.fact for shard in facts.values() for s in shard]
    for w in timeline.windows:
        dispatches = [f.ts for f in flat if isinstance(f, GrainDispatched) and f.call == w.call]
        commits = [f.ts for f in flat if isinstance(f, GrainCommitted) and f.call == w.call]
        assert w.dispatched == len(dispatches)
        assert w.start == pytest.approx(min(dispatches) - timeline.start_ts)
        assert w.end == pytest.approx(max(commits) - timeline.start_ts)
        assert 0 <= w.start <= w.end <= timeline.elapsed + 1e-9
        bins = timeline.throughput.counts[w.call]
        assert sum(bins) == w.committed
        rates = timeline.throughput.rates(w.call)
        assert sum(rates) * timeline.throughput.bin_s == pytest.approx(w.committed)
    assert len(timeline.retries) == sum(isinstance(f, GrainRetried) for f in flat) + sum(
        f.tag == "grain_failed" for f in flat)


# -- a real run on Ray ------------------------------------------------------------------
class SplitPages:
    def __call__(self, docs: list[Any]) -> list[Any]:
        return [[f"{name}:{k}" for k in range(n)] for name, n in docs]


class SlowOcr:
    """Takes a little time per page; its process fails once on a page named ``*crash``.

    ``ro.ActorFailure`` (the actor is broken, replace it) is a physical failure: a retry
    on a fresh actor. A plain exception would be handled inside the actor.
    """

    def __init__(self, marker_dir: str) -> None:
        self.marker_dir = Path(marker_dir)

    def __call__(self, pages: list[str]) -> list[Any]:
        time.sleep(0.01 * len(pages))
        marker = self.marker_dir / "crashed-once"
        if any(p.startswith("crash") for p in pages) and not marker.exists():
            marker.write_text("1")
            raise ro.ActorFailure("the OCR engine crashed")
        return [p.upper() for p in pages]


class Assemble:
    def __call__(self, texts: list[list[str]]) -> list[Any]:
        return ["\n".join(t) for t in texts]


class Docs(ro.Pipeline):
    def __init__(self, marker_dir: str) -> None:
        super().__init__()
        self.split = ro.RayModule(SplitPages, num_cpus=0.1)
        self.ocr = ro.RayModule(SlowOcr, marker_dir=marker_dir, num_cpus=0.1, replicas=2,
                                batch_size=4)
        self.assemble = ro.RayModule(Assemble, num_cpus=0.1)

    def forward(self, docs: Any) -> Any:
        return self.assemble(F.reduce(self.ocr(F.expand(self.split(docs)))))


def test_timeline_of_a_ray_run_matches_its_facts(
    ray_local: None, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = [(f"doc{i}", 3 + i % 5) for i in range(12)] + [("crash", 2)]
    run = Docs(str(tmp_path)).run(docs, store=redis_url, progress=False, quiet=True,
                                  micro_batch=4, shards=2)
    assert len(run.collect()) == len(docs)
    store = open_store(redis_url)
    facts = store.read_run(run.run_id)
    timeline = load_timeline(store, run.run_id)

    assert [w.call for w in timeline.windows] == ["split", "ocr", "assemble"]
    assert_consistent_with_facts(timeline, facts)
    pages = sum(n for _, n in docs)
    assert timeline.committed == len(docs) * 2 + pages
    assert [w.committed for w in timeline.windows] == [len(docs), pages, len(docs)]
    assert timeline.sources == len(docs) and timeline.completed
    assert timeline.outputs == {"present": len(docs)}
    retried = [r for r in timeline.retries if not r.final]
    assert retried and all(r.call == "ocr" and "crashed" in r.cause for r in retried)
    assert timeline.failovers == ()  # one driver, epoch 1 on every shard
    assert all(w.in_flight == 0 for w in timeline.windows)

    out = tmp_path / "run.png"
    assert main(["timeline", run.run_id, "--store", redis_url, "-o", str(out)]) == EXIT_OK
    assert f"wrote {out}" in capsys.readouterr().out
    width, height = png_size(out)
    assert width >= 800 and height >= 500

    assert main(["timeline", run.run_id, "--store", redis_url, "--json", "--bin", "0.05"]
                ) == EXIT_OK
    data = json.loads(capsys.readouterr().out)
    assert data["throughput"]["bin_s"] == 0.05
    assert {c["call"]: c["committed"] for c in data["calls"]} == dict(committed_per_call(facts))
    for call, counts in data["throughput"]["committed"].items():
        assert sum(counts) == committed_per_call(facts)[call]
    assert data["totals"]["retries"] == len(retried)


# -- a pool that sizes itself -----------------------------------------------------------------
class Step:
    """0.05 s an item. The batch holding item 2 waits (60 s at most) until a second actor is
    up, so the backlog stays until the pool has grown, however slow the machine."""

    def __init__(self, log_dir: str) -> None:
        self.dir = Path(log_dir)
        (self.dir / f"up-{os.getpid()}").touch()

    def __call__(self, xs: list[int]) -> list[int]:
        deadline = time.monotonic() + 60
        while 2 in xs and len(list(self.dir.glob("up-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.05 * len(xs))
        return [x + 1 for x in xs]


class Sizing(ro.Pipeline):
    def __init__(self, log_dir: str) -> None:
        super().__init__()
        self.step = ro.RayModule(Step, log_dir=log_dir, num_cpus=0.5, replicas=(1, 3))

    def forward(self, xs: Any) -> Any:
        return self.step(xs)


def test_a_run_with_a_sizing_pool_yields_its_size_over_time(
    ray_local: None, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rayorch.core.pool_sizing import SizingSettings

    fast = SizingSettings(interval_s=0.25, backlog_s=0.5, idle_limit_s=0.75,
                          model_idle_limit_s=0.75, start_cost_factor=0.0)
    run = Sizing(str(tmp_path)).run(list(range(40)), store=redis_url, progress=False,
                                    quiet=True, pool_sizing=fast)
    assert run.collect() == [x + 1 for x in range(40)]
    store = open_store(redis_url)
    timeline = load_timeline(store, run.run_id)
    store.close()
    (series,) = timeline.pools.series  # one pool, one driver
    assert (series.module, series.calls, series.label) == ("step", ("step",), "step")
    assert series.points[0][1] == 1 and all(1 <= n <= 3 for _, n in series.points)
    assert any(c.after > c.before for c in series.changes)  # it grew under the backlog
    times = [t for t, _ in series.points]
    assert times == sorted(times) and 0 <= times[0] <= timeline.windows[0].end
    assert [e.change for e in timeline.pools.entries] == list(series.changes)
    assert all(e.change.reason for e in timeline.pools.entries) and not timeline.pools.skipped

    out = tmp_path / "run.png"
    assert main(["timeline", run.run_id, "--store", redis_url, "-o", str(out), "--json"]
                ) == EXIT_OK
    data = json.loads(capsys.readouterr().out)["pools"]
    assert data["series"][0]["calls"] == ["step"] and data["series"][0]["points"][0][1] == 1
    assert [c["reason"] for c in data["changes"]] == [c.reason for c in series.changes]
    plain = tmp_path / "no-pools.png"  # the same run without its pool panel is shorter
    draw_timeline(replace(timeline, pools=PoolHistory()), plain)
    assert png_size(out)[1] > png_size(plain)[1]


# -- the scripted run (no Ray) and lease takeovers ------------------------------------------
def test_scripted_run_windows_barred_grains_and_failover(redis_url: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    store = open_store(redis_url)
    write_scripted_run(store, "scripted")
    before = load_timeline(store, "scripted")
    assert before.failovers == ()
    windows = {w.call: w for w in before.windows}
    # pages (3, 1, 0, 5): 4 renders; ocr 9 pages, the 4 siblings of (3, 2) barred (one of
    # them retried first); assemble only for sources 1 and 2.
    assert windows["render"].committed == 4
    assert windows["ocr"].outcomes == {"group_failure": 1, "present": 3, "record_failure": 1}
    assert windows["ocr"].barred == 4 and windows["ocr"].in_flight == 0
    assert windows["ocr"].retried == 1
    assert windows["assemble"].committed == 2
    assert before.outputs == {"present": 2, "suppressed": 2}

    # Driver "b" takes shard 0 over (epoch 2); the old driver re-takes shard 1 (epoch 2).
    time.sleep(0.02)
    assert store.acquire_lease("scripted", 0, "driver-b", ttl_s=30) == 2
    assert store.acquire_lease("scripted", 1, "scripted-driver", ttl_s=30) == 2
    facts = store.read_run("scripted")
    after = load_timeline(store, "scripted")
    assert_consistent_with_facts(after, facts)
    takeover, retake = sorted(after.failovers, key=lambda f: f.shard)
    assert (takeover.shard, takeover.driver, takeover.epoch) == (0, "driver-b", 2)
    assert takeover.previous == "scripted-driver" and not takeover.same_driver
    assert retake.same_driver and retake.label() == (
        "shard 1 re-acquired by scripted-driver (epoch 2)")
    lease_ts = next(s.fact.ts for s in facts[0]
                    if isinstance(s.fact, LeaseAcquired) and s.fact.epoch == 2)
    assert takeover.t == pytest.approx(lease_ts - after.start_ts)
    assert takeover.t == pytest.approx(after.elapsed, abs=0.05)

    out = tmp_path / "scripted.png"
    assert main(["timeline", "scripted", "--store", redis_url, "-o", str(out), "--json"]
                ) == EXIT_OK
    data = json.loads(capsys.readouterr().out)
    assert [(f["shard"], f["driver"], f["epoch"], f["same_driver"]) for f in data["failovers"]
            ] == [(0, "driver-b", 2, False), (1, "scripted-driver", 2, True)]
    assert data["totals"]["failovers"] == 2 and data["totals"]["barred"] == 4
    png_size(out)


def test_plain_errors_for_unknown_and_empty_runs(redis_url: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    store = open_store(redis_url)
    with pytest.raises(RunNotFoundError):
        load_timeline(store, "nope")
    out = tmp_path / "x.png"
    assert main(["timeline", "nope", "--store", redis_url, "-o", str(out)]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "run 'nope' not found" in err and "rayorch runs" in err
    assert not out.exists()

    store.open_run("empty", scripted_plan(), shards=2, micro_batch=2)
    with pytest.raises(NoFactsError):
        load_timeline(store, "empty")
    assert main(["timeline", "empty", "--store", redis_url, "-o", str(out)]) == EXIT_ERROR
    assert "run 'empty' has no facts" in capsys.readouterr().err
    assert not out.exists()

    write_scripted_run(store, "done")
    assert main(["timeline", "done", "--store", redis_url]) == EXIT_ERROR
    assert "pass -o FILE.png" in capsys.readouterr().err
    assert main(["timeline", "done", "--store", redis_url, "--json", "--bin", "0"]
                ) == EXIT_ERROR
    assert "--bin must be a positive" in capsys.readouterr().err


def test_a_run_with_leases_but_no_dispatch_is_drawn_with_idle_calls(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_store(redis_url)
    store.open_run("starting", scripted_plan(), shards=2, micro_batch=2)
    store.acquire_lease("starting", 0, "driver-a", ttl_s=30)
    out = tmp_path / "starting.png"
    assert main(["timeline", "starting", "--store", redis_url, "-o", str(out), "--json"]
                ) == EXIT_OK
    data = json.loads(capsys.readouterr().out)
    assert data["calls"] == [] and data["idle_calls"] == ["render", "ocr", "assemble"]
    assert data["totals"]["facts"] == 1 and data["totals"]["completed"] is False
    png_size(out)


# -- the pure computation, on hand-timed facts -------------------------------------------------
def stored(facts: list[Any]) -> list[StoredFact]:
    return [StoredFact(i + 1, "root", f) for i, f in enumerate(facts)]


def test_bins_windows_and_lease_epochs_from_hand_timed_facts() -> None:
    t0 = 1_000.0
    shard0 = stored([
        LeaseAcquired(0, "a", 1, ts=t0),
        SourceAdmitted(0, ("x",), ts=t0 + 0.1),
        GrainDispatched("ocr", (0,), 0, ts=t0 + 0.2),
        GrainDispatched("ocr", (1,), 0, ts=t0 + 0.2),
        GrainCommitted("ocr", (0,), 0, "present", ("X",), ts=t0 + 0.5),
        GrainRetried("ocr", (1,), 1, "actor died", ts=t0 + 0.7),
        LeaseAcquired(0, "b", 2, ts=t0 + 2.0),
        GrainDispatched("ocr", (1,), 1, ts=t0 + 2.1),
        GrainCommitted("ocr", (1,), 1, "present", ("Y",), ts=t0 + 3.95),
        GrainDispatched("ocr", (2,), 0, ts=t0 + 3.96),
        LeaseAcquired(0, "b", 3, ts=t0 + 4.0),
    ])
    timeline = compute_timeline("hand", {0: shard0}, call_order=["render", "ocr"], bin_s=1.0)
    (window,) = timeline.windows
    assert window.call == "ocr"
    assert (round(window.start, 6), round(window.end, 6)) == (0.2, 3.95)
    assert (window.dispatched, window.committed, window.retried, window.in_flight) == (4, 2, 1, 1)
    assert window.mean_rate == pytest.approx(2 / 3.75)
    assert timeline.elapsed == pytest.approx(4.0)
    assert timeline.throughput.bin_starts == (0.0, 1.0, 2.0, 3.0)
    assert timeline.throughput.counts["ocr"] == (1, 0, 0, 1)
    assert timeline.idle_calls == ("render",)
    assert [(round(f.t, 6), f.driver, f.epoch, f.previous, f.same_driver)
            for f in timeline.failovers] == [(2.0, "b", 2, "a", False), (4.0, "b", 3, "b", True)]
    assert not timeline.completed


@pytest.mark.parametrize(("span", "width"), [
    (0.05, 0.001), (1.0, 0.02), (6.0, 0.1), (100.0, 2.0), (140.0, 2.5), (3000.0, 50.0),
    (0.0, 1.0),
])
def test_bin_width_is_round_and_gives_at_most_60_bins(span: float, width: float) -> None:
    assert nice_bin_width(span) == pytest.approx(width)
    if span:
        assert span / nice_bin_width(span) <= 60 + 1e-9
