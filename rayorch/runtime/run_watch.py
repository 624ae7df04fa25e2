"""What a driver shows and records of its run besides facts: the live progress table, the
Prometheus endpoint (runtime/metrics.py) and the pool log (recycled actors; the pool
sizer's changes go through :meth:`RunWatch.record_pools` too)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from rayorch.core.machine import MachineLoad
from rayorch.progress import RunStats, make_progress
from rayorch.runtime.metrics import DriverMetrics, MetricsError
from rayorch.runtime.pool_sizer import PoolChange
from rayorch.runtime.ports import Pools
from rayorch.runtime.shard_leases import DriverConfig
from rayorch.store.base import LineageStore
from rayorch.store.errors import StoreUnavailableError


class RunWatch:
    """One driver's progress table, metrics and pool log (see the module docstring)."""

    def __init__(self, *, stats: RunStats, pools: Pools, store: LineageStore, run_id: str,
                 driver_id: str, modules: dict[str, str], config: DriverConfig,
                 loads: Callable[[], list[MachineLoad]], clock: Callable[[], float]) -> None:
        """``modules``: each Call's module; ``loads``: what the held shards hold now."""
        self.stats, self.pools, self.store = stats, pools, store
        self.run_id, self.driver_id = run_id, driver_id
        self._loads, self._now, self._log = loads, clock, config.log
        self._progress = make_progress(config.progress)
        self.metrics: DriverMetrics | None = None
        self.metrics_url: str | None = None
        self._metrics_at = 0.0
        if config.metrics_port is not None:
            self._serve_metrics(modules, config.metrics_port, config.metrics_host)

    def _serve_metrics(self, modules: dict[str, str], port: int, host: str) -> None:
        try:
            metrics = DriverMetrics(self.stats, modules)
        except ImportError:
            raise MetricsError("--metrics-port needs prometheus-client: pip install "
                               "'rayorch[metrics]'") from None
        bound = metrics.serve(port, host)
        self.metrics = metrics
        self.metrics_url = f"http://{host}:{bound}/metrics"
        self._log(f"rayorch: metrics of run {self.run_id} on {self.metrics_url}")

    def start(self) -> None:
        if self._progress is not None:
            self._progress.start()

    def show(self) -> None:
        """Bring the live counters up to date for the progress table and the metrics (the
        metrics' pool sizes at most once a second)."""
        if self._progress is None and self.metrics is None:
            return
        loads = self._loads()
        for call_id, stats in self.stats.calls.items():
            stats.ready = sum(load.ready[call_id] for load in loads)
            stats.suppressed = sum(load.suppressed[call_id] for load in loads)
        self.stats.actors_replaced = self.pools.replaced()
        if self._progress is not None:
            self._progress.update(self.stats)
        now = time.monotonic()
        if self.metrics is not None and now - self._metrics_at >= 1.0:
            self._metrics_at = now
            self.metrics.pools({m: (c.size, c.starting, c.draining)
                                for m, c in self.pools.counts().items()},
                               self.stats.actors_replaced)

    def batch(self, call: str, done: Any, commit_s: float | None) -> None:
        """A batch came back (a ``Completion``) and was committed in ``commit_s``."""
        stats = self.stats.call(call)
        stats.tokens_in += done.tokens[0]
        stats.tokens_out += done.tokens[1]
        stats.payload_bytes += done.payload_bytes
        if self.metrics is None:
            return
        self.metrics.batch(call, done.busy_s, commit_s, done.rss_bytes, done.actor)

    def timed(self, call: Callable[[], Any]) -> tuple[Any, float]:
        """``call()``'s result and how long it took (the store commit's latency)."""
        started = time.perf_counter()
        result = call()
        return result, time.perf_counter() - started

    def failed(self, call: str, cause: str, count: int = 1) -> None:
        if self.metrics is not None:
            self.metrics.failed(call, cause, count)

    def record_recycled(self) -> None:
        """Say and record each actor the pools recycled (``max_rss``, ``max_batches``): a
        pool change whose size stays, with why, for ``status``, the timeline and the web
        view."""
        recycled = self.pools.recycled()
        if not recycled:
            return
        now = self._now()
        counts = self.pools.counts()
        changes = []
        for module, why in recycled:
            size = counts[module].size if module in counts else 0
            change = PoolChange(time.monotonic() - self.stats.started, module, size, size, why,
                                now, self.driver_id)
            self._log(f"rayorch: {change.line()}")
            changes.append(change)
        self.stats.actors_recycled += len(changes)
        self.record_pools(changes)

    def record_pools(self, changes: Sequence[PoolChange]) -> None:
        """Keep pool size changes in the store for ``rayorch status`` (best effort), and
        count them in the metrics: every change, the sizer's and the recyclings, comes here."""
        if self.metrics is not None:
            for change in changes:
                self.metrics.changed(change.module, change.recycle)
        with contextlib.suppress(StoreUnavailableError):
            self.store.record_pool_sizes(self.run_id, [change.encode() for change in changes])

    def stop(self) -> None:
        """Stop the progress table (its last state stays on screen)."""
        if self._progress is not None:
            progress, self._progress = self._progress, None
            progress.stop(self.stats)

    def close(self) -> None:
        self.stop()
        if self.metrics is not None:
            self.metrics.close()


__all__ = ["RunWatch"]
