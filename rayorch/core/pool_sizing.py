"""How many actors each pool should have: a pure policy, stage loads in, target sizes out.

The shell (:mod:`rayorch.runtime.pool_sizer`) measures each pool (:class:`StageLoad`),
asks :func:`plan_sizes` every few seconds, and only starts or drains actors
(docs/topics/POOL-SIZING.md, "Pools that size themselves"). No I/O, no clock: every time
here is a number the shell measured.

One quantity orders the stages: a stage's *drain time*, the work it holds (ready, in-flight
and coming Grains times its own recent cost per Grain, in actor-seconds) divided by its
actors. *Coming* Grains are those that work waiting upstream will make for it: without them
the first stage of a pipeline whose admission is bounded always looks the most pressed
(every admitted source waits there), and with them the split tends to the stages' work per
source. One decision, in order:

1. bounds: a size outside ``[min, max]`` is brought inside;
2. budget: a run holding more than its share gives back actors, least pressed stage first;
3. idle: a stage with no backlog whose ``spare`` actors had nothing to do for its idle limit
   loses them (a model-holding stage, or one whose actors are slow to start, waits longer);
   a stage with work whose cost is not measured yet gets an even share of the resources it
   needs (kept for it while it does not fit, and not shed while work is on its way), so
   its actors start before its first batches come;
4. growth: free resources go, one actor at a time, to the backed-up stage whose drain time
   per unit of resource is largest; a stage is backed up when ready Grains wait and its work
   needs more actors than it has to finish within ``backlog_s`` (or one batch, if longer);
5. contention: when a backed-up stage cannot fit another actor, a stage whose drain time,
   even one actor smaller, is ``hysteresis`` times shorter gives one up (it drains first);
   again, judged with the actors already promised, while the stage still wants more.

Growth never uses more than the free resources (nor the budget), and step 5 frees
resources only through drains, so the stage gets them at a later decision. Under a
steady load the sorted vector of drain times per unit only ever falls, so the sizes
settle, and the hysteresis factor keeps a move from being undone (tests/unit/
test_pool_sizing.py checks bounds, resources, convergence and no oscillation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rayorch.core.errors import RayorchError

AUTO_MAX_REPLICAS = 1024
"""The ``max`` of ``replicas="auto"``: in practice the cluster's free resources bound it."""

Resources = Mapping[str, float]
_EPS = 1e-9


class SizingError(RayorchError):
    """A stage's load or the settings given to the sizing policy do not make sense."""


@dataclass(frozen=True, slots=True)
class StageLoad:
    """What the shell measured of one pool (one module) at one decision."""

    name: str
    size: int
    """Actors that take batches: up or starting, not draining."""
    min_size: int
    max_size: int
    need: Resources
    """What one actor holds (``{"CPU": 1.0, "GPU": 1.0}``)."""
    backlog: int = 0
    """Ready Grains of the pool's Calls, waiting for an actor."""
    in_flight: int = 0
    """Grains on its actors now."""
    coming: float = 0.0
    """Grains that work waiting upstream will make for it (estimated by the shell from the
    fan-out seen so far): a stage fed by a backed-up one sees the work before it arrives."""
    item_cost_s: float | None = None
    """Recent actor-seconds per Grain; None until a batch has finished."""
    batch_size: int = 1
    holds_model: bool = False
    """Its actors build an engine (a GPU module): kept warm longer."""
    idle_s: float = 0.0
    """How long it has had no backlog and an actor with nothing to do."""
    spare: int = 0
    """The fewest actors with nothing to do during those ``idle_s`` seconds."""
    draining: int = 0
    """Actors told to finish their batches and leave: they still hold their resources."""
    start_s: float | None = None
    """How long its actors took to start (measured; None: not known)."""

    @property
    def load_s(self) -> float:
        """Actor-seconds of work the stage holds (0 while its cost is unknown)."""
        if self.item_cost_s is None:
            return 0.0
        return (self.backlog + self.in_flight + self.coming) * self.item_cost_s

    @property
    def batch_s(self) -> float:
        """Actor-seconds of one full batch."""
        return (self.item_cost_s or 0.0) * self.batch_size


