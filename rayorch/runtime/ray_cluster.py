"""Which Ray a run uses: the one place that decides (CLI, ``Pipeline.run``, drivers, tests).

* Ray already initialised in this process: used as it is.
* An address (``address=``/``--address``, else ``$RAY_ADDRESS``): attach to that cluster,
  with a one-line note saying which; resource arguments are never passed when attaching.
* Otherwise: start a **private** local Ray (``address="local"``), even when another
  cluster runs on this machine, listening on 127.0.0.1 only, dashboard off — unless the
  caller passes its own ``ray.init`` options, which win.

A run starts it with :func:`start_ray_for`: a local Ray sized for its plan's pools
(:func:`ray_size_for`), the same for ``Pipeline.run``, the jobs and the driver replicas.

See docs/ARCHITECTURE.md, "Ray address rules and a loopback-only local Ray".

>>> from rayorch.runtime.ray_cluster import attach_target
>>> attach_target("ray://head:10001", environ={})
('ray://head:10001', '--address')
>>> attach_target(None, environ={"RAY_ADDRESS": "10.0.0.5:6379"})
('10.0.0.5:6379', 'RAY_ADDRESS')
>>> attach_target(None, environ={}) is None
True
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # ray is imported where Ray starts: gpu_count and ray_size_for stay light
    from rayorch.core.plan import Plan

LOOPBACK = "127.0.0.1"


def attach_target(
    address: str | None, *, environ: Mapping[str, str] | None = None
) -> tuple[str, str] | None:
    """``(address, where it came from)`` when a run should attach to a cluster, else ``None``.

    ``address="local"`` (or an empty string) asks for a private local Ray even when
    ``$RAY_ADDRESS`` is set.
    """
    env = os.environ if environ is None else environ
    if address is not None:
        return None if address in ("", "local") else (address, "--address")
    from_env = env.get("RAY_ADDRESS", "")
    if from_env and from_env != "local":
        return from_env, "RAY_ADDRESS"
    return None


@contextlib.contextmanager
def _loopback_node_ip() -> Iterator[None]:
    """Make ``ray.init`` keep 127.0.0.1 as the node IP, so every Ray server binds loopback.

    Ray 2.60 replaces a ``_node_ip_address`` of 127.0.0.1 by the machine's routable IP
    (``services.resolve_ip_for_localhost``) unless its "single-machine" switch
    ``ray_constants.ENABLE_RAY_CLUSTER`` is off; with the node IP on loopback, GCS,
    raylet, workers and the agents listen on 127.0.0.1 only. The switch is restored at once.
    """
    from ray._private import ray_constants

    saved = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    if saved is None:  # another Ray version: it binds as it does
        yield
        return
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


@contextlib.contextmanager
def _no_auth_default_warning() -> Iterator[None]:
    """Silence Ray's "Token authentication is enabled for this Ray cluster" warning.

    Ray 2.60 turns token authentication on for a new local cluster when ``RAY_AUTH_MODE``
    is unset, and warns about it on every start. For the private local Ray rayorch
    starts, that default is kept (a token in ``~/.ray``, loopback only) and only the
    warning goes; ``RAY_AUTH_MODE`` set by the user is Ray's to obey.
    """
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    saved = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(saved)


def _is_loopback(address: str) -> bool:
    """``127.x.x.x:port`` or ``localhost:port`` (Ray would rewrite it to the routable IP)."""
    host = address.rsplit(":", 1)[0]
    return host == "localhost" or host.startswith("127.")


def _stderr_note(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ensure_ray(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    log_to_driver: bool = True,
    note: Callable[[str], None] | None = _stderr_note,
    **init_options: Any,
) -> str:
    """Attach to a cluster or start a private local Ray, unless Ray is already initialised.

    Returns what happened: ``"initialised"`` (Ray was already up), ``"attached"`` or
    ``"local"``. ``num_cpus``/``num_gpus`` size a local Ray only; ``init_options`` go to
    ``ray.init`` of a local Ray and override its defaults (loopback, no dashboard).
    ``note`` receives the one-line "attaching to ..." message (``None``: silent).
    """
    import ray

    if ray.is_initialized():
        return "initialised"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    target = attach_target(address)
    if target is not None:
        where, source = target
        if note is not None:
            note(f"rayorch: attaching to the Ray cluster at {where} (from {source})")
        if _is_loopback(where):  # a loopback-only cluster (one rayorch started): stay there
            with _loopback_node_ip():
                ray.init(address=where, log_to_driver=log_to_driver,
                         _node_ip_address=LOOPBACK)
        else:
            ray.init(address=where, log_to_driver=log_to_driver)
        return "attached"
    options: dict[str, Any] = {
        "include_dashboard": False,
        "_node_ip_address": LOOPBACK,
        "logging_level": logging.WARNING,  # no "Started a local Ray instance" line
        **init_options,
    }
    loopback = options.get("_node_ip_address") == LOOPBACK
    with _loopback_node_ip() if loopback else contextlib.nullcontext(), \
            _no_auth_default_warning():
        ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus,
                 log_to_driver=log_to_driver, **options)
    return "local"


def gpu_count() -> int:
    """CUDA devices visible to this process (via torch when present, else device files)."""
    if importlib.util.find_spec("torch") is not None:
        import torch

        return int(torch.cuda.device_count())
    return len(list(Path("/dev").glob("nvidia[0-9]*")))


def ray_size_for(plan: Plan, *, cpus: int, gpus: Callable[[], int]) -> tuple[int, int | None]:
    """``(num_cpus, num_gpus)`` of a private local Ray for ``plan``'s pools on a machine with
    ``cpus`` cores (``gpus()``: its GPUs, asked only when a pool wants a GPU).

    A pool's ``replicas`` is its size at the start (a range's min, 1 for ``"auto"``), so the
    pools must fit at that size; a pool that sizes itself grows later into what is free, so
    the local Ray declares the machine's cores, and its GPUs when any pool wants one
    (declaring only the start's GPUs would cap a pool that sizes itself at its min, and a
    later ``Pipeline.run`` in the same process, on the same Ray, to this run's GPUs).
    """
    need_cpus = sum(m.options.replicas * m.options.num_cpus for m in plan.modules)
    need_gpus = sum(m.options.replicas * m.options.num_gpus for m in plan.modules)
    num_gpus = math.ceil(need_gpus) if need_gpus else None
    if any(m.options.num_gpus > 0 for m in plan.modules):
        num_gpus = max(num_gpus or 0, gpus()) or None
    return max(cpus, math.ceil(need_cpus)), num_gpus


def start_ray_for(plan: Plan, address: str | None, *, log_to_driver: bool = True,
                  ray_init_kwargs: Mapping[str, Any] | None = None) -> str:
    """Attach (:func:`ensure_ray`) or start a private local Ray sized for ``plan``'s pools
    (:func:`ray_size_for` on this machine's cores and GPUs), unless Ray runs already.

    ``ray_init_kwargs`` (upstream RayOrch's ``run(ray_init_kwargs=)``): the caller's own
    ``ray.init``, as upstream calls it (``address`` or a local Ray of its own, dashboard off),
    and nothing sized. Returns what :func:`ensure_ray` returns.
    """
    import ray

    if ray.is_initialized():
        return "initialised"
    if ray_init_kwargs:
        ray.init(**{"include_dashboard": False, "address": address or "local",
                    **ray_init_kwargs})
        return "local" if attach_target(address or "local") is None else "attached"
    num_cpus, num_gpus = ray_size_for(plan, cpus=os.cpu_count() or 1, gpus=gpu_count)
    return ensure_ray(address, num_cpus=num_cpus, num_gpus=num_gpus, log_to_driver=log_to_driver)


__all__ = ["LOOPBACK", "attach_target", "ensure_ray", "gpu_count", "ray_size_for",
           "start_ray_for"]
