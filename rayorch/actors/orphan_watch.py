"""Shared pool actors leave when no driver of their run is alive (docs/ARCHITECTURE.md).

A shared pool's actors are named and detached: they outlive the driver that started
them, so that other drivers of the run keep using them. When every driver is gone
(SIGKILL, a lost machine) nobody would ever kill them, and they would hold their CPUs
and GPUs for good. So each shared actor runs a daemon thread that reads the run's
driver registry (heartbeats, in server time) every ``CHECK_EVERY_S``; once no driver
has been alive for ``grace_s``, the actor's process exits and Ray frees its resources.
Before it has seen any driver alive (its pool is being built) it waits ``STARTUP_S``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

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
    """Decides, from successive looks at the registry, when the actor is orphaned (pure)."""

    def __init__(self, grace_s: float, startup_s: float = STARTUP_S, now: float = 0.0) -> None:
        self.grace_s, self.startup_s = grace_s, startup_s
        self.started = now
        self.seen_driver = False
        self.absent_since: float | None = None

    def orphaned(self, live_drivers: int, now: float) -> bool:
        if live_drivers:
            self.seen_driver, self.absent_since = True, None
            return False
        if self.absent_since is None:
            self.absent_since = now
        if not self.seen_driver and now - self.started < self.startup_s:
            return False
        return now - self.absent_since >= self.grace_s


def start_orphan_watch(store_url: str, run_id: str, grace_s: float,
                       exit_process: Callable[[], None] | None = None) -> threading.Thread:
    """Start the daemon thread of one shared actor; it ends the process when orphaned."""

    def leave() -> None:
        print(f"rayorch actor {os.getpid()}: no driver of run {run_id} is alive; leaving",
              file=sys.stderr, flush=True)
        os._exit(0)

    def loop() -> None:
        from rayorch.store.base import open_store

        store = open_store(store_url)
        watch = OrphanWatch(grace_s, now=time.monotonic())
        while True:
            time.sleep(CHECK_EVERY_S)
            try:
                live = len(store.live_drivers(run_id))
            except Exception:  # store outage: not evidence that the drivers are gone
                continue
            if watch.orphaned(live, time.monotonic()):
                (exit_process or leave)()
                return

    thread = threading.Thread(target=loop, name="rayorch-orphan-watch", daemon=True)
    thread.start()
    return thread


__all__ = ["GRACE_ENV", "OrphanWatch", "orphan_grace_s", "start_orphan_watch"]
