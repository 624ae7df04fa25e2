"""Per-grain driver overhead of the Ray runtime: sleep-free UDFs, memory vs Redis store.

    python bench/runtime_overhead.py --parents 200 --children 64 --batch 64

Each parent expands into ``children`` children; a no-op module runs every child
(batched), a reduce gathers them back. The figure is wall time per Grain of the
run (actor start-up excluded) and the driver process's CPU time per Grain. For
``redis`` a private redis-server is started on a free port and stopped afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray

import rayorch as ro
from rayorch import F
from rayorch.testing import RedisServer


class Children:
    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, parents: list[int]) -> list[list[int]]:
        return [list(range(self.n)) for _ in parents]


class Identity:
    def __call__(self, xs: list[int]) -> list[int]:
        return xs


class Total:
    def __call__(self, groups: list[list[int]]) -> list[int]:
        return [sum(g) for g in groups]


class Overhead(ro.Pipeline):
    def __init__(self, children: int, batch: int, replicas: int) -> None:
        super().__init__()
        self.children = ro.RayModule(Children, n=children, num_cpus=0.25, batch_size=16)
        self.work = ro.RayModule(Identity, num_cpus=0.25, batch_size=batch, replicas=replicas)
        self.total = ro.RayModule(Total, num_cpus=0.25, batch_size=16)

    def forward(self, parents: Any) -> Any:
        return self.total(F.reduce(self.work(F.expand(self.children(parents)))))


def measure(store: str, args: argparse.Namespace) -> dict[str, Any]:
    pipeline = Overhead(args.children, args.batch, args.replicas)
    parents = list(range(args.parents))
    run = pipeline.run(
        parents, store=store, progress=False, quiet=True, max_active_sources=args.active
    )
    wall0, cpu0 = time.perf_counter(), time.process_time()
    results = run.collect()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    expected = sum(range(args.children))
    assert results == [expected] * args.parents, "wrong results"
    grains = args.parents * (args.children + 2)
    return {
        "store": store.split("://")[0],
        "grains": grains,
        "batches": run.stats.batches,
        "wall_s": round(wall, 3),
        "driver_cpu_s": round(cpu, 3),
        "us_per_grain_wall": round(wall / grains * 1e6, 1),
        "us_per_grain_driver_cpu": round(cpu / grains * 1e6, 1),
        "grains_per_s": round(grains / wall),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parents", type=int, default=200)
    parser.add_argument("--children", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--active", type=int, default=64, help="max_active_sources")
    parser.add_argument("--stores", default="memory,redis")
    args = parser.parse_args()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for kind in args.stores.split(","):
            if kind == "redis":
                with RedisServer(Path(workdir)) as server:
                    rows.append(measure(server.url, args))
            else:
                rows.append(measure("memory://", args))
    ray.shutdown()
    for row in rows:
        print(json.dumps(row))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
