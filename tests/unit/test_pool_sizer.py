"""The driver side of pool sizing (runtime/pool_sizer.py) through the simulator's real ports:
two model stages share the GPUs, one of them the bottleneck; and the pool log's records."""

from __future__ import annotations

import msgpack
import pytest

from bench.simulator.regions import RegionConfig, corpus, simulate
from rayorch.runtime.pool_sizer import PoolChange, pool_changes, pool_lines

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
