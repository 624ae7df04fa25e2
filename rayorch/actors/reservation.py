"""A run's first actors reserved together, so that runs sharing a cluster never deadlock.

Without it, eight runs that each need two 1-CPU actors on a 4-CPU cluster each place one
actor, and none can start its second: every run waits on resources the others hold. A
:class:`Reservation` is one Ray placement group with a bundle for the first replica of
every pool of a run (the smallest set that lets the run progress): Ray grants it whole or
not at all, so a run either holds all it needs to make progress or holds nothing and waits
its turn, saying so. Further replicas are scheduled freely and only add throughput (an
unschedulable one is said and the pool runs on the others). Pools of shared, named actors
(``rayorch driver``) are found by name across drivers and are not reserved here.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import ray

from rayorch.core.plan import ModuleSpec

SAY_AFTER_S = 2.0  # a placement granted at once is not worth a line
SAY_EVERY_S = 60.0


def bundle_of(module: ModuleSpec) -> dict[str, float]:
    """What one actor of ``module`` asks the cluster for (empty: nothing to reserve)."""
    opts = module.options
    bundle = {"CPU": float(opts.num_cpus), "GPU": float(opts.num_gpus)}
    bundle.update({key: float(amount) for key, amount in opts.resources})
    return {key: amount for key, amount in bundle.items() if amount > 0}


def reservable(module: ModuleSpec) -> bool:
    """Whether ``module``'s first actor goes into the run's reservation: it asks for
    resources, and its ``ray_options`` name no scheduling strategy of their own."""
    return bool(bundle_of(module)) and "scheduling_strategy" not in dict(module.options.ray_options)


class Reservation:
    """One placement group holding a bundle per module (see the module docstring)."""

    def __init__(self, modules: Sequence[ModuleSpec]) -> None:
        from ray.util.placement_group import placement_group

        self.modules = [m.name for m in modules]
        self.bundles = [bundle_of(m) for m in modules]
        self.group = placement_group(self.bundles, strategy="PACK")
        self._ready = self.group.ready()
        self.created = time.monotonic()
        self.placed_at: float | None = None
        self._said_at: float | None = None
        self._owners = len(modules)

    def bundle(self, module: str) -> int | None:
        """The bundle index of ``module``'s first actor (None: not reserved)."""
        return self.modules.index(module) if module in self.modules else None

    def strategy(self, bundle: int) -> Any:
        """The scheduling strategy that puts an actor into bundle ``bundle``."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=bundle)

    def placed(self) -> bool:
        """Whether Ray granted the reservation (said on stderr while it waits)."""
        if self.placed_at is not None:
            return True
        done, _ = ray.wait([self._ready], num_returns=1, timeout=0)
        now = time.monotonic()
        if done:
            self.placed_at = now
            if self._said_at is not None:
                print(f"rayorch: the cluster placed this run's actors after "
                      f"{now - self.created:.0f}s of waiting", file=sys.stderr, flush=True)
            return True
        if now - self.created >= SAY_AFTER_S and (
                self._said_at is None or now - self._said_at >= SAY_EVERY_S):
            self._said_at = now
            print(self.waiting_line(), file=sys.stderr, flush=True)
        return False

    def waiting_line(self) -> str:
        need: dict[str, float] = {}
        for bundle in self.bundles:
            for key, amount in bundle.items():
                need[key] = need.get(key, 0.0) + amount
        free = ray.available_resources()  # type: ignore[no-untyped-call]
        total = ray.cluster_resources()  # type: ignore[no-untyped-call]
        parts = ", ".join(f"{amount:g} {key} ({free.get(key, 0.0):g} of "
                          f"{total.get(key, 0.0):g} free)" for key, amount in need.items())
        return (f"rayorch: waiting for the cluster to place this run's first actors "
                f"(modules {', '.join(map(repr, self.modules))}: {parts}); other runs or jobs "
                f"hold the rest, and this run starts when they release it")

    def release(self, *, every_owner: bool = False) -> None:
        """One pool of the run is done with it (``every_owner``: all are); the last one gives
        the resources back."""
        if self._owners <= 0:
            return
        self._owners = 0 if every_owner else self._owners - 1
        if self._owners == 0:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):  # Ray already shut down
                remove_placement_group(self.group)


__all__ = ["Reservation", "bundle_of", "reservable"]
