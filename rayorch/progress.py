"""Live progress of a run: one row per Call (ready / in flight / done / failed / suppressed).

Drawn with ``rich`` on a terminal; off with ``progress=False`` and whenever stdout is
not a TTY (unless ``progress=True`` forces it).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

from rayorch.core.ids import CallId


@dataclass(slots=True)
class CallStats:
    """Counters of one Call, kept by the driver."""

    ready: int = 0
    in_flight: int = 0
    done: int = 0
    failed: int = 0
    suppressed: int = 0
    retried: int = 0  # attempts lost to physical failures (crashes, timeouts, ActorFailure)
    uncharged: int = 0  # of those, retries not charged: a crash split (core/crash_split.py)
    rejected: int = 0
    tokens_in: int = 0  # model tokens read (prompts), as the module's engine counted them
    tokens_out: int = 0  # model tokens generated
    payload_bytes: int = 0  # bytes of its values written to payload segments
    first_done: float | None = None
    last_done: float | None = None

    def record_done(self, count: int, now: float) -> None:
        self.done += count
        if self.first_done is None:
            self.first_done = now
        self.last_done = now

    def throughput(self, started: float) -> float:
        """Sealed Grains per second since the run started."""
        if self.last_done is None:
            return 0.0
        return (self.done + self.failed) / max(self.last_done - started, 1e-9)


@dataclass(slots=True)
class RunStats:
    """Counters of a whole run, one :class:`CallStats` per Call, in plan order."""

    run_id: str
    calls: dict[CallId, CallStats] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    sources_admitted: int = 0
    sources_done: int = 0
    sources_total: int | None = None
    batches: int = 0
    actors_replaced: int = 0
    actors_recycled: int = 0  # past max_rss / max_batches (not failures)

    def call(self, call_id: CallId) -> CallStats:
        stats = self.calls.get(call_id)
        if stats is None:
            stats = self.calls[call_id] = CallStats()
        return stats


class LiveProgress:
    """A ``rich`` live table refreshed at most ``refresh_per_second`` times a second."""

    def __init__(self, refresh_per_second: float = 4.0) -> None:
        from rich.console import Console
        from rich.live import Live

        self._console = Console()
        self._live = Live(console=self._console, auto_refresh=False, transient=False)
        self._interval = 1.0 / refresh_per_second
        self._last = 0.0

    def start(self) -> None:
        self._live.start()

    def update(self, stats: RunStats, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self._interval:
            return
        self._last = now
        self._live.update(render_table(stats), refresh=True)

    def stop(self, stats: RunStats) -> None:
        self.update(stats, force=True)
        self._live.stop()


def render_table(stats: RunStats) -> Any:
    """The progress table of ``stats`` as a ``rich`` renderable."""
    from rich.table import Table

    elapsed = time.monotonic() - stats.started
    total = "?" if stats.sources_total is None else str(stats.sources_total)
    table = Table(
        title=f"rayorch run {stats.run_id}  sources {stats.sources_done}/{total} "
        f"(admitted {stats.sources_admitted})  {elapsed:.1f}s",
        title_justify="left",
    )
    for column in ("call", "ready", "in flight", "done", "failed", "suppressed", "retried", "/s"):
        table.add_column(column, justify="left" if column == "call" else "right")
    for call_id, c in stats.calls.items():
        table.add_row(
            call_id, str(c.ready), str(c.in_flight), str(c.done), str(c.failed),
            str(c.suppressed), str(c.retried), f"{c.throughput(stats.started):.1f}",
        )
    return table


def make_progress(progress: bool | None) -> LiveProgress | None:
    """``None``: on when stdout is a terminal; ``True``: on; ``False``: off."""
    if progress is False:
        return None
    if progress is None and not sys.stdout.isatty():
        return None
    return LiveProgress()
