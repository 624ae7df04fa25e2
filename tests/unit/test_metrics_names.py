"""The Grafana dashboard (docs/grafana-dashboard.json) charts only series that rayorch
exports: the driver's endpoint (runtime/metrics.py) or the web view's (ui/metrics.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

from rayorch.progress import RunStats
from rayorch.runtime.metrics import DriverMetrics, failure_kind
from rayorch.store import open_store
from rayorch.store.scripted_run import write_scripted_run

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"


def exported() -> set[str]:
    stats = RunStats("r")
    stats.call("ocr").done = 3
    stats.call("ocr").tokens_in = 5  # a model stage: its tokens are exported
    metrics = DriverMetrics(stats, {"ocr": "ocr"})
    metrics.changed("ocr", recycle=True)  # (forgets the module's actors' RSS)
    metrics.batch("ocr", 0.5, 0.01, 100 << 20, 42)
    metrics.failed("ocr", "ValueError: x")
    metrics.pools({"ocr": (2, 0, 0)}, 0)
    names = {s.name for family in metrics.registry.collect() for s in family.samples}
    metrics.close()
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from rayorch.ui.app import build_app

    store = open_store("memory://")
    write_scripted_run(store, "done")
    text = TestClient(build_app(store)).get("/metrics").text
    names |= {line.split("{")[0].split(" ")[0] for line in text.splitlines()
              if line and not line.startswith("#")}
    # absent without a GPU, present with one (NVML): runtime/metrics.py _Nvml
    return names | {"rayorch_gpu_utilization_ratio", "rayorch_gpu_memory_used_bytes"}


def test_every_series_the_dashboard_charts_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs.append(dashboard["templating"]["list"][1]["query"])
    charted = {name for e in exprs for name in re.findall(r"\brayorch_\w+", e)}
    assert charted, exprs
    missing = charted - exported()
    assert not missing, f"the dashboard charts series nobody exports: {sorted(missing)}"


def test_a_failure_is_labelled_by_its_kind_never_its_text() -> None:
    assert failure_kind("ocr: page 2: RuntimeError: <script>x</script>") == "RuntimeError"
    assert failure_kind("batch of 'ocr' ran past timeout_s=30") == "timeout"
    assert failure_kind("actor of 'ocr' was replaced: ActorFailure: gpu lost") == "crash"
    assert failure_kind("a PDF with no pages") == "other"
