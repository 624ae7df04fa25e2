"""One cluster, several runs, several drivers: each run's share, one load per shared pool.

Pure (no clock, no I/O): the pool ledger (:mod:`rayorch.runtime.pool_ledger`) feeds it
what the drivers reported and performs its answer (docs/topics/POOL-SIZING.md, "Pools that size
themselves").

* :func:`fair_shares` divides the cluster among the runs that claim it, max-min fair per
  resource (water-filling): a run that wants less than an even share gets what it wants,
  the others split the rest evenly, and what nobody wants is split evenly too (a share is
  a cap, not an allocation: a run grows only into what is free). So a run that arrives
  while another holds the cluster gets at least an even share: the other gives back
  (its policy's budget step drains actors) and is never starved either.
* :func:`merge_loads` makes one :class:`StageLoad` of a pool that several drivers of a run
  share, from what each measured: their backlogs and coming work add up; the actors, their
  state and the limits are the pool's.
* :func:`leader`: the driver that sizes a run's shared pools (the other drivers follow
  the sizes it publishes); it stays the leader while it reports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rayorch.core.pool_sizing import Resources, SizingError, StageLoad

_EPS = 1e-9


def fair_shares(capacity: Resources, wants: Mapping[str, Resources]) -> dict[str, dict[str, float]]:
    """Each claimant's share of ``capacity``: max-min fair per resource (see the module
    docstring). A resource a claimant does not name it does not want; the shares of a
    resource add up to its capacity whenever anyone claims."""
    if not wants:
        return {}
    for who, claim in wants.items():
        if any(not amount >= 0 for amount in claim.values()):
            raise SizingError(f"claim of {who!r}: negative or NaN amounts {dict(claim)}")
    shares: dict[str, dict[str, float]] = {who: {} for who in wants}
    for key, total in capacity.items():
        left = max(0.0, float(total))
        asks = {who: min(left, claim.get(key, 0.0)) for who, claim in wants.items()}
        given = _water_fill(left, asks)
        spare = left - sum(given.values())
        for who in sorted(wants):
            shares[who][key] = given[who] + spare / len(wants)
    return shares


def _water_fill(total: float, asks: Mapping[str, float]) -> dict[str, float]:
    """Max-min fair division of ``total`` among ``asks``: smallest asks are met first."""
    given: dict[str, float] = {}
    left, waiting = total, sorted(asks, key=lambda who: (asks[who], who))
    while waiting:
        level = left / len(waiting)
        who = waiting[0]
        if asks[who] <= level + _EPS:
            given[who] = asks[who]
            left -= asks[who]
            waiting.pop(0)
            continue
        for rest in waiting:
            given[rest] = level
        break
    return given


def merge_loads(loads: Sequence[StageLoad]) -> StageLoad:
    """One pool's load from what its drivers measured (``loads[0]`` is the sizing
    driver's, whose view of the pool's actors is taken): Grains add up; the cost per
    Grain is the one measured on the most Grains' worth of recent work."""
    if not loads:
        raise SizingError("merge_loads needs at least one driver's load")
    first = loads[0]
    if any(load.name != first.name for load in loads):
        raise SizingError(f"merge_loads: loads of different pools {[s.name for s in loads]}")
    costs = [s for s in loads if s.item_cost_s is not None]
    cost = max(costs, key=lambda s: s.backlog + s.in_flight + s.coming).item_cost_s if costs \
        else None
    idle_s = min(s.idle_s for s in loads)  # idle only while every driver saw it idle
    return StageLoad(
        name=first.name, size=first.size, min_size=first.min_size, max_size=first.max_size,
        need=first.need, backlog=sum(s.backlog for s in loads),
        in_flight=sum(s.in_flight for s in loads), coming=sum(s.coming for s in loads),
        item_cost_s=cost, batch_size=first.batch_size, holds_model=first.holds_model,
        idle_s=idle_s, spare=min(s.spare for s in loads) if idle_s > 0 else 0,
        draining=first.draining, start_s=first.start_s)


def tighter(first: Resources | None, second: Resources | None) -> dict[str, float] | None:
    """The smaller of two budgets, resource by resource (None: no cap)."""
    if first is None or second is None:
        return None if first is None and second is None else dict(first or second or {})
    return {key: min(first.get(key, float("inf")), second.get(key, float("inf")))
            for key in {*first, *second}}


def leader(drivers: Sequence[str], current: str | None = None) -> str | None:
    """The driver that sizes a run's shared pools: the one that does while it is live (no
    hand-over when another driver joins), else the smallest id among the live ones."""
    if current is not None and current in drivers:
        return current
    return min(drivers) if drivers else None


__all__ = ["fair_shares", "leader", "merge_loads", "tighter"]
