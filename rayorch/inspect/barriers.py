"""What each GroupFailure barrier did, read from a run's facts.

For every ``BarrierInstalled(call, parent)`` the other siblings of ``call`` under
``parent`` fall into: committed before the barrier (kept), in flight when it was
installed (their reports are rejected), and not yet dispatched. The design promises
that every sibling not yet dispatched at the barrier is suppressed before dispatch
(never reaches the UDF); :func:`barrier_effects` measures it from the facts.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass

from rayorch.core.facts import Fact
from rayorch.core.ids import CallId, DomainId, Path
from rayorch.core.run_view import ShardView, fold_shard, numbered
from rayorch.core.vocabulary import REPORT_GROUP_FAILURE
from rayorch.store.base import LineageStore


@dataclass(frozen=True, slots=True)
class BarrierEffect:
    """The siblings of one barrier (the failing Grain excluded), by their state at the barrier."""

    call: CallId
    parent: Path
    siblings: int
    committed_before: int
    in_flight_at_barrier: int
    undispatched_at_barrier: int
    dispatched_after_barrier: int  # must be 0: a barrier suppresses before dispatch

    @property
    def suppressed_before_dispatch(self) -> int:
        return self.undispatched_at_barrier - self.dispatched_after_barrier


def barrier_effects(facts: Iterable[Fact], call_domain: dict[CallId, DomainId]
                    ) -> list[BarrierEffect]:
    """Per barrier, how its siblings stood when it was installed.

    ``facts`` must be one shard's facts in their total order (``LineageStore.iter_facts``);
    ``call_domain`` maps each Call to its Domain (from the run's plan).
    """
    return effects_of(fold_shard(0, numbered(facts)), call_domain)


def effects_of(view: ShardView, call_domain: dict[CallId, DomainId]) -> list[BarrierEffect]:
    """:func:`barrier_effects` from a shard's view."""
    # The GroupFailure that installed a barrier is the last one committed before it.
    group_failures = sorted((seq, grain.key) for grain in view.grains.values()
                            for seq, c in grain.committed if c.outcome == REPORT_GROUP_FAILURE)
    effects = []
    for pos, barrier in view.barriers:
        before = bisect_left(group_failures, (pos,))
        trigger = group_failures[before - 1][1] if before else None
        closes = view.expansions.get((call_domain.get(barrier.call, ""), barrier.parent))
        total = closes[-1][1].count if closes else 0
        committed = in_flight = undispatched = later = 0
        for ordinal in range(total):
            key = (barrier.call, (*barrier.parent, ordinal))
            if key == trigger:
                continue
            grain = view.grains.get(key)
            dispatched = None if grain is None else grain.first_dispatch
            sealed = None if grain is None else grain.sealed_at
            if sealed is not None and sealed < pos:
                committed += 1
            elif dispatched is not None and dispatched < pos:
                in_flight += 1
            else:
                undispatched += 1
                later += dispatched is not None
        effects.append(BarrierEffect(
            barrier.call, barrier.parent, committed + in_flight + undispatched,
            committed, in_flight, undispatched, later,
        ))
    return effects


def load_barrier_effects(store: LineageStore, run_id: str) -> list[BarrierEffect]:
    """:func:`barrier_effects` over every shard of a stored run."""
    view = store.read_view(run_id)
    call_domain = view.call_domain
    return [effect for k in sorted(view.shards) for effect in effects_of(view.shards[k],
                                                                           call_domain)]
