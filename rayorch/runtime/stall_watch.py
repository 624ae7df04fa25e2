"""Stalls made visible: a batch running far longer than its module's recent batches is said.

A UDF that hangs (a deadlocked library, a request with no timeout) without ``timeout_s``
on its module would otherwise run forever in silence. The driver asks :class:`StallWatch`
on every turn; a running batch is *stalled* once it has run longer than

    max($RAYORCH_STALL_WARN_S (default 60 s), 10 x the longest of the module's last 32 batches)

and one stderr line names the module, the batch and how long it has run; the same batch is
said again each time that time doubles. Nothing is killed: ``timeout_s=S`` on the module
replaces an actor whose batch runs past ``S`` (docs/topics/ACTORS.md, "Runtime details").
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from rayorch.actors.pool import seconds_setting

STALL_WARN_ENV = "RAYORCH_STALL_WARN_S"
STALL_WARN_S = 60.0
"""The shortest run that is ever said (a module's first batches have no history)."""
STALL_FACTOR = 10.0
RECENT_BATCHES = 32


def stall_floor_s() -> float:
    """``$RAYORCH_STALL_WARN_S`` seconds (``0`` turns the lines off), or 60."""
    return seconds_setting(STALL_WARN_ENV, STALL_WARN_S, zero="0 turns stall lines off")


class StallWatch:
    """Remembers how long each module's batches take and says the ones that run far longer.

    ``pools`` are :class:`~rayorch.actors.pool.ActorPool` objects (their slots' queued
    batches carry ``started``); times are ``time.monotonic()`` readings passed in.
    """

    def __init__(self, log: Callable[[str], None], floor_s: float | None = None) -> None:
        self._log = log
        self.floor_s = stall_floor_s() if floor_s is None else floor_s
        self._recent: dict[str, deque[float]] = {}
        self._next_say: dict[int, float] = {}  # batch id -> run time at which to say it

    def finished(self, module: str, batch: Any, now: float | None = None) -> None:
        """``batch`` of ``module`` ended (well or not): its run time joins the history."""
        self._next_say.pop(batch.task.batch_id, None)
        now = time.monotonic() if now is None else now
        if batch.started is not None:
            recent = self._recent.setdefault(module, deque(maxlen=RECENT_BATCHES))
            recent.append(now - batch.started)

    def limit_s(self, module: str) -> float:
        """How long a batch of ``module`` may run before it is said."""
        recent = self._recent.get(module)
        return max(self.floor_s, STALL_FACTOR * max(recent)) if recent else self.floor_s

    def check(self, pools: Iterable[Any], now: float) -> None:
        """Say every running batch that is past its module's limit (or its doubled time)."""
        if self.floor_s <= 0:
            return
        for pool in pools:
            module = pool.module.name
            timeout = pool.module.options.timeout_s
            limit = self.limit_s(module)
            if timeout is not None and timeout <= limit:
                continue  # timeout_s replaces the actor first
            for slot in pool.slots:
                for batch in slot.queue:
                    if batch.started is None:
                        continue
                    ran = now - batch.started
                    key = batch.task.batch_id
                    if ran <= self._next_say.get(key, limit):
                        continue
                    self._next_say[key] = 2 * ran
                    self._log(self._line(module, batch, ran, limit))

    def _line(self, module: str, batch: Any, ran: float, limit: float) -> str:
        recent = self._recent.get(module)
        usual = (f"its last {len(recent)} batches took at most {max(recent):.1f}s"
                 if recent else "no batch of it has finished yet")
        return (f"rayorch: batch {batch.task.batch_id} of module {module!r} "
                f"({len(batch.task.tags)} records, actor {batch.slot.index}) has run "
                f"{ran:.0f}s ({usual}); it may hang: set timeout_s on the module to replace "
                f"a stuck actor, or {STALL_WARN_ENV} to change when this is said "
                f"(now after {limit:.0f}s)")


__all__ = ["STALL_WARN_ENV", "StallWatch", "stall_floor_s"]