@dataclass(frozen=True, slots=True)
class SizingSettings:
    """The policy's knobs (defaults suit a Ray cluster; the simulator scales them)."""

    interval_s: float = 5.0
    """How often the shell asks (the policy itself is stateless)."""
    backlog_s: float = 10.0
    """A stage is backed up when its work needs more actors to finish within this long."""
    idle_limit_s: float = 30.0
    """How long a spare actor stays."""
    model_idle_limit_s: float = 300.0
    """How long a spare actor of a model-holding stage stays."""
    start_cost_factor: float = 10.0
    """A spare actor stays at least this many times its measured start-up time."""
    hysteresis: float = 2.0
    """A stage gives an actor to another only if its drain time, one actor smaller, is this
    many times shorter than the other's: a move is never undone under the same load."""

    def __post_init__(self) -> None:
        if not (self.interval_s > 0 and self.backlog_s > 0 and self.idle_limit_s >= 0
                and self.model_idle_limit_s >= 0 and self.start_cost_factor >= 0):
            raise SizingError(f"sizing settings must be positive: {self}")
        if not self.hysteresis >= 1.0:
            raise SizingError(f"hysteresis={self.hysteresis}: it must be >= 1 (1: none)")


DEFAULT_SIZING = SizingSettings()


@dataclass(frozen=True, slots=True)
class Resize:
    """One stage's size changed at a decision, and why."""

    stage: str
    before: int
    after: int
    reason: str


@dataclass(frozen=True, slots=True)
class SizingDecision:
    """The target size of every stage, the changes (with reasons) and the binding stage."""

    sizes: Mapping[str, int]
    changes: tuple[Resize, ...] = ()
    binding: str | None = None
    """The stage whose work takes longest to drain with its actors (None: no work)."""
    pressure: Mapping[str, float] = field(default_factory=dict)
    """Each stage's drain time at its target size, in seconds."""


def idle_limit_s(stage: StageLoad, settings: SizingSettings) -> float:
    """How long ``stage``'s spare actors may stay idle before they go."""
    limit = settings.model_idle_limit_s if stage.holds_model else settings.idle_limit_s
    if stage.start_s is not None:
        limit = max(limit, settings.start_cost_factor * stage.start_s)
    return limit


def plan_sizes(stages: Sequence[StageLoad], free: Resources, settings: SizingSettings,
               *, budget: Resources | None = None) -> SizingDecision:
    """The target size of each stage; see the module docstring for the rules.

    ``free``: resources no one holds now (a shrinking stage's actors still hold theirs).
    ``budget``: the most this run may hold of each resource named (its share of the
    cluster); None: no cap beyond ``free``.
    """
    _check(stages)
    held = held_resources(stages)
    capacity = {key: held.get(key, 0.0) + max(0.0, free.get(key, 0.0))
                for key in {*held, *free}}
    if budget is not None:
        capacity.update({key: min(capacity.get(key, 0.0), cap) for key, cap in budget.items()})
    plan = _Plan(stages, settings, capacity)
    plan.clamp()
    room = plan.room(free, budget)
    plan.fit_budget(room)
    plan.shed_idle()
    plan.grow_unmeasured(room)
    plan.grow(room)
    plan.give_way(room)
    return plan.decision()


def _check(stages: Sequence[StageLoad]) -> None:
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise SizingError(f"stage names repeat: {names}")
    for s in stages:
        if not 1 <= s.min_size <= s.max_size:
            raise SizingError(f"stage {s.name!r}: needs 1 <= min ({s.min_size}) <= max "
                              f"({s.max_size})")
        if (s.size < 0 or s.backlog < 0 or s.in_flight < 0 or s.draining < 0 or s.spare < 0
                or not s.coming >= 0):
            raise SizingError(f"stage {s.name!r}: negative counts in {s}")
        if s.item_cost_s is not None and not s.item_cost_s >= 0:
            raise SizingError(f"stage {s.name!r}: item_cost_s={s.item_cost_s}")
        if any(not amount >= 0 for amount in s.need.values()):
            raise SizingError(f"stage {s.name!r}: negative need {dict(s.need)}")


def held_resources(stages: Sequence[StageLoad], sizes: Mapping[str, int] | None = None
                   ) -> dict[str, float]:
    """What the stages' actors hold (draining ones too), at their sizes or at ``sizes``."""
    held: dict[str, float] = {}
    for s in stages:
        size = s.size if sizes is None else sizes[s.name]
        for key, amount in s.need.items():
            held[key] = held.get(key, 0.0) + amount * (size + s.draining)
    return held


def _fits(need: Resources, room: Mapping[str, float]) -> bool:
    return all(amount <= room.get(key, 0.0) + _EPS for key, amount in need.items() if amount)


