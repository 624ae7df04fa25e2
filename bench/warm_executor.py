"""Cold vs warm runs of the fan-out workload on one ``ro.Executor``, against the lower bound.

    python -m bench.warm_executor [--parents 300] [--mean 20] [--gpus 4] [--runs 3]

Run 1 starts the actors (cold); runs 2.. reuse them (warm). Each run's E2E is timed from
``Executor.run`` to its last output and printed as a ratio to the workload's lower bound
(``bench/workload.py``), with the actors each run started.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from bench.peers.rayorch_runner import build_pipeline
from bench.workload import BenchConfig, lower_bound, make_parents


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parents", type=int, default=300)
    parser.add_argument("--max-children", type=int, default=40,
                        help="long tail cap (the mean is about a tenth to a half of it)")
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import rayorch as ro
    from rayorch.runtime.ray_cluster import ensure_ray

    config = BenchConfig(parents=args.parents, max_children=args.max_children, gpus=args.gpus)
    ensure_ray(None, num_cpus=8, num_gpus=args.gpus, log_to_driver=False)
    parents = make_parents(config)
    bound = lower_bound(config, parents).total_s
    rows = []
    with ro.Executor(build_pipeline(config, None)) as executor:
        for number in range(1, args.runs + 1):
            before = executor.actors_started
            started = time.perf_counter()
            handle = executor.run(parents, ordered=False, quiet=True)
            e2e = time.perf_counter() - started
            assert len(handle.collect()) == len(parents)
            rows.append({"run": number, "kind": "cold" if number == 1 else "warm",
                         "e2e_s": round(e2e, 3), "bound_s": round(bound, 3),
                         "ratio": round(e2e / bound, 3),
                         "actors_started": executor.actors_started - before})
    children = sum(p["n"] for p in parents)
    print(f"{len(parents)} parents, {children} children (mean {children / len(parents):.1f}), "
          f"{args.gpus} fake GPUs, lower bound {bound:.2f} s")
    for row in rows:
        print(f"run {row['run']} ({row['kind']}): E2E {row['e2e_s']:.2f} s = "
              f"{row['ratio']:.3f}x the bound, {row['actors_started']} actors started")
    result = {"config": config.to_json(), "children": children, "rows": rows}
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
    return result


if __name__ == "__main__":
    main()
