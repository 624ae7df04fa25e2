"""Shared pool actors leave when no driver of their run is alive (docs/topics/FAILOVER.md).

A shared pool's actors are named and detached: they outlive the driver that started
them, so that other drivers of the run keep using them. When every driver is gone
(SIGKILL, a lost machine) nobody would ever kill them, and they would hold their CPUs
and GPUs for good. So each shared actor runs a daemon thread that reads the run's
driver registry (heartbeats, in server time) every ``CHECK_EVERY_S``; once no driver
has been alive for ``grace_s``, the actor's process exits and Ray frees its resources.
Until some driver was alive after the actor started (its pool is still being built,
before the driver's first heartbeat) it waits up to ``STARTUP_S``; an actor started mid-run
(a self-sizing pool grew, a driver adopted its run's live set, a crashed one was replaced)
knows a driver was alive and leaves ``grace_s`` after the last heartbeat deadline, even if
that driver died while the actor started.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable

GRACE_ENV = "RAYORCH_ORPHAN_GRACE_S"
DEFAULT_GRACE_S = 10.0
CHECK_EVERY_S = 2.0
STARTUP_S = 120.0


def orphan_grace_s() -> float:
    """``$RAYORCH_ORPHAN_GRACE_S`` (read by the driver that builds the pool), else 10 s."""
    raw = os.environ.get(GRACE_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_GRACE_S
    except ValueError:
        value = DEFAULT_GRACE_S
    return max(0.5, value)


class OrphanWatch:
    """Decides, from successive looks at the driver registry, when the actor is orphaned.

    Pure (no clock, no store): it is fed the store's time and the registry's heartbeat
    deadlines. A driver counts as *seen* once a heartbeat deadline lies after the
    watch's first look, i.e. a driver was alive after this actor started, even if the
    watch never sampled it alive.
    """

    def __init__(self, grace_s: float, startup_s: float = STARTUP_S,
                 driver_seen: bool = False) -> None:
        self.grace_s, self.startup_s = grace_s, startup_s
        self.started: float | None = None
        self.seen_driver = driver_seen  # started mid-run: a driver was alive then
        self.absent_since: float | None = None

    def orphaned(self, now: float, deadlines: Iterable[float]) -> bool:
        if self.started is None:
            self.started = now
        deadlines = list(deadlines)
        if any(d > self.started for d in deadlines):
            self.seen_driver = True
        if any(d > now for d in deadlines):
            self.absent_since = None
            return False
        if self.absent_since is None:
            self.absent_since = now
        if not self.seen_driver:
            return now - self.started >= self.startup_s
        # Gone since the last heartbeat deadline (a driver that left cleanly removed its
        # entry: then since the first look that found nobody).
        gone = max(deadlines) if deadlines else self.absent_since
        return now - gone >= self.grace_s


def start_orphan_watch(store_url: str, run_id: str, grace_s: float,
                       exit_process: Callable[[], None] | None = None, *,
                       driver_seen: bool = False) -> threading.Thread:
    """Start the daemon thread of one shared actor; it ends the process when orphaned."""

    def leave() -> None:
        print(f"rayorch actor {os.getpid()}: no driver of run {run_id} is alive; leaving",
              file=sys.stderr, flush=True)
        os._exit(0)

    def loop() -> None:
        from rayorch.store.registry import open_store

        store = open_store(store_url)
        watch = OrphanWatch(grace_s, driver_seen=driver_seen)
        while True:
            try:
                now, drivers = store.driver_registry(run_id)
            except Exception:  # store outage: not evidence that the drivers are gone
                now, drivers = None, {}
            if now is not None and watch.orphaned(now, drivers.values()):
                (exit_process or leave)()
                return
            time.sleep(CHECK_EVERY_S)

    thread = threading.Thread(target=loop, name="rayorch-orphan-watch", daemon=True)
    thread.start()
    return thread


__all__ = ["GRACE_ENV", "OrphanWatch", "orphan_grace_s", "start_orphan_watch"]