class _Plan:
    """The targets of one decision while it is being made."""

    def __init__(self, stages: Sequence[StageLoad], settings: SizingSettings,
                 capacity: Mapping[str, float]) -> None:
        self.stages = {s.name: s for s in stages}
        self.settings, self.capacity = settings, capacity
        self.target = {s.name: s.size for s in stages}
        self.reason: dict[str, str] = {}
        self.grown: set[str] = set()
        self.shrunk: set[str] = set()
        # An actor's size: its largest share of what the run could hold of a resource.
        self._units = {s.name: max((amount / capacity[key] for key, amount in s.need.items()
                                    if amount and capacity.get(key, 0.0) > 0), default=0.0)
                       or 1.0 for s in stages}

    # -- measures -----------------------------------------------------------------------------
    def drain_s(self, name: str, size: int | None = None) -> float:
        """Seconds the stage needs for the work it holds with ``size`` actors (its target)."""
        n = self.target[name] if size is None else size
        load = self.stages[name].load_s
        if load <= 0:
            return 0.0
        return math.inf if n <= 0 else load / n

    def priority(self, name: str, size: int | None = None) -> float:
        """Drain time per unit of resource that one actor of the stage holds."""
        return self.drain_s(name, size) / self._units[name]

    def wanted(self, name: str) -> int:
        """How many actors the stage's work asks for (its target when not backed up)."""
        s, n = self.stages[name], self.target[name]
        if s.backlog <= 0 or s.item_cost_s is None or s.load_s <= 0:
            return n
        horizon = max(self.settings.backlog_s, s.batch_s)
        return min(s.max_size, max(n, math.ceil(s.load_s / horizon - _EPS)))

    def _set(self, name: str, size: int, reason: str) -> None:
        if size > self.target[name]:
            self.grown.add(name)
        elif size < self.target[name]:
            self.shrunk.add(name)
        self.target[name] = size
        self.reason[name] = reason

    def room(self, free: Resources, budget: Resources | None) -> dict[str, float]:
        """What growth may use after :meth:`clamp`: the free resources, capped by what is
        left of the budget (negative where the run holds more than it may)."""
        held: dict[str, float] = {}
        room = {key: max(0.0, amount) for key, amount in free.items()}
        for name, s in self.stages.items():
            forced = max(0, self.target[name] - s.size)  # brought up to its min
            for key, amount in s.need.items():
                held[key] = held.get(key, 0.0) + amount * (self.target[name] + s.draining)
                room[key] = room.get(key, 0.0) - amount * forced
        for key, cap in (budget or {}).items():
            room[key] = min(room.get(key, 0.0), cap - held.get(key, 0.0))
        return room

    # -- the steps ------------------------------------------------------------------------------
    def clamp(self) -> None:
        for name, s in self.stages.items():
            if s.size < s.min_size:
                self._set(name, s.min_size, f"below its min {s.min_size}")
            elif s.size > s.max_size:
                self._set(name, s.max_size, f"above its max {s.max_size}")

    def fit_budget(self, room: dict[str, float]) -> None:
        """Over budget, or a min that did not fit (negative room): the least pressed stages
        give actors back. What they give back is freed by drains, at a later decision:
        growth now has only what was free before."""
        before = dict(room)
        while any(amount < -_EPS for amount in room.values()):
            over = {key for key, amount in room.items() if amount < -_EPS}
            donors = [name for name, s in self.stages.items()
                      if self.target[name] > s.min_size
                      and any(s.need.get(key, 0.0) > 0 for key in over)]
            if not donors:
                break
            name = min(donors, key=lambda n: (self.priority(n, self.target[n] - 1), n))
            self._set(name, self.target[name] - 1,
                      "the run holds more than its share or what is free")
            for key, amount in self.stages[name].need.items():
                if key in room:
                    room[key] += amount
        for key in room:
            room[key] = max(0.0, before[key])

    def shed_idle(self) -> None:
        for name, s in self.stages.items():
            n = self.target[name]
            if s.backlog or not s.spare or n <= s.min_size or name in self.grown:
                continue
            if s.item_cost_s is None and s.coming:
                continue  # its share waits for the work on its way (see grow_unmeasured)
            limit = idle_limit_s(s, self.settings)
            if s.idle_s >= limit:
                size = max(s.min_size, n - s.spare)
                self._set(name, size, f"{n - size} idle for {s.idle_s:.0f}s "
                                      f"(limit {limit:.0f}s)")

    def fair_share(self, name: str) -> int:
        """Actors of ``name`` in an even split of what the run could hold among the stages
        that need the same resources and have work or are not measured yet (work reaches
        a stage downstream only once its feeders ran)."""
        s = self.stages[name]
        working = [t for t in self.stages.values()
                   if t.backlog or t.in_flight or t.coming or t.item_cost_s is None]
        shares = [int(self.capacity.get(key, 0.0)
                      / max(1, sum(t.need.get(key, 0.0) > 0 for t in working)) / amount + _EPS)
                  for key, amount in s.need.items() if amount > 0]
        return max(s.min_size, min([s.max_size, *shares]))

    def grow_unmeasured(self, room: dict[str, float]) -> None:
        """A stage with work whose cost is not measured yet gets an even share at once (its
        actors start while its first batches run, and no measured stage takes it all
        meanwhile): what it cannot fit now is kept from the others."""
        for name, s in sorted(self.stages.items()):
            if (s.item_cost_s is not None or not (s.backlog or s.coming) or s.draining
                    or name in self.shrunk):
                continue
            share = self.fair_share(name)
            while self.target[name] < share and _fits(s.need, room):
                self._set(name, self.target[name] + 1, f"{s.backlog} waiting, its cost not "
                          f"measured yet: an even share ({share})")
                for key, amount in s.need.items():
                    room[key] = room.get(key, 0.0) - amount
            for key, amount in s.need.items():  # kept for it
                room[key] = room.get(key, 0.0) - amount * max(0, share - self.target[name])

    def grow(self, room: dict[str, float]) -> None:
        """Free resources to the backed-up stages, most pressed per unit first."""
        while True:
            best: str | None = None
            for name, s in self.stages.items():
                if (name in self.shrunk or s.draining or self.target[name] >= self.wanted(name)
                        or not _fits(s.need, room)):
                    continue
                if best is None or (self.priority(name), name) > (self.priority(best), best):
                    best = name
            if best is None:
                return
            s = self.stages[best]
            self._set(best, self.target[best] + 1, f"backlog {s.backlog} "
                      f"({s.item_cost_s or 0.0:.3g}s each) drains in "
                      f"{self.drain_s(best, s.size):.0f}s with {s.size}")
            for key, amount in s.need.items():
                room[key] = room.get(key, 0.0) - amount

    def give_way(self, room: dict[str, float]) -> None:
        """Backed-up stages that cannot fit another actor take them from much less pressed
        ones: one at a time, each move judged with the actors already promised."""
        coming = dict(room)  # what is free, plus what draining actors will free
        for s in self.stages.values():
            for key, amount in s.need.items():
                coming[key] = coming.get(key, 0.0) + amount * s.draining
        receivers = sorted((name for name in self.stages
                            if self.target[name] < self.wanted(name) and name not in self.shrunk),
                           key=lambda n: (-self.priority(n), n))
        for receiver in receivers:
            need = self.stages[receiver].need
            promised = 0  # actors it gets once the drains are done (a later decision)
            while self.target[receiver] + promised < self.wanted(receiver):
                undo = (dict(self.target), dict(self.reason), set(self.shrunk), dict(coming))
                size = self.target[receiver] + promised
                while not _fits(need, coming):
                    lacking = {key for key, amount in need.items()
                               if amount > coming.get(key, 0.0) + _EPS}
                    donor = self._donor(receiver, size, lacking)
                    if donor is None:
                        break
                    smaller = self.target[donor] - 1
                    self._set(donor, smaller, f"gives way to {receiver} (drains in "
                              f"{self.drain_s(receiver, size):.0f}s vs "
                              f"{self.drain_s(donor, smaller):.0f}s)")
                    for key, amount in self.stages[donor].need.items():
                        coming[key] = coming.get(key, 0.0) + amount
                if not _fits(need, coming):  # no donors free all it needs: none gives way
                    self.target, self.reason, self.shrunk, coming = undo
                    break
                for key, amount in need.items():  # promised: the next receiver waits its turn
                    coming[key] = coming.get(key, 0.0) - amount
                promised += 1

    def _donor(self, receiver: str, size: int, lacking: set[str]) -> str | None:
        """The least pressed stage that holds what ``receiver`` (at ``size`` actors) lacks
        and may give it an actor."""
        threshold = self.priority(receiver, size) / self.settings.hysteresis
        best: str | None = None
        for name, s in self.stages.items():
            n = self.target[name]
            if (name == receiver or name in self.grown or n <= s.min_size
                    or s.item_cost_s is None
                    or not any(s.need.get(key, 0.0) > 0 for key in lacking)):
                continue
            after = self.priority(name, n - 1)
            if after >= threshold:
                continue
            if best is None or (after, name) < (self.priority(best, self.target[best] - 1), best):
                best = name
        return best

    def decision(self) -> SizingDecision:
        changes = tuple(Resize(name, s.size, self.target[name], self.reason[name])
                        for name, s in self.stages.items() if self.target[name] != s.size)
        pressed = [name for name in self.stages if self.drain_s(name) > 0]
        # The stage whose work takes longest to finish with its actors: per unit of resource
        # orders growth, but a small actor (0.25 CPU) would look bound however fast it drains.
        binding = max(pressed, key=lambda n: (self.drain_s(n), n)) if pressed else None
        return SizingDecision(dict(self.target), changes, binding,
                              {name: self.drain_s(name) for name in self.stages})


__all__ = ["AUTO_MAX_REPLICAS", "DEFAULT_SIZING", "Resize", "SizingDecision", "SizingError",
           "SizingSettings", "StageLoad", "held_resources", "idle_limit_s", "plan_sizes"]
