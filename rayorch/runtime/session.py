"""What a driver sets up before its loop starts: the store, Ray, the actor pools, and what it
releases when it ends; :class:`DriverSession` builds it, the same for ``Pipeline.run`` (the
jobs run theirs) and for a run's driver replicas (``join_run``)."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import TracebackType
from typing import Any

import ray

from rayorch.actors.pool import ActorPool, PoolError, start_timeout_s
from rayorch.actors.reservation import Reservation, reservable
from rayorch.actors.worker import StoreBinding
from rayorch.core.ids import CallId
from rayorch.core.plan import ModuleSpec, Plan
from rayorch.core.reuse import Reuse
from rayorch.runtime.delivery import CallerSink, Feed
from rayorch.runtime.delivery_writer import DELIVERY_LANES
from rayorch.runtime.pool_ledger import RayLedger
from rayorch.runtime.ports import Sink
from rayorch.runtime.ray_cluster import start_ray_for
from rayorch.runtime.ray_pools import RayPools
from rayorch.runtime.shard_driver import DriverConfig, ShardDriver
from rayorch.store.base import LineageStore, RunInfo
from rayorch.store.errors import StoreUnavailableError
from rayorch.store.registry import open_store, redact_url, scheme_of

LEASE_TTL_S = 30.0  # Pipeline.run
REPLICA_LEASE_TTL_S = 10.0  # rayorch driver / resume / join_run


class DriverSession:
    """One driver's set-up on Ray and its release, in this order:

    1. the run's store, with quick retries (:func:`with_quick_retries`), checked first
       unless ``check=False`` (:func:`open_store_checked`): a wrong URL fails before Ray;
    2. the caller's steps on ``session.store`` (open or read the run, build the pipeline);
    3. :meth:`start_ray`: Ray sized for the plan (``ray_cluster.start_ray_for``; the
       caller's ``ray_init_kwargs`` instead, as upstream RayOrch's);
    4. the caller's actor pools (:func:`build_pools`: private, or shared with a ledger);
    5. :meth:`start`: the driver, with this session's metrics endpoint and delivery lanes.

    A step of 2-4 that raises inside ``with session:`` closes the store. Closing the driver
    leaves the pool ledger, calls the caller's ``release(run_done)`` (settle, stop or kill
    its pools) and then closes the store, even when ``release`` raises.
    """

    def __init__(self, store_url: str, *, address: str | None, check: bool = True,
                 ray_init_kwargs: Mapping[str, Any] | None = None,
                 metrics_port: int | None = None, metrics_host: str = "127.0.0.1") -> None:
        self.address = address
        self._ray_init_kwargs = ray_init_kwargs
        self.metrics_port, self.metrics_host = metrics_port, metrics_host
        self.store: LineageStore = (open_store_checked(store_url) if check
                                    else open_store(with_quick_retries(store_url)))

    def __enter__(self) -> DriverSession:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:  # the set-up failed: nothing of it stays open
            self.store.close()

    def start_ray(self, plan: Plan) -> None:
        start_ray_for(plan, self.address, ray_init_kwargs=self._ray_init_kwargs)

    def start(self, *, run_id: str, info: RunInfo, plan: Plan, driver_id: str,
              pools: dict[str, ActorPool], call_module: dict[CallId, str], feed: Feed,
              sink: Sink | CallerSink, config: DriverConfig, release: Callable[[bool], None],
              reuse: Reuse | None, ledger: RayLedger | None = None) -> ShardDriver:
        """The one driver on Ray: its pools port, and when a pool sizes itself, the pool
        ledger where the run claims its share of the cluster (one budget for all of the
        run's drivers; runtime/pool_ledger.py). ``ledger``: one made already (a replica asks
        it for the shared pools' live sets before building them)."""
        config = replace(config, metrics_port=self.metrics_port, metrics_host=self.metrics_host,
                         delivery_lanes=DELIVERY_LANES)
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
            try:
                release(run_done)
            finally:
                self.store.close()

        return ShardDriver(store=self.store, run_id=run_id, info=info, plan=plan,
                           driver_id=driver_id, pools=ray_pools, feed=feed, sink=sink,
                           config=config, on_close=close, reuse=reuse)


def open_store_checked(url: str, *, retries: int = 3) -> LineageStore:
    """The store at ``url`` (quick retries), checked before anything else of a run starts
    (Ray, actors, a job's ``--output``): a wrong URL fails at once with its cause, named as
    given (no ``retries=`` added)."""
    store = open_store(with_quick_retries(url, retries))
    try:
        store.check()
    except StoreUnavailableError as exc:
        store.close()
        raise StoreUnavailableError(redact_url(url), exc.detail) from None
    except BaseException:
        store.close()
        raise
    return store


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
    "LEASE_TTL_S", "REPLICA_LEASE_TTL_S", "DriverSession", "build_pools", "commits_in_actor",
    "new_driver_id", "open_store_checked", "redact_url", "with_quick_retries",
]
