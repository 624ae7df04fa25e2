"""A run's session: Ray, the lineage store with this driver's shard leases, the actor pools.

Everything here has a lifetime equal to one ``Pipeline.run``: :func:`open_session`
builds it, :meth:`RunSession.close` stops the actors and releases the leases.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import ray

from rayorch.actors.pool import ActorPool, PoolError
from rayorch.actors.worker import StoreBinding
from rayorch.core.ids import CallId
from rayorch.core.plan import ModuleSpec, Plan
from rayorch.store.base import LineageStore, RunInfo, open_store
from rayorch.store.errors import FencedError, LeaseLostError
from rayorch.store.redis_store import redact_url

LEASE_TTL_S = 30.0


@dataclass(frozen=True, slots=True)
class RunSettings:
    """Driver knobs of one run (see :func:`rayorch.driver.run_pipeline`)."""

    micro_batch: int = 16
    shards: int = 1
    max_active_sources: int | None = 256
    depth: int | None = None
    progress: bool | None = None
    lease_ttl_s: float = LEASE_TTL_S


@dataclass
class RunSession:
    """The resources of one run held by this driver."""

    run_id: str
    store_url: str
    store: LineageStore
    info: RunInfo
    driver_id: str
    epochs: dict[int, int]
    pools: dict[str, ActorPool]
    call_module: dict[CallId, str]
    lease_ttl_s: float
    commits_in_actor: bool
    renewed: float = field(default_factory=time.monotonic)

    @property
    def public_store_url(self) -> str:
        """The store URL without its password (safe to print)."""
        return redact_url(self.store_url)

    def pool_of(self, call_id: CallId) -> ActorPool:
        return self.pools[self.call_module[call_id]]

    def renew_leases(self, force: bool = False) -> None:
        """Renew every shard lease once a third of its TTL has passed."""
        now = time.monotonic()
        if not force and now - self.renewed < self.lease_ttl_s / 3:
            return
        for shard, epoch in self.epochs.items():
            try:
                self.store.renew_lease(self.run_id, shard, self.driver_id, epoch, self.lease_ttl_s)
            except FencedError:
                raise  # another driver took the shard over: this one must stop
            except LeaseLostError:
                # Expired while the caller was slow to ask for the next result and nobody
                # took it: take it again (a new epoch fences anything written before).
                self.epochs[shard] = self.store.acquire_lease(
                    self.run_id, shard, self.driver_id, self.lease_ttl_s
                )
        self.renewed = now

    def close(self) -> None:
        """Kill the actors and give the leases back."""
        for pool in self.pools.values():
            pool.shutdown()
        for shard, epoch in self.epochs.items():
            with contextlib.suppress(Exception):  # the lease expires by itself anyway
                self.store.release_lease(self.run_id, shard, self.driver_id, epoch)
        self.store.close()


def ensure_ray(address: str | None, *, num_cpus: int | None = None,
               num_gpus: int | None = None, log_to_driver: bool = True) -> None:
    """Join ``address`` or start a local Ray, unless Ray is already initialised.

    ``num_cpus``/``num_gpus`` declare a local Ray's resources (default: the machine's).
    """
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address is not None:
        ray.init(address=address, log_to_driver=log_to_driver)
        return
    ray.init(include_dashboard=False, log_to_driver=log_to_driver, num_cpus=num_cpus,
             num_gpus=num_gpus)


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
    """True for a shared store (actors commit themselves); False for ``memory://``."""
    return not store_url.lower().startswith("memory://")


def build_pools(
    plan: Plan, store_url: str, run_id: str, *, depth: int | None, shared: bool = False
) -> tuple[dict[str, ActorPool], dict[CallId, str]]:
    """One ready actor pool per module the plan calls, and the module of every Call.

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
    pools: dict[str, ActorPool] = {}
    try:
        for module in modules:
            pools[module.name] = ActorPool(
                module, binding, name_prefix=f"rayorch:{run_id}", depth=depth, shared=shared
            )
        for pool in pools.values():
            pool.wait_ready()
    except BaseException:
        for pool in pools.values():
            pool.shutdown()
        raise
    return pools, call_module


def open_session(
    plan: Plan, store_url: str, run_id: str, settings: RunSettings, *, address: str | None
) -> RunSession:
    """Start Ray if needed, open the run in the store, build the pools, lease its shards."""
    ensure_ray(address)
    store = open_store(store_url)
    info = store.open_run(
        run_id, plan, shards=settings.shards, micro_batch=settings.micro_batch,
        config={"max_active_sources": settings.max_active_sources},
    )
    # Pools first: actor start-up can outlast a short lease TTL, and nothing is written
    # to the run before the first append, so the leases are taken once the pools are up.
    try:
        pools, call_module = build_pools(plan, store_url, run_id, depth=settings.depth)
    except BaseException:
        store.close()
        raise
    driver_id = new_driver_id()
    epochs: dict[int, int] = {}
    session = RunSession(
        run_id, store_url, store, info, driver_id, epochs, pools, call_module,
        settings.lease_ttl_s, commits_in_actor(store_url),
    )
    try:
        for shard in range(info.shards):
            epochs[shard] = store.acquire_lease(run_id, shard, driver_id, settings.lease_ttl_s)
    except BaseException:
        session.close()
        raise
    return session


__all__: list[Any] = [
    "RunSession", "RunSettings", "build_pools", "commits_in_actor", "ensure_ray",
    "new_driver_id", "open_session", "redact_url",
]
