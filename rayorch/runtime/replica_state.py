"""What one driver holds of a run: the state of each held shard, and its counters."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from rayorch.core.errors import NoProgressError
from rayorch.core.facts import Fact, GrainCommitted
from rayorch.core.ids import CallId, Path
from rayorch.core.machine import OutputReady, ShardMachine
from rayorch.core.vocabulary import CommitVerdict
from rayorch.store.layout import AppendBasis


@dataclass
class ShardState:
    """What this driver holds of one shard: its lease epoch, its machine, what is queued."""

    shard: int
    epoch: int
    machine: ShardMachine
    unsaved: list[Fact] = field(default_factory=list)  # facts to append (fenced), in order
    ready: list[OutputReady] = field(default_factory=list)  # outputs not yet given to the sink
    draining: bool = False
    wanted: int = 0  # the machine's ask for sources (WantSources), not yet answered
    resync: str | None = None  # the machine asked to be rebuilt from the store (why)
    renewed: float = field(default_factory=time.monotonic)  # last successful lease write
    # What the machine is built on, shown with each append (AppendBasis) so that a store
    # that went back refuses facts computed from what it forgot: the last seq read at the
    # rebuild, this driver's latest append since, the commits folded after that append.
    read_seq: int = 0
    appended_first: int = 0
    sealed: list[tuple[CallId, Path, int]] = field(default_factory=list)

    def basis(self) -> AppendBasis:
        return AppendBasis(self.read_seq, self.appended_first, tuple(self.sealed))

    def appended(self, seqs: Sequence[int]) -> None:
        """An append landed: it vouches for everything this driver knew before it."""
        if seqs:
            self.appended_first = seqs[0]
            self.sealed.clear()

    def folded(self, reports: Sequence[GrainCommitted], codes: Sequence[int]) -> None:
        """Reports the store accepted are folded into the machine."""
        self.sealed.extend((r.call, r.path, r.generation)
                           for r, code in zip(reports, codes) if code == CommitVerdict.ACCEPTED)


class HeldShards(dict[int, ShardState]):
    """The shards one driver holds (shard -> :class:`ShardState`) and the newest fact seq it
    knows of each: the one object its loop (``ShardDriver``) and its leases (``ShardLeases``)
    both read and change. A shard's seq outlives its state (a shard lost and taken again is
    checked against what this driver saw before: a store that went back is noticed)."""

    def __init__(self) -> None:
        super().__init__()
        self.seqs: dict[int, int] = {}

    def known_seq(self, k: int) -> int:
        """The newest seq of shard ``k``'s facts this driver knows (0: none)."""
        return self.seqs.get(k, 0)

    def read(self, k: int, last_seq: int) -> int:
        """Shard ``k`` was read up to ``last_seq``; the seq known before (a store that
        holds fewer facts than that went back)."""
        known = self.seqs.get(k, 0)
        self.seqs[k] = last_seq
        return known

    def appended(self, k: int, seqs: Sequence[int]) -> None:
        """This driver's append to shard ``k`` landed at ``seqs``."""
        if seqs:
            self.seqs[k] = max(self.seqs.get(k, 0), *seqs)

    def forget_seq(self, k: int) -> None:
        """Shard ``k``'s store went back: its seq is what the next read says."""
        self.seqs.pop(k, None)

    def stuck(self, run_id: str) -> None:
        """Nothing in flight and nothing moved: a stuck run is a bug, said so (naming the
        stuck Grains when a kernel can)."""
        for st in self.values():
            st.machine.kernel.check_progress()
        raise NoProgressError(
            "the run cannot progress: nothing is in flight, nothing is ready and no source "
            "can be admitted; this is a bug in rayorch, please report it with the run id "
            f"{run_id}")

    def release_all(self) -> dict[int, ShardState]:
        """Let go of every shard (a store outage: each is taken again); what was held."""
        held = dict(self)
        self.clear()
        return held


@dataclass
class ReplicaStats:
    """Counters of one driver (printed by ``rayorch driver``)."""

    driver_id: str
    shards_taken: int = 0
    shards_released: int = 0
    shards_lost: int = 0
    shards_finished: int = 0
    grains_rerun: int = 0  # re-dispatched because their driver died (failover)
    outputs_emitted: int = 0
    batches: int = 0
    store_outages: int = 0
    resyncs: int = 0  # shards rebuilt because the store knew better
    rollbacks: int = 0  # appends refused because the store went back (then rebuilt)
    take_seconds: list[float] = field(default_factory=list)

    def summary(self) -> str:
        took = max(self.take_seconds, default=0.0)
        return (f"driver {self.driver_id}: {self.outputs_emitted} outputs emitted, "
                f"{self.batches} batches, shards taken {self.shards_taken} / released "
                f"{self.shards_released} / lost {self.shards_lost} / finished "
                f"{self.shards_finished}, {self.grains_rerun} grains re-run after failover, "
                f"{self.store_outages} store outages, slowest takeover {took:.2f}s")


__all__ = ["HeldShards", "ReplicaStats", "ShardState"]
