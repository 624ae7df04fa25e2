"""Reuse with the one driver, without Ray: shards, kills, resumes by other drivers, outages.

A random program runs once; then an edited source list runs reusing it, with the real
:class:`~rayorch.runtime.shard_driver.ShardDriver` on in-process pools and a flaky memory
store (tests/property/test_driver_machine.py's harness). The caller may be killed and other
drivers resume the run; each takes the run's reuse from what the run recorded
(``reuse_of_run``), as ``rayorch driver``/``resume`` do. Every source is delivered with the
reference's value, no Grain is dispatched whose reuse key the earlier run holds, Grains are
reused, and the run audits OK (each ``GrainReused`` checked against its origin).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inline_driver import TTL, Killed, make_driver
from invariance import REPORT_AT_ONCE, differences, short
from programs import ProgramSpec, programs
from test_driver_machine import FlakyStore, Harness, expected_record
from test_reuse_invariance import PurePipeline, edited, edits, no_group_failures

from rayorch.core.facts import GrainDispatched
from rayorch.core.machine import item_result
from rayorch.core.reference import evaluate
from rayorch.core.reuse import Reuse, ReuseIndex
from rayorch.inspect.audit import audit_run
from rayorch.runtime.delivery import CallerSink, IteratorFeed, ManifestFeed
from rayorch.runtime.reuse_setup import reuse_config, reuse_of_run
from rayorch.runtime.shard_driver import LeaseMode
from rayorch.runtime.sinks import FileSink, read_outputs


def drive(store: FlakyStore, plan: Any, run_id: str, rows: list[tuple[int]], harness: Harness,
          reuse: Reuse, out_dir: Any) -> dict[int, Any]:
    """The caller's driver, then resumers until one finishes: every output by source."""
    got: dict[int, Any] = {}
    driver = make_driver(store, plan, run_id, harness, mode=LeaseMode.HOLD_ALL,
                         feed=IteratorFeed(iter(rows), store.run_info(run_id), len(rows)),
                         sink=CallerSink(False), driver_id="caller", reuse=reuse)
    number = 0
    while True:
        try:
            for index, value in driver.results():
                got[index] = expected_record(value)
            driver.close()
            break
        except Killed:
            number += 1
            store.now += TTL + 1
            driver = make_driver(store, plan, run_id, harness, mode=LeaseMode.SHARE,
                                 feed=ManifestFeed(rows, store.run_info(run_id)),
                                 sink=FileSink(out_dir, "jsonl", run_id=run_id),
                                 driver_id=f"resume-{number}",
                                 reuse=reuse_of_run(store, plan, store.run_info(run_id)))
    for record in read_outputs(out_dir) if number else []:
        got.setdefault(int(record["index"]), record.get("value", record["outcome"]))
    return got


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck),
          **REPORT_AT_ONCE)
@given(spec=programs, values=st.lists(st.integers(0, 10_000), min_size=1, max_size=6,
                                      unique=True),
       edit=edits, shards=st.integers(1, 3), kills=st.integers(0, 2), data=st.data())
def test_reuse_survives_kills_and_resumes_by_other_drivers(
        spec: ProgramSpec, values: list[int], edit: tuple[str, int, int, int | None],
        shards: int, kills: int, data: st.DataObject,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    spec = no_group_failures(spec)
    before, after = PurePipeline(spec).compile(), PurePipeline(spec, salted=edit[3]).compile()
    rows_a, rows_b = [(v,) for v in values], [(v,) for v in edited(values, edit)]
    store = FlakyStore(f"memory://reuse-drivers-{id(data)}", clock=lambda: store.now)
    store.now = 0.0
    store.open_run("first", before, shards=shards, micro_batch=2)
    drive(store, before, "first", rows_a, Harness(data, 0), Reuse(before),
          tmp_path_factory.mktemp("first"))

    index = ReuseIndex.from_view(store.read_view("first"))
    reuse = Reuse(after, index)
    store.open_run("second", after, shards=shards, micro_batch=2,
                   config=reuse_config(reuse, ()))
    store.data = data
    got = drive(store, after, "second", rows_b, Harness(data, kills), reuse,
                tmp_path_factory.mktemp("second"))
    store.data = None
    reference = evaluate(after, rows_b).outputs
    want = {i: expected_record(item_result(i, reference[i], after.output_names))
            for i in range(len(rows_b))}
    got = {i: list(v) if isinstance(v, tuple) else v for i, v in got.items()}
    want = {i: list(v) if isinstance(v, tuple) else v for i, v in want.items()}
    assert got == want, f"delivered vs the reference's, by source:\n{differences(got, want)}"
    dispatched = [s.fact for k in range(shards) for s in store.iter_facts("second", k)
                  if isinstance(s.fact, GrainDispatched)]
    assert all(f.reuse_key for f in dispatched), "a dispatch without its reuse key"
    rerun = [(f.call, f.path) for f in dispatched if f.reuse_key in index.hits]
    assert not rerun, f"ran reusable Grains: {short(rerun)}"
    report = audit_run(store, "second")
    assert report.ok, report.violations
