"""A pool the drivers of one run share follows the run's *live set* of actor indexes.

The actors of a shared pool are named ``<run prefix>:<module>:<index>`` and found by name
(``get_if_exists``), so every driver that starts index ``i`` gets the same actor. The run's
leader decides the pool's size and the pool ledger turns it into a live set
(:mod:`rayorch.runtime.pool_ledger`); each driver adopts it here: it starts the indexes it
lacks and drains the ones no longer live (takes no new batch on them and lets go of them
once its own batches are back, never killing them: another driver may still have batches
there). The leader kills a dropped actor once every driver has let go of it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import ray

from rayorch.actors.pool import SHARED_NAMESPACE, ActorPool


def adopt_live(pool: ActorPool, live: Sequence[int]) -> None:
    """Make ``pool`` (this driver's view of a shared pool) follow the live set ``live``."""
    if not live:  # the ledger knows no set for it yet
        return
    wanted = set(live)
    have = {slot.index for slot in pool.slots}
    missing = sorted(wanted - have)
    if missing:
        pool._grow(len(missing), missing)
    for slot in pool.live_slots():
        if slot.index not in wanted:
            slot.draining = True
    pool.retire()


def kill_by_name(pool: ActorPool, indexes: Sequence[int]) -> None:
    """Kill actors of the shared pool by their names (whichever driver started them)."""
    for index in indexes:
        with contextlib.suppress(ValueError):  # gone already
            handle = ray.get_actor(pool.shared_name(index), namespace=SHARED_NAMESPACE)
            ray.kill(handle, no_restart=True)


def kill_shared(pool: ActorPool) -> None:
    """Kill the run's shared actors this driver knows (the driver that sees the run done)."""
    kill_by_name(pool, [slot.index for slot in pool.slots])
    for slot in pool.slots:
        slot.queue.clear()


def held_indexes(pool: ActorPool) -> list[int]:
    """The indexes whose actors this driver still has (live, or draining with batches)."""
    return sorted(slot.index for slot in pool.slots)


__all__ = ["adopt_live", "held_indexes", "kill_by_name", "kill_shared"]
