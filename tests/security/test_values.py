"""Values the codec cannot store faithfully are per-record failures, the same on both stores.

Measured before (issue 12): a numpy object array was stored as raw memory addresses (the
run "succeeded", then ``audit`` and ``show`` failed with "not a rayorch fact"); a set or a
custom class passed on the memory store, and on Redis showed up as "actor died" with the
actor replaced on every attempt and the real TypeError never shown. Also: re-using the id
of a finished run crashed with an internal GrainSealedError.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ray import cloudpickle as ray_cloudpickle

import rayorch as ro
from rayorch.cli import main as cli_main
from rayorch.core.facts import pack_value
from rayorch.core.outcome import FailedResult
from rayorch.core.udf import reports_for
from rayorch.inspect.audit import audit_run
from rayorch.runtime.status import RunFinishedError
from rayorch.store.registry import open_store

ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import tests


class Custom:
    pass


def produce(x: str) -> Any:
    if x == "set":
        return {1, 2}
    if x == "objarr":
        return np.array([Custom(), 1], dtype=object)
    if x == "custom":
        return Custom()
    if x == "nested":
        return {"ok": [1, {frozenset({1})}]}
    if x == "bigint":
        return 1 << 70
    return (x, os.getpid(), np.arange(3, dtype=np.float32))


class Produce:
    def __call__(self, xs: list[str]) -> list[Any]:
        return [produce(x) for x in xs]


class ProducePipeline(ro.Pipeline):
    def __init__(self) -> None:
        super().__init__()
        self.produce = ro.RayModule(Produce, batch_size=2, num_cpus=0.1, max_attempts=3)

    def forward(self, xs: Any) -> Any:
        return self.produce(xs)


INPUTS = ["a", "set", "b", "objarr", "c", "custom", "d", "nested", "e", "bigint", "f"]
BAD = {"set": "set", "objarr": "ndarray", "custom": "Custom", "nested": "dict",
       "bigint": "int"}


def test_the_codec_refuses_object_and_structured_arrays() -> None:
    with pytest.raises(TypeError, match="numpy object array"):
        pack_value(np.array([object()], dtype=object))
    with pytest.raises(TypeError, match="structured array"):
        pack_value(np.zeros(2, dtype=[("a", "i4"), ("b", "f8")]))
    reports = reports_for("produce", [((0,), 0), ((1,), 0)],
                          [(np.array([1, None], dtype=object),), ("fine",)])
    assert reports[0].outcome == "record_failure" and reports[1].outcome == "present"
    assert "ndarray" in str(reports[0].cause) and "'produce'" in str(reports[0].cause)


@pytest.mark.integration
@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_unstorable_values_are_record_failures_on_both_stores(
        kind: str, ray_local: None, request: pytest.FixtureRequest, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    if kind == "memory":
        url = f"memory://values-{os.getpid()}"
        request.addfinalizer(open_store(url).close)  # kept for the reads after the run
    else:
        url = f"{request.getfixturevalue('redis_url')}?payload_dir={tmp_path / 'payloads'}"
    handle = ProducePipeline().run(INPUTS, store=url, run_id=f"values-{kind}", quiet=True)
    results = handle.collect()
    store, run_id = handle.store, handle.run_id
    pids = set()
    for x, value in zip(INPUTS, results):
        if x in BAD:
            assert isinstance(value, FailedResult), (x, value)
            assert value.cause is not None and value.cause.startswith("UnstorableValue:")
            assert f"is a {BAD[x]}" in value.cause and "'produce'" in value.cause, value.cause
        else:
            assert value[0] == x and list(value[2]) == [0.0, 1.0, 2.0], value
            pids.add(value[1])
    assert len(pids) == 1, "the actor was replaced for a value it could not store"
    report = audit_run(store, run_id)
    assert report.ok, report.violations
    if kind == "redis":
        assert cli_main(["audit", run_id, "--store", url]) == 0
        assert cli_main(["show", run_id, "3", "--store", url]) == 0
        shown = capsys.readouterr().out
        assert "record failure (UnstorableValue: output 'produce' is a ndarray" in shown
        assert cli_main(["runs", "--store", url, "--json"]) == 0
        (row,) = [r for r in json.loads(capsys.readouterr().out) if r["run"] == run_id]
        assert row["status"] == "complete" and row["failures"] == len(BAD)
        assert row["sources_done"] == len(INPUTS)
    # The same id again: the run finished, so one line says so and how to start afresh.
    with pytest.raises(RunFinishedError) as caught:
        ProducePipeline().run(INPUTS, store=url, run_id=f"values-{kind}", quiet=True)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and f"values-{kind}" in message
    assert "rayorch delete" in message and "Sealed" not in message
