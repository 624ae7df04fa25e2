"""The shell side of pool sizing: measure each pool, ask the policy, start and drain actors.

:class:`PoolSizer` belongs to one driver (:class:`~rayorch.runtime.shard_driver.ShardDriver`).
Each turn the driver hands it the shards' loads (``ShardMachine.load``, one query per shard);
every ``interval_s / 5`` it samples the pools (:meth:`~rayorch.runtime.ports.Pools.counts`)
to follow idle actors, and every ``interval_s`` (and at once on news: the run's first work
waiting, a pool's first measured cost) it asks the pure policy
(:func:`rayorch.core.pool_sizing.plan_sizes`) and performs its answer through the pools port
(``resize``: start actors, or drain them; a draining actor takes no new batch and leaves
once its batches are back). Each change is kept with its time and reason
(:attr:`PoolSizer.history`) and said on the driver's log; the run's summary names the stage
that bound it (docs/topics/POOL-SIZING.md, "Pools that size themselves").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rayorch.core.ids import CallId
from rayorch.core.machine import MachineLoad
from rayorch.core.plan import ModuleSpec, Plan
from rayorch.core.pool_sizing import SizingSettings, StageLoad, held_resources, plan_sizes
from rayorch.core.run_shares import merge_loads, tighter
from rayorch.runtime.ports import Completion, Ledger, PoolCounts, Pools
from rayorch.store.records.pool_log import PoolChange

COST_WEIGHT = 0.3
"""Weight of the newest batch in a pool's cost per Grain (an exponential average)."""


@dataclass
class _Watch:
    """What the sizer follows of one pool between decisions."""

    module: ModuleSpec
    cost_s: float | None = None  # actor-seconds per Grain, recent
    idle_since: float | None = None  # since when it has had no backlog and an idle actor
    spare: int = 0  # the fewest idle actors seen since then
    sizes: list[tuple[float, int]] = field(default_factory=list)  # (at_s, size) per change


