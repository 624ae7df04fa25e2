"""What a driver sets up before its loop starts: Ray, the store URL, the actor pools."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import ray

from rayorch.actors.pool import ActorPool, PoolError, start_timeout_s
from rayorch.actors.reservation import Reservation, reservable
from rayorch.actors.worker import StoreBinding
from rayorch.core.ids import CallId
from rayorch.core.plan import ModuleSpec, Plan
from rayorch.core.reuse import Reuse
from rayorch.runtime.delivery import CallerSink, Feed
from rayorch.runtime.pool_ledger import RayLedger
from rayorch.runtime.ports import Sink
from rayorch.runtime.ray_cluster import ensure_ray
from rayorch.runtime.ray_pools import RayPools
from rayorch.runtime.shard_driver import DriverConfig, ShardDriver
from rayorch.store.base import LineageStore, RunInfo
from rayorch.store.registry import redact_url, scheme_of

LEASE_TTL_S = 30.0  # Pipeline.run
REPLICA_LEASE_TTL_S = 10.0  # rayorch driver / resume / join_run




def check_resources(modules: list[ModuleSpec]) -> None:
    """Fail early, in plain words, when the pools together ask more than the cluster has."""
    have: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    need: dict[str, float] = {}
    for m in modules:
        o = m.options
        need["CPU"] = need.get("CPU", 0.0) + o.replicas * o.num_cpus
        need["GPU"] = need.get("GPU", 0.0) + o.replicas * o.num_gpus
        for key, amount in o.resources:
            need[key] = need.get(key, 0.0) + o.replicas * amount
    short = {k: v for k, v in need.items() if v > 0 and v > have.get(k, 0.0) + 1e-9}
    if short:
        wanted = ", ".join(
            f"{k}: {v:g} needed, {have.get(k, 0.0):g} available" for k, v in short.items()
        )
        raise PoolError(
            f"the actor pools of this pipeline need more resources than the Ray cluster has "
            f"({wanted}). Lower replicas/num_cpus/num_gpus of the modules, or start Ray with "
            f"more declared resources, e.g. ray.init(num_cpus=8, num_gpus=2)."
        )


def new_driver_id() -> str:
    """A driver id unique across hosts and processes: ``host-pid-random``."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def commits_in_actor(store_url: str) -> bool:
    """True for a shared store (actors commit themselves); False for ``memory://``: the
    store registry says which backends several processes share."""
    from rayorch.store.registry import is_shared_store

    return is_shared_store(store_url)


def build_pools(
    plan: Plan, store_url: str, run_id: str, *, depth: int | None, shared: bool = False,
    live: dict[str, tuple[int, ...]] | None = None,
) -> tuple[dict[str, ActorPool], dict[CallId, str]]:
    """One actor pool per module the plan calls, and the module of every Call.

    Private pools are returned while their actors start (the driver sends batches to each
    actor once it is up and learns from the pool of a module that fails to build); shared
    pools are returned ready, with the actors of the run's live sets (``live``, from the pool
    ledger) where another driver sized them already.

    The pools' demand is checked against the cluster first; if any pool fails to
    start, the ones already built are shut down before the error propagates.
    """
    binding = StoreBinding(store_url, run_id) if commits_in_actor(store_url) else None
    call_module: dict[CallId, str] = {}
    for node in plan.calls:
        assert node.call is not None
        call_module[node.call.id] = node.call.module
    modules = [plan.module(name) for name in dict.fromkeys(call_module.values())]
    check_resources(modules)
    start_timeout_s()  # a malformed $RAYORCH_ACTOR_START_TIMEOUT_S is refused before any actor
    pools: dict[str, ActorPool] = {}
    reserved = [] if shared else [module for module in modules if reservable(module)]
    reservation = Reservation(reserved) if reserved else None  # first actors, all or none
    try:
        for module in modules:
            pools[module.name] = ActorPool(
                module, binding, name_prefix=f"rayorch:{run_id}", depth=depth, shared=shared,
                reservation=reservation if module in reserved else None,
                indexes=list((live or {}).get(module.name, ())) or None,
            )
        for pool in pools.values():
            if shared:  # another driver may have killed a shared actor: replaced here
                pool.wait_ready()
    except BaseException:
        for pool in pools.values():
            pool.shutdown()
        if reservation is not None:
            reservation.release(every_owner=True)  # pools never built hold it too
        raise
    return pools, call_module


def start_driver(*, store: LineageStore, run_id: str, info: RunInfo, plan: Plan,
                 driver_id: str, pools: dict[str, ActorPool], call_module: dict[CallId, str],
                 feed: Feed, sink: Sink | CallerSink, config: DriverConfig,
                 on_close: Callable[[bool], None], reuse: Reuse | None,
                 ledger: RayLedger | None = None) -> ShardDriver:
    """The one driver on Ray, built the same way for ``Pipeline.run`` and for a run's
    driver replicas: its pools port, and when a pool sizes itself, the pool ledger where
    the run claims its share of the cluster (one budget for all of the run's drivers;
    runtime/pool_ledger.py). ``ledger``: one made already (a replica asks it for the
    shared pools' live sets before building them)."""
    ray_pools = RayPools(pools, call_module, run_id=run_id, log=config.log)
    if config.sizing is not None and any(m.options.sizes_itself for m in plan.modules):
        ledger = ledger or RayLedger(run_id, driver_id, log=config.log)
        if any(pool.shared for pool in pools.values()):
            ledger.attach(ray_pools)
            ray_pools.ledger = ledger
        config = replace(config, ledger=ledger)
    else:
        ledger = None

    def close(run_done: bool) -> None:
        if ledger is not None:
            ledger.leave()
        on_close(run_done)

    return ShardDriver(store=store, run_id=run_id, info=info, plan=plan, driver_id=driver_id,
                       pools=ray_pools, feed=feed, sink=sink, config=config, on_close=close,
                       reuse=reuse)


def with_quick_retries(url: str, retries: int = 3) -> str:
    """A Redis URL whose client gives up reconnecting after ``retries`` attempts.

    A driver's store outage then surfaces within about a second, is reported once, and
    the driver backs off and rebuilds from the store (docs/topics/FAILOVER.md, "Driver
    replicas and failover").
    """
    if not scheme_of(url).startswith("redis") or "retries=" in url:  # the Redis stores' option
        return url
    return f"{url}{'&' if '?' in url else '?'}retries={retries}"


__all__: list[Any] = [
    "LEASE_TTL_S", "REPLICA_LEASE_TTL_S", "build_pools", "commits_in_actor", "ensure_ray",
    "new_driver_id", "redact_url", "start_driver", "with_quick_retries",
]
