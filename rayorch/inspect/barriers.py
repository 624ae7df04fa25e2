"""What each GroupFailure barrier did, read from a run's facts.

For every ``BarrierInstalled(call, parent)`` the other siblings of ``call`` under
``parent`` fall into: committed before the barrier (kept), in flight when it was
installed (their reports are rejected), and not yet dispatched. The design promises
that every sibling not yet dispatched at the barrier is suppressed before dispatch
(never reaches the UDF); :func:`barrier_effects` measures it from the facts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rayorch.core.facts import (
    REPORT_GROUP_FAILURE,
    BarrierInstalled,
    ExpansionClosed,
    Fact,
    GrainCommitted,
    GrainDispatched,
    GrainFailed,
)
from rayorch.core.ids import CallId, DomainId, Path
from rayorch.store.base import LineageStore
from rayorch.store.layout import RunLayout

GrainKey = tuple[CallId, Path]


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
    first_dispatch: dict[GrainKey, int] = {}
    sealed_at: dict[GrainKey, int] = {}
    children: dict[tuple[DomainId, Path], int] = {}
    barriers: list[tuple[int, BarrierInstalled, GrainKey | None]] = []
    last_group_failure: GrainKey | None = None
    for pos, fact in enumerate(facts):
        if isinstance(fact, GrainDispatched):
            first_dispatch.setdefault((fact.call, fact.path), pos)
        elif isinstance(fact, GrainCommitted):
            sealed_at.setdefault((fact.call, fact.path), pos)
            if fact.outcome == REPORT_GROUP_FAILURE:
                last_group_failure = (fact.call, fact.path)
        elif isinstance(fact, GrainFailed):
            sealed_at.setdefault((fact.call, fact.path), pos)
        elif isinstance(fact, ExpansionClosed):
            children[(fact.domain, fact.parent)] = fact.count
        elif isinstance(fact, BarrierInstalled):
            barriers.append((pos, fact, last_group_failure))
    effects = []
    for pos, barrier, trigger in barriers:
        total = children.get((call_domain.get(barrier.call, ""), barrier.parent), 0)
        committed = in_flight = undispatched = later = 0
        for ordinal in range(total):
            grain = (barrier.call, (*barrier.parent, ordinal))
            if grain == trigger:
                continue
            dispatched, sealed = first_dispatch.get(grain), sealed_at.get(grain)
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
    info = store.run_info(run_id)
    call_domain = RunLayout(info).call_domain
    effects: list[BarrierEffect] = []
    for shard in range(info.shards):
        facts = (stored.fact for stored in store.iter_facts(run_id, shard))
        effects.extend(barrier_effects(facts, call_domain))
    return effects