class PoolSizer:
    """Sizes the pools of one driver's run; see the module docstring."""

    def __init__(self, plan: Plan, pools: Pools, settings: SizingSettings, *,
                 clock: Callable[[], float], log: Callable[[str], None],
                 budget: Mapping[str, float] | None = None, driver: str = "",
                 record: Callable[[Sequence[PoolChange]], None] | None = None,
                 ledger: Ledger | None = None) -> None:
        self.settings, self.budget = settings, budget
        self._ledger = ledger
        self.wants: dict[str, float] = {}  # what the run's work asks for (the ledger's claim)
        self.share: dict[str, float] | None = None  # the run's budget, as the ledger said
        self._runs = 1  # runs claiming the cluster at the last report
        self._known: set[str] = set()  # pools whose cost the last decision knew
        self._worked = False  # a decision saw work waiting
        self._driver, self._record = driver, record
        self._pools, self._clock, self._log = pools, clock, log
        self._module_of: dict[CallId, str] = {}
        self._calls: dict[str, list[CallId]] = {}
        self._watch: dict[str, _Watch] = {}
        for node in plan.calls:
            assert node.call is not None
            name = node.call.module
            self._module_of[node.call.id] = name
            self._calls.setdefault(name, []).append(node.call.id)
            if name not in self._watch:
                self._watch[name] = _Watch(plan.module(name))
        self._feeders = plan.feeders()  # each Call's nearest upstream Calls (plan order)
        self._done: dict[CallId, int] = dict.fromkeys(self._module_of, 0)  # Grains back
        self.started = clock()
        self._next_sample = self.started
        self._next_decision = self.started + settings.interval_s
        self.history: list[PoolChange] = []
        self.binding_s: dict[str, float] = {}  # seconds each stage was the binding one
        self._binding: tuple[str, float] | None = None  # (stage, since)
        self.decisions = 0
        self.decision_s = 0.0  # wall seconds spent in the policy

    # -- measuring ------------------------------------------------------------------------------
    def observe(self, done: Completion) -> None:
        """A batch came back: its run time updates its pool's cost per Grain."""
        if done.failure is None:
            self._done[done.call] += len(done.tags)
        if done.busy_s is None or done.failure is not None or not done.tags:
            return
        watch = self._watch[self._module_of[done.call]]
        cost = done.busy_s / len(done.tags) / watch.module.options.max_inflight
        watch.cost_s = cost if watch.cost_s is None else (
            COST_WEIGHT * cost + (1 - COST_WEIGHT) * watch.cost_s)

    def tick(self, loads: Callable[[], Sequence[MachineLoad]]) -> None:
        """Called every turn: sample the pools when due, decide when due (cheap otherwise)."""
        now = self._clock()
        if now < self._next_sample:
            return
        self._next_sample = now + self.settings.interval_s / 5
        held = loads()
        ready = {call: sum(load.ready[call] for load in held) for call in self._module_of}
        backlog = {name: sum(ready[call] for call in calls)
                   for name, calls in self._calls.items()}
        counts = self._pools.counts()
        for name, watch in self._watch.items():
            c = counts[name]
            if backlog[name] == 0 and c.idle > 0:
                if watch.idle_since is None:
                    watch.idle_since, watch.spare = now, c.idle
                watch.spare = min(watch.spare, c.idle)
            else:
                watch.idle_since, watch.spare = None, 0
        measured = {name for name, watch in self._watch.items() if watch.cost_s is not None}
        news = (measured - self._known) or (not self._worked and any(backlog.values()))
        if now >= self._next_decision or news:
            # Also at once when there is news: the run's first work (the unmeasured stages
            # get their even share now, not an interval later) and a stage's first cost.
            self._known |= measured
            self._worked = self._worked or any(backlog.values())
            self._next_decision = now + self.settings.interval_s
            self._decide(now, ready, counts)

    # -- deciding -------------------------------------------------------------------------------
    def coming(self, ready: Mapping[CallId, int], counts: Mapping[str, PoolCounts]
               ) -> dict[CallId, float]:
        """Grains each Call will get from the work waiting upstream of it: what its feeders
        hold (and will get) times the Grains it got so far per Grain they finished (one
        each until a feeder finished one: work is coming, how much is not known yet)."""
        held: dict[CallId, float] = {}
        coming: dict[CallId, float] = {}
        for call in self._module_of:  # plan order: feeders first
            module = self._module_of[call]
            alone = len(self._calls[module]) == 1  # its pool's in-flight Grains are its own
            in_flight = counts[module].in_flight if alone else 0
            seen = self._done[call] + ready[call] + in_flight
            coming[call] = sum(held[u] * (seen / self._done[u] if self._done[u] else 1.0)
                               for u in self._feeders[call])
            held[call] = ready[call] + in_flight + coming[call]
        return coming

    def _decide(self, now: float, ready: dict[CallId, int], counts: dict[str, PoolCounts]
                ) -> None:
        coming = self.coming(ready, counts)

        def loads(counts: dict[str, PoolCounts]) -> list[StageLoad]:
            return [self._stage(name, sum(ready[c] for c in calls),
                                sum(coming[c] for c in calls), counts[name], now)
                    for name, calls in self._calls.items()]

        stages = loads(counts)
        budget = self.budget
        if self._ledger is not None:
            reply = self._ledger.report(self.wants, stages)
            if reply is not None and reply.runs != self._runs:
                self._runs = reply.runs
                share = ", ".join(f"{key} {amount:g}"
                                  for key, amount in sorted(reply.budget.items()) if amount)
                self._log(f"rayorch: {reply.runs} run(s) share the cluster; this run's share: "
                          f"{share or 'none'}")
            if reply is not None:
                if not reply.leader:  # the run's leader sizes the pools its drivers share
                    self.wants, self.share = {}, reply.budget
                    return
                self.share = reply.budget
                budget = tighter(self.budget, reply.budget)
                counts = self._pools.counts()  # the live sets may have moved
                stages = [merge_loads([s, *(p for p in reply.peers if p.name == s.name)])
                          for s in loads(counts)]
        free = self._pools.free()
        started = time.perf_counter()
        decision = plan_sizes(stages, free, self.settings, budget=budget)
        if self._ledger is not None:
            self.wants = self._wants(stages)
        self.decision_s += time.perf_counter() - started
        self.decisions += 1
        self._bound_by(decision.binding, now)
        changed = []
        for change in decision.changes:
            watch = self._watch[change.stage]
            self._pools.resize(change.stage, change.after)
            watch.idle_since, watch.spare = None, 0
            record = PoolChange(now - self.started, change.stage, change.before, change.after,
                                change.reason, now, self._driver)
            watch.sizes.append((record.at_s, change.after))
            changed.append(record)
            self._log(f"rayorch: {record.line()}")
        self.history += changed
        if changed and self._record is not None:
            self._record(changed)

    def _wants(self, stages: Sequence[StageLoad]) -> dict[str, float]:
        """What the run's pools would hold with the cluster to themselves (its claim)."""
        assert self._ledger is not None
        held = held_resources(stages)
        alone = plan_sizes(stages, {k: v - held.get(k, 0.0)
                                    for k, v in self._ledger.capacity().items()}, self.settings)
        return held_resources(stages, alone.sizes)

    def _stage(self, name: str, backlog: int, coming: float, c: PoolCounts, now: float
               ) -> StageLoad:
        watch = self._watch[name]
        o = watch.module.options
        sizes_itself = o.sizes_itself and c.resizable
        low = o.replicas if sizes_itself else max(1, c.size)
        high = (o.max_replicas or o.replicas) if sizes_itself else max(1, c.size)
        if c.cap is not None:
            high = max(low, min(high, c.cap))
        return StageLoad(
            name=name, size=c.size, min_size=low, max_size=high, need=c.need,
            backlog=backlog, in_flight=c.in_flight, coming=coming, item_cost_s=watch.cost_s,
            batch_size=o.batch_size, holds_model=o.num_gpus > 0,
            idle_s=0.0 if watch.idle_since is None else now - watch.idle_since,
            spare=watch.spare, draining=c.draining, start_s=c.start_s)

    def _bound_by(self, stage: str | None, now: float) -> None:
        if self._binding is not None:
            previous, since = self._binding
            self.binding_s[previous] = self.binding_s.get(previous, 0.0) + now - since
        self._binding = None if stage is None else (stage, now)

    # -- reporting ------------------------------------------------------------------------------
    def binding(self) -> str | None:
        """The stage that bound the run: the one most often slowest to drain."""
        if self._binding is not None:
            self._bound_by(self._binding[0], self._clock())
        if not self.binding_s:
            return None
        return max(sorted(self.binding_s), key=self.binding_s.__getitem__)

    def size_over_time(self, module: str) -> list[tuple[float, int]]:
        """``(seconds into the run, size)`` at the start and after each change."""
        watch = self._watch[module]
        return [(0.0, watch.module.options.replicas), *watch.sizes]

    def summary(self) -> str:
        """One line for the end of the run: each pool's changes and the binding stage."""
        parts = []
        for name in self._watch:
            sizes = [size for _, size in self.size_over_time(name)]
            if len(sizes) > 1:
                parts.append(f"{name} {sizes[0]}->{max(sizes)}->{sizes[-1]} "
                             f"({len(sizes) - 1} changes)")
        binding = self.binding()
        total = sum(self.binding_s.values())
        bound = "" if binding is None else (
            f"; bound by {binding} ({100 * self.binding_s[binding] / total:.0f}% of the "
            "decisions' time)" if total else f"; bound by {binding}")
        cost = (f"; {self.decisions} decisions, {1e3 * self.decision_s / self.decisions:.2f} "
                "ms each" if self.decisions else "")
        return "pools: " + (", ".join(parts) or "no size changes") + bound + cost


__all__ = ["PoolChange", "PoolSizer"]
