"""The pool log's one history computation (inspect/pool_log.py: ``pool_history``): each sizing
pool's size over time and why it changed, as ``rayorch status``, the timeline and the web view
show it; the store's records are data: hostile text is kept as text, a malformed record is
skipped with a note and never raises."""

from __future__ import annotations

import json
import math

import msgpack
import pytest

from rayorch.core.facts import GrainCommitted, GrainDispatched, LeaseAcquired, SourceAdmitted
from rayorch.inspect.pool_log import pool_history, pool_lines
from rayorch.inspect.timeline import compute_timeline
from rayorch.store.base import StoredFact
from rayorch.store.records import PoolChange, pool_changes

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>\x1b[31mred'
START = 1_000.0  # the run's first fact (clock time)
PLAN = {"nodes": [{"call": {"id": "regions_ocr", "module": "ocr"}},
                  {"call": {"id": "render", "module": "render"}},
                  {"call": None}, "not a node", {"call": {"id": 3, "module": "x"}}]}


def change(at_s: float, module: str, before: int, after: int, reason: str,
           driver: str = "d1", began: float = START + 0.5) -> bytes:
    """A record as a driver that began ``began`` writes it ``at_s`` into its run."""
    return PoolChange(at_s, module, before, after, reason, began + at_s, driver).encode()


def test_each_pool_is_a_step_line_from_its_drivers_start_with_every_change_and_reason() -> None:
    records = [change(2.0, "ocr", 1, 3, "backlog 68 (12 s of work)"),
               change(3.0, "render", 2, 1, "1 idle for 2s"),
               change(9.5, "ocr", 3, 2, HOSTILE)]
    history = pool_history(records, plan=PLAN, start_ts=START)
    ocr, render = history.series
    assert (ocr.module, ocr.calls, ocr.label) == ("ocr", ("regions_ocr",), "regions_ocr")
    # from the driver's start (0.5 s after the run's first fact), a step at each change
    assert ocr.points == ((0.5, 1), (2.5, 1), (2.5, 3), (10.0, 3), (10.0, 2))
    assert (ocr.last, ocr.most) == (2, 3)
    assert render.points == ((0.5, 2), (3.5, 2), (3.5, 1))
    assert [(e.t, e.label, e.change.after) for e in history.entries] == \
        [(2.5, "regions_ocr", 3), (3.5, "render", 1), (10.0, "regions_ocr", 2)]
    assert history.entries[-1].change.reason == HOSTILE  # data, kept as it is
    assert history.end == 10.0 and history.latest(1) == history.entries[-1:]
    assert not history.skipped and history.note() == ""
    exported = json.loads(json.dumps(history.as_dict()))
    assert exported["series"][0]["points"][-1] == [10.0, 2]
    assert exported["changes"][2]["reason"] == HOSTILE and exported["changes"][2]["t_s"] == 10.0

    # Without the run's start (``rayorch status``): seconds into each driver's run.
    assert pool_history(records).series[0].points == \
        ((0.0, 1), (2.0, 1), (2.0, 3), (9.5, 3), (9.5, 2))
    lines = pool_lines(records)
    assert lines[0].startswith("  pool ocr: 1 -> 3 (2s) -> 2 (10s); last: <script>")
    assert "\x1b" not in lines[0]  # the terminal gets no escape sequence


def test_each_driver_sizes_its_own_pools_and_has_its_own_line() -> None:
    records = [change(1.0, "ocr", 1, 2, "backlog", "d1"),
               change(1.0, "ocr", 1, 4, "backlog", "d2", began=START + 5.0),
               change(4.0, "ocr", 2, 1, "idle", "d1")]
    history = pool_history(records, plan=PLAN, start_ts=START)
    assert [(s.driver, s.label, s.points[0], s.last) for s in history.series] == \
        [("d1", "regions_ocr @ d1", (0.5, 1), 1), ("d2", "regions_ocr @ d2", (5.0, 1), 4)]
    assert [e.t for e in history.entries] == [1.5, 4.5, 6.0]  # time order across drivers
    assert pool_lines(records) == ["  pool ocr @ d1: 1 -> 2 (1s) -> 1 (4s); last: idle",
                                   "  pool ocr @ d2: 1 -> 4 (1s); last: backlog"]


BAD = [
    b"\x93garbage",  # not msgpack
    b"",  # nothing
    msgpack.packb([2, 0.0, 0.0, "ocr", 1, 2, "r", "d"]),  # a future version
    msgpack.packb([1, [1], 0.0, "ocr", 1, 2, "r", "d"]),  # a list for a time
    msgpack.packb([1, math.nan, 0.0, "ocr", 1, 2, "r", "d"]),  # not a number of seconds
    msgpack.packb([1, 1.0, math.inf, "ocr", 1, 2, "r", "d"]),  # an endless time
    msgpack.packb([1, 1.0, 0.0, "ocr", 1.5, 2, "r", "d"]),  # a size that is no whole number
    msgpack.packb([1, 1.0, 0.0, "ocr", -1, 2, "r", "d"]),  # a negative size
    msgpack.packb([1, 1.0, 0.0, "ocr", 1, True, "r", "d"]),  # a boolean size
    msgpack.packb([1, 1.0, 0.0, "ocr", 1, 2**40, "r", "d"]),  # an absurd size
    msgpack.packb([1, 1.0, 0.0, "", 1, 2, "r", "d"]),  # no pool
    msgpack.packb([1, 1.0, 0.0, "ocr", 1, 2, {"<b>": 1}, "d"]),  # a map for a reason
    msgpack.packb({str(i): i for i in range(8)}),  # a map of 8 fields
    msgpack.packb([1, 1.0, 0.0, "ocr", 1, 2, "r"]),  # a field short
    msgpack.packb("<script>alert(1)</script>"),  # text
]


def test_a_malformed_record_is_skipped_with_a_note_and_never_raises() -> None:
    good = [change(2.0, "ocr", 1, 3, "backlog"), change(4.0, "ocr", 3, 2, "idle")]
    records = [good[0], *BAD, good[1]]
    assert pool_changes(records) == [PoolChange.decode(r) for r in good]
    for raw in BAD:
        with pytest.raises(ValueError):
            PoolChange.decode(raw)
    history = pool_history(records, plan=PLAN, start_ts=START)
    assert history.series[0].points == ((0.5, 1), (2.5, 1), (2.5, 3), (4.5, 3), (4.5, 2))
    assert history.skipped == len(BAD) and len(history.notes) == 5
    note = history.note()
    assert note.startswith(f"{len(BAD)} pool records could not be read and were skipped: "
                           "record 2: not msgpack")
    assert "record 4: an unknown record version" in note
    assert "record 5: its times are not finite numbers of seconds >= 0" in note
    assert note.endswith(f"; and {len(BAD) - 5} more")
    assert "<script>" not in note and "<b>" not in note  # the note quotes no record
    assert pool_lines(records)[-1] == f"  ({note})"

    only_bad = pool_history(BAD, start_ts=START)  # nothing readable: no series, a note
    assert not only_bad.series and not only_bad.empty and only_bad.skipped == len(BAD)
    assert pool_history([]).empty


def test_the_timeline_carries_the_pool_history_on_its_clock() -> None:
    facts = {0: [StoredFact(i + 1, "root", f) for i, f in enumerate([
        LeaseAcquired(0, "d1", 1, ts=START), SourceAdmitted(0, (1,), ts=START + 0.2),
        GrainDispatched("regions_ocr", (0,), 0, ts=START + 1.0),
        GrainCommitted("regions_ocr", (0,), 0, "present", ts=START + 8.0)])]}
    records = [change(2.0, "ocr", 1, 3, "backlog"), b"junk", change(9.5, "ocr", 3, 1, HOSTILE)]
    timeline = compute_timeline("r", facts, pool_log=records, plan=PLAN)
    (ocr,) = timeline.pools.series
    assert ocr.label == "regions_ocr" and ocr.points[-1] == (10.0, 1)  # after the last fact
    assert timeline.pools.skipped == 1
    exported = json.loads(json.dumps(timeline.as_dict()))["pools"]
    assert [c["after"] for c in exported["changes"]] == [3, 1]
    assert exported["times"] == "since the run's first fact" and exported["skipped"] == 1
    assert compute_timeline("r", facts).pools.empty
