"""A driver's Prometheus endpoint (``--metrics-port``, ``Pipeline.run(metrics_port=)``).

What a cluster operator scrapes while a run lasts days: the counters the driver keeps anyway
(:class:`rayorch.progress.RunStats`: the model tokens and payload bytes of each Call too),
read at scrape time by a collector (the driver's loop never waits on a scrape), plus what
each finished batch says (its actor's RSS, the store commit's latency, the failure's
cause). Rates are Prometheus's job: pages/s of a stage is
``rate(rayorch_grains_total{call="ocr",outcome="present"}[1m])``, documents/s
``rate(rayorch_sources_total{state="done"}[1m])``. Labels are the run, Call and module
names (bounded by the plan) and a failure's *kind* (its exception name, never its text).
GPU gauges come from NVML (``nvidia-ml-py``) where a GPU is present; absent otherwise.
The endpoint listens on 127.0.0.1 unless a host is given (``--metrics-host 0.0.0.0``).
docs/grafana-dashboard.json charts every series.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.progress import RunStats

COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_KIND = re.compile(r"\b([A-Z]\w{0,60}(?:Error|Exception|Failure|Exit|Interrupt)):")


class MetricsError(RayorchError):
    """The metrics endpoint could not start (a port in use, prometheus-client missing)."""


def failure_kind(cause: str) -> str:
    """A failure's cause as a label: the name of the exception it names (``ValueError``),
    ``crash`` for an actor that died, ``timeout`` for a batch past its limit, else
    ``other`` (a cause's text is data, never a label).

    >>> failure_kind("recognise: page 1 region 2 (text): ValueError: bad crop")
    'ValueError'
    >>> failure_kind("actor of 'ocr' died: RayActorError: ..."), failure_kind("corrupt")
    ('crash', 'other')
    """
    if " died" in cause or "was replaced" in cause:
        return "crash"
    if "ran past timeout_s" in cause:
        return "timeout"
    match = _KIND.search(cause)
    return match.group(1) if match else "other"


class DriverMetrics:
    """One driver's metrics: fed by the driver (:meth:`batch`, :meth:`failed`,
    :meth:`pools`), read by Prometheus through :meth:`collect`."""

    def __init__(self, stats: RunStats, modules: dict[str, str]) -> None:
        """``modules``: each Call's module name."""
        from prometheus_client import CollectorRegistry, Histogram

        self.stats = stats
        self.modules = modules
        self.registry = CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()
        self._failures: Counter[tuple[str, str]] = Counter()  # (call, kind)
        self._rss: dict[tuple[str, int], int] = {}  # (module, actor pid) -> bytes
        self._pools: dict[str, tuple[int, int, int]] = {}  # module -> live, starting, draining
        self._pool_changes: Counter[tuple[str, str]] = Counter()  # (module, resize|recycle)
        self._replaced = 0
        run = stats.run_id
        self.commit = Histogram("rayorch_store_commit_seconds", "lineage store commit latency "
                                "of one batch", ["run"], buckets=COMMIT_BUCKETS,
                                registry=self.registry).labels(run)
        self.busy = Histogram("rayorch_batch_seconds", "seconds a batch ran on its actor",
                              ["run", "module"], registry=self.registry)
        self.registry.register(_Collector(self))
        self._gpus = _Nvml.open()
        if self._gpus is not None:
            self.registry.register(self._gpus)
        self._server: Any = None

    # -- fed by the driver ---------------------------------------------------------------
    def batch(self, call: str, busy_s: float | None, commit_s: float | None, rss: int,
              actor: int | None) -> None:
        """A batch came back: its time on the actor, its commit's, its actor's RSS."""
        module = self.modules.get(call, call)
        if busy_s is not None:
            self.busy.labels(self.stats.run_id, module).observe(busy_s)
        if commit_s is not None:
            self.commit.observe(commit_s)
        if rss and actor is not None:
            with self._lock:
                self._rss[(module, actor)] = rss

    def failed(self, call: str, cause: str, count: int = 1) -> None:
        with self._lock:
            self._failures[(call, failure_kind(cause))] += count

    def pools(self, sizes: dict[str, tuple[int, int, int]], replaced: int) -> None:
        """The pools now: module -> (live, starting, draining), and actors replaced."""
        with self._lock:
            self._pools = dict(sizes)
            self._replaced = replaced

    def changed(self, module: str, recycle: bool) -> None:
        """A pool change was recorded: a resize, or a recycled actor (whose RSS gauge goes;
        its replacement reports its own after its first batch)."""
        with self._lock:
            self._pool_changes[(module, "recycle" if recycle else "resize")] += 1
            if recycle:
                self._rss = {k: v for k, v in self._rss.items() if k[0] != module}

    # -- the endpoint ----------------------------------------------------------------------
    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``host:port`` (0: a free port); the port."""
        from prometheus_client import start_http_server

        try:
            self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise MetricsError(f"cannot serve metrics on {host}:{port}: {exc}") from None
        return int(self._server.server_port)

    def close(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.shutdown()
            server.server_close()
        if self._gpus is not None:
            self._gpus.close()


class _Collector:
    """The driver's counters as Prometheus families, read at each scrape."""

    def __init__(self, metrics: DriverMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        m, stats = self.m, self.m.stats
        run = stats.run_id
        grains = CounterMetricFamily("rayorch_grains", "Grains sealed per Call, by outcome "
                                     "(a page, a region, a clip: rate() is its throughput)",
                                     labels=["run", "call", "outcome"])
        ready = GaugeMetricFamily("rayorch_queue_ready", "Grains ready, waiting for an actor",
                                  labels=["run", "call"])
        flight = GaugeMetricFamily("rayorch_in_flight", "Grains in batches on actors",
                                   labels=["run", "call"])
        retried = CounterMetricFamily("rayorch_retries", "attempts lost to crashes, timeouts "
                                      "and ActorFailure", labels=["run", "call"])
        tokens = CounterMetricFamily("rayorch_tokens", "model tokens read (in) and generated "
                                     "(out) per Call, as its engine counted them",
                                     labels=["run", "call", "direction"])
        payload = CounterMetricFamily("rayorch_payload_bytes", "bytes of a Call's values "
                                      "written to payload segments", labels=["run", "call"])
        for call, c in list(stats.calls.items()):
            for outcome, n in (("present", c.done), ("failed", c.failed),
                               ("rejected", c.rejected)):
                grains.add_metric([run, call, outcome], n)
            ready.add_metric([run, call], c.ready)
            flight.add_metric([run, call], c.in_flight)
            retried.add_metric([run, call], c.retried)
            if c.tokens_in or c.tokens_out:  # model stages only
                tokens.add_metric([run, call, "in"], c.tokens_in)
                tokens.add_metric([run, call, "out"], c.tokens_out)
            payload.add_metric([run, call], c.payload_bytes)
        sources = CounterMetricFamily("rayorch_sources", "sources admitted and done (rate() of "
                                      "done: documents/s)", labels=["run", "state"])
        sources.add_metric([run, "admitted"], stats.sources_admitted)
        sources.add_metric([run, "done"], stats.sources_done)
        batches = CounterMetricFamily("rayorch_batches", "batches sent", labels=["run"])
        batches.add_metric([run], stats.batches)
        with m._lock:
            failures, rss = dict(m._failures), dict(m._rss)
            pools, changes, replaced = dict(m._pools), dict(m._pool_changes), m._replaced
        failed = CounterMetricFamily("rayorch_failures", "failed Grains and lost batches by "
                                     "Call and cause kind", labels=["run", "call", "cause"])
        for (call, kind), n in sorted(failures.items()):
            failed.add_metric([run, call, kind], n)
        actors = GaugeMetricFamily("rayorch_pool_actors", "actors of each pool by state",
                                   labels=["run", "module", "state"])
        for module, sizes in sorted(pools.items()):
            for state, n in zip(("live", "starting", "draining"), sizes, strict=True):
                actors.add_metric([run, module, state], n)
        moved = CounterMetricFamily("rayorch_pool_changes", "pool resizes and recycled actors",
                                    labels=["run", "module", "kind"])
        for (module, kind), n in sorted(changes.items()):
            moved.add_metric([run, module, kind], n)
        lost = CounterMetricFamily("rayorch_actors_replaced", "actors replaced after a crash, "
                                   "a timeout or ActorFailure", labels=["run"])
        lost.add_metric([run], replaced)
        memory = GaugeMetricFamily("rayorch_actor_rss_bytes", "resident memory of each actor "
                                   "after its last batch", labels=["run", "module", "actor"])
        for (module, actor), size in sorted(rss.items()):
            memory.add_metric([run, module, str(actor)], size)
        yield from (grains, ready, flight, retried, tokens, payload, sources, batches, failed,
                    actors, moved, lost, memory)


class _Nvml:
    """GPU utilisation and memory through NVML, per GPU of this node."""

    def __init__(self, nvml: Any, count: int) -> None:
        self.nvml, self.count = nvml, count

    @classmethod
    def open(cls) -> _Nvml | None:
        """NVML when ``nvidia-ml-py`` is installed and a GPU answers; else None."""
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            count = int(pynvml.nvmlDeviceGetCount())
        except Exception:  # no library, no driver, no GPU: the gauges are absent
            return None
        return cls(pynvml, count) if count else None

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        util = GaugeMetricFamily("rayorch_gpu_utilization_ratio", "GPU busy share (NVML)",
                                 labels=["gpu"])
        used = GaugeMetricFamily("rayorch_gpu_memory_used_bytes", "GPU memory used (NVML)",
                                 labels=["gpu"])
        for i in range(self.count):
            try:
                handle = self.nvml.nvmlDeviceGetHandleByIndex(i)
                rates = self.nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception:  # a GPU that stops answering is left out of this scrape
                continue
            util.add_metric([str(i)], rates.gpu / 100.0)
            used.add_metric([str(i)], float(memory.used))
        yield from (util, used)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already shut down
            self.nvml.nvmlShutdown()


def add_metrics_options(parser: Any) -> None:
    """``--metrics-port`` and ``--metrics-host``, for every command that runs a driver."""
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve the run's Prometheus metrics at http://HOST:PORT/metrics "
                        "while it runs (0: a free port, said on stderr)")
    parser.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                        help="where --metrics-port listens (default 127.0.0.1; 0.0.0.0 for "
                        "a Prometheus on another machine)")


__all__ = ["DriverMetrics", "MetricsError", "add_metrics_options", "failure_kind"]
