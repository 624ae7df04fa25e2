"""The driver side of pool sizing (runtime/pool_sizer.py) through the simulator's real ports:
two model stages share the GPUs, one of them the bottleneck; and the pool log's records."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

import rayorch as ro
from bench.simulator.regions import RegionConfig, corpus, simulate
from rayorch.core.machine import MachineLoad
from rayorch.core.pool_sizing import SizingSettings
from rayorch.inspect.pool_log import pool_lines
from rayorch.runtime.pool_sizer import PoolSizer
from rayorch.runtime.ports import Completion, PoolCounts
from rayorch.store.records import PoolChange, pool_changes

DOCS = corpus("scanned", docs=24)


@pytest.fixture(scope="module")
def runs() -> dict[int | str, float]:
    """Makespans (virtual seconds) of the static splits of 4 GPUs and of ``auto``."""
    return {split: simulate(RegionConfig(gpus=4, layout_gpus=split), DOCS).makespan_s
            for split in (1, 2)}


def test_auto_moves_the_gpus_to_the_bottleneck_and_stays_near_the_best_static_split(
        runs: dict[int | str, float]) -> None:
    """A scanned corpus is recognition-bound: the policy ends with more recognizers than
    layout actors, within 10% of the best static split and ahead of the even one (virtual
    time: deterministic)."""
    result = simulate(RegionConfig(gpus=4), DOCS)  # every output checked by simulate()
    sizer = result.sizer
    assert sizer is not None and sizer.binding() == "recognize"
    final = {m: sizer.size_over_time(m)[-1][1] for m in ("layout", "recognize")}
    assert final["recognize"] > final["layout"]
    assert any(c.reason.startswith("gives way to recognize") for c in sizer.history)
    timeline = sorted((t, m, size) for m in final for t, size in sizer.size_over_time(m))
    now = {"layout": 1, "recognize": 1}
    for _, module, size in timeline:  # never more GPUs than the cluster has
        now[module] = size
        assert sum(now.values()) <= 4
    best = min(runs.values())
    assert result.makespan_s <= 1.10 * best
    assert result.makespan_s < runs[2]


def test_a_pool_record_round_trips_and_status_shows_sizes_over_time() -> None:
    changes = [PoolChange(2.0, "ocr", 1, 4, "backlog 68", 100.0, "d1"),
               PoolChange(9.5, "ocr", 4, 2, "2 idle for 31s", 107.5, "d1"),
               PoolChange(3.0, "render", 2, 3, "backlog \x1b[31m9", 101.0, "d1")]
    records = [c.encode() for c in changes] + [b"\x93garbage", msgpack.packb([2, "future"])]
    assert pool_changes(records) == changes
    lines = pool_lines(records)
    assert lines[0] == "  pool ocr: 1 -> 4 (2s) -> 2 (10s); last: 2 idle for 31s"
    assert "\x1b" not in lines[1] and lines[1].startswith("  pool render: 2 -> 3 (3s)")
    assert lines[2] == ("  (2 pool records could not be read and were skipped: record 4: "
                        "not msgpack (ExtraData); record 5: 2 fields, not 8)")


class Ocr:
    def __call__(self, xs: list[int]) -> list[int]:
        return xs


class OneStage(ro.Pipeline):
    def __init__(self) -> None:
        super().__init__()
        self.ocr = ro.RayModule(Ocr, num_cpus=1, replicas="auto")

    def forward(self, xs: Any) -> Any:
        return self.ocr(xs)


class FakePools:
    """A pools port that only counts: ``size`` actors, all idle, 8 CPUs in the cluster."""

    def __init__(self) -> None:
        self.size = 1
        self.resized: list[int] = []

    def counts(self) -> dict[str, PoolCounts]:
        return {"ocr": PoolCounts(size=self.size, starting=0, draining=0, idle=self.size,
                                  in_flight=0, need={"CPU": 1.0})}

    def free(self) -> dict[str, float]:
        return {"CPU": 8.0 - self.size}

    def resize(self, module: str, size: int) -> None:
        self.size = size
        self.resized.append(size)


def test_the_first_work_and_a_first_measured_cost_are_decided_at_once_not_an_interval_later(
        ) -> None:
    plan = OneStage().compile()
    call = next(node.call.id for node in plan.calls if node.call is not None)
    pools, now = FakePools(), [0.0]
    sizer = PoolSizer(plan, pools, SizingSettings(interval_s=5.0),  # type: ignore[arg-type]
                      clock=lambda: now[0], log=lambda line: None)
    waiting = [MachineLoad({call: 40}, {call: 0}, 0)]
    now[0] = 1.0  # the first sample (every interval/5) finds work: decided now
    sizer.tick(lambda: waiting)
    assert sizer.decisions == 1 and pools.resized == [8]  # unmeasured: an even share at once
    assert "not measured yet" in sizer.history[-1].reason
    now[0] = 2.0
    sizer.tick(lambda: waiting)
    assert sizer.decisions == 1  # nothing new: the next one an interval after the last
    sizer.observe(Completion(0, call, tuple(((i,), 0) for i in range(4)), busy_s=0.4))
    now[0] = 3.0
    sizer.tick(lambda: waiting)
    assert sizer.decisions == 2  # its first cost: decided at this sample
