"""The web view's ``/metrics``: the store's runs as Prometheus series, read from the
lineage store at each scrape (so one ``rayorch ui`` beside a Redis store exports every
run, whichever drivers run it; a driver's own endpoint, runtime/metrics.py, adds what only
it sees: queue depth, actor memory, commit latency).

Per run among the newest ``RUNS_PER_PAGE`` (the runs page's first page): its state, sources
done / failed / admitted / declared, live drivers, Grains per Call by what the facts say
(dispatched, present, record_failure, reused, ...), and each pool's last size with its
changes and recyclings from the pool log. Labels are run ids, plan, Call and module names,
all checked names (core/names.py); never a cause's text.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rayorch.inspect.pool_log import pool_history
from rayorch.ui.pages import RUNS_PER_PAGE, Runs

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def store_metrics(runs: Runs) -> bytes:
    """The exposition text of the store's newest runs."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StoreCollector(runs))
    return bytes(generate_latest(registry))


class _StoreCollector:
    def __init__(self, runs: Runs) -> None:
        self.runs = runs

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        info = GaugeMetricFamily("rayorch_run_info", "a run of the store (1), with its plan "
                                 "and state", labels=["run", "plan", "state"])
        sources = GaugeMetricFamily("rayorch_run_sources", "a run's sources by state",
                                    labels=["run", "state"])
        drivers = GaugeMetricFamily("rayorch_run_drivers", "a run's live drivers",
                                    labels=["run"])
        grains = CounterMetricFamily("rayorch_run_grains", "a run's Grain facts per Call, by "
                                     "kind", labels=["run", "call", "kind"])
        actors = GaugeMetricFamily("rayorch_run_pool_actors", "each pool's last recorded size",
                                   labels=["run", "module"])
        changes = CounterMetricFamily("rayorch_run_pool_changes", "pool resizes and recycled "
                                      "actors", labels=["run", "module", "kind"])
        store = self.runs.store
        newest = sorted(store.list_runs(), key=lambda i: (-i.created_ts, i.run_id))
        for run in newest[:RUNS_PER_PAGE]:
            summary = self.runs.summary(run.run_id, run.created_ts)
            rid = run.run_id
            info.add_metric([rid, summary.plan, summary.state], 1)
            sources.add_metric([rid, "done"], summary.done)
            sources.add_metric([rid, "failed"], summary.failures)
            sources.add_metric([rid, "admitted"], summary.admitted)
            if summary.total is not None:
                sources.add_metric([rid, "declared"], summary.total)
            drivers.add_metric([rid], summary.drivers)
            live = self.runs.live(rid)
            with live.lock:
                status = live.status()
            for call, counts in sorted(status.calls.items()):
                for kind, n in sorted(counts.items()):
                    grains.add_metric([rid, call, kind], n)
            history = pool_history(store.pool_sizes(rid))
            for series in history.series:
                actors.add_metric([rid, series.module], series.last)
                recycled = sum(1 for c in series.changes if c.recycle)
                changes.add_metric([rid, series.module, "recycle"], recycled)
                changes.add_metric([rid, series.module, "resize"],
                                   len(series.changes) - recycled)
        yield from (info, sources, drivers, grains, actors, changes)


__all__ = ["CONTENT_TYPE", "store_metrics"]
