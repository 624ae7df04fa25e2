"""Run one system once, in this (fresh) process, and write its record as JSON.

``python -m bench.peers.run_one --system raydata --config '{"parents": 50}' --out r.json``
(the harnesses call this in a subprocess per repetition).
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Callable
from pathlib import Path

from bench.peers.common import SYSTEMS, ArrivalLog, init_ray, summarize
from bench.workload import BenchConfig

Runner = Callable[[BenchConfig, str | None, ArrivalLog], None]


def runner_for(system: str) -> Runner:
    """The ``run`` function of ``system`` (imported lazily: each pulls in its engine)."""
    if system == "raydata":
        from bench.peers import raydata

        return raydata.run
    if system == "daft":
        from bench.peers import daft_peer

        return daft_peer.run
    if system == "rayorch":
        from bench.peers import rayorch_runner

        return rayorch_runner.run
    if system == "rayorch-warm":
        from bench.peers import rayorch_runner

        return rayorch_runner.run_warm
    raise ValueError(f"unknown system {system!r}; choose one of {', '.join(SYSTEMS)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", required=True, choices=SYSTEMS)
    parser.add_argument("--config", default="{}", help="BenchConfig fields as JSON")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--trace-dir", required=True, type=Path)
    args = parser.parse_args(argv)

    config = BenchConfig.from_json(json.loads(args.config))
    shutil.rmtree(args.trace_dir, ignore_errors=True)
    args.trace_dir.mkdir(parents=True)
    run = runner_for(args.system)
    init_ray(config)
    log = ArrivalLog()
    try:
        run(config, str(args.trace_dir), log)
    finally:
        import ray

        ray.shutdown()
    record = summarize(args.system, config, log, args.trace_dir)
    args.out.write_text(json.dumps(record, indent=1))
    print(json.dumps({k: v for k, v in record.items() if k != "config"}))


if __name__ == "__main__":
    main()
