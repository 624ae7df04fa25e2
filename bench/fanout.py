"""Fan-out/fan-in benchmark: rayorch vs Ray Data vs Daft vs the lower bound.

``python -m bench.fanout`` (defaults: 300 parents, 3 repetitions, G=2, B=32);
``python -m bench.fanout --parents 50 --reps 1`` for a quick smoke run.

Each repetition runs every system once, interleaved, each in a fresh process with
the same declared resources. Reported per system (median over repetitions): E2E,
time to the first completed parent, p50/p99 parent completion time (all measured from
the start of the run at the driver), each as a ratio to the lower bound
(docs/ARCHITECTURE.md, "Lower bound") and to rayorch; and start-up (run start to the first
UDF call: actor and worker start, which the bound leaves out). Writes ``<out-dir>/fanout.json``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from bench.peers.common import (
    SYSTEMS,
    Variant,
    add_config_args,
    config_from_args,
    format_table,
    medians,
    ratio,
    run_interleaved,
)
from bench.workload import lower_bound, make_parents, workload_stats

METRICS = (
    ("e2e_s", "E2E"),
    ("first_parent_s", "first parent"),
    ("p50_parent_s", "p50 parent"),
    ("p99_parent_s", "p99 parent"),
    ("startup_s", "start-up"),
    ("first_gpu_s", "first GPU batch"),
)


def summary_table(summary: dict[str, dict[str, float] | None], bound_s: float) -> str:
    """One row per (system, metric): median seconds, ratio to the bound and to rayorch."""
    base = summary.get("rayorch")
    rows = []
    for system, values in summary.items():
        for key, name in METRICS:
            value = values[key] if values else None
            rows.append([
                system, name, f"{value:.2f}" if value is not None else "failed",
                ratio(value, bound_s), ratio(value, base[key] if base else None),
            ])
    return format_table(["system", "metric", "median s", "/ bound", "/ rayorch"], rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_config_args(parser, parents=300, reps=3, name="fanout")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    args = parser.parse_args(argv)

    config = config_from_args(args)
    parents = make_parents(config)
    bound = lower_bound(config, parents)
    stats = workload_stats(parents)
    print(f"workload: {stats}\nlower bound: {bound.total_s:.2f}s "
          f"(GPU {bound.gpu_s:.2f}s at G={config.gpus}, B={config.batch_size})", flush=True)

    variants = [Variant(system, system, config) for system in args.systems]
    runs = run_interleaved(variants, args.reps, args.out_dir, args.timeout)
    summary = {label: medians(records, tuple(k for k, _ in METRICS))
               for label, records in runs.items()}
    print(summary_table(summary, bound.total_s))

    report = {
        "benchmark": "fanout", "config": config.to_json(), "workload": stats,
        "lower_bound": {"total_s": bound.total_s, "first_render_s": bound.first_render_s,
                        "gpu_s": bound.gpu_s, "last_assemble_s": bound.last_assemble_s},
        "reps": args.reps, "summary": summary, "runs": runs,
    }
    out = args.out_dir / "fanout.json"
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
