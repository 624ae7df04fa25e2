"""What one driver replica holds of a run: the state of each held shard, and its counters."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rayorch.core.facts import Fact
from rayorch.core.state import Kernel


@dataclass
class ShardState:
    """What this driver holds of one shard."""

    shard: int
    epoch: int
    kernel: Kernel
    to_admit: deque[int]
    total: int
    cursor: int = 0  # last seq folded by a catch-up read
    emitted: int = 0
    unsaved: list[Fact] = field(default_factory=list)
    draining: bool = False
    in_flight: int = 0  # batches of this driver that carry Grains of the shard


@dataclass
class ReplicaStats:
    """Counters of one driver replica (printed by ``rayorch driver``)."""

    driver_id: str
    shards_taken: int = 0
    shards_released: int = 0
    shards_lost: int = 0
    shards_finished: int = 0
    grains_rerun: int = 0  # re-dispatched because their driver died (failover)
    outputs_emitted: int = 0
    batches: int = 0
    store_outages: int = 0
    take_seconds: list[float] = field(default_factory=list)

    def summary(self) -> str:
        took = max(self.take_seconds, default=0.0)
        return (f"driver {self.driver_id}: {self.outputs_emitted} outputs emitted, "
                f"{self.batches} batches, shards taken {self.shards_taken} / released "
                f"{self.shards_released} / lost {self.shards_lost} / finished "
                f"{self.shards_finished}, {self.grains_rerun} grains re-run after failover, "
                f"{self.store_outages} store outages, slowest takeover {took:.2f}s")


__all__ = ["ReplicaStats", "ShardState"]
