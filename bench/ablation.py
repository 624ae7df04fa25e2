"""Scheduler ablation of rayorch: streaming (B=1), parent-bound rebatching, elastic FIFO.

``python -m bench.ablation`` (defaults: 300 parents, 3 repetitions, G=2, B=32);
``python -m bench.ablation --parents 50 --reps 1`` for a quick smoke run.

The lineage and commit machinery stay fixed; only the GPU Call's batching changes,
in three variants: ``streaming`` dispatches one child per call,
``parent-bound`` batches up to B ready siblings of one parent, ``elastic-fifo`` (the
full system) batches up to B ready children of any parents in FIFO order. Reports the
median E2E of each, its slowdown relative to the full system and its ratio to the
lower bound (at batch size B); the same after start-up (run start to the first UDF
call), which on a busy machine varies by seconds. Writes ``<out-dir>/ablation.json``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from bench.peers.common import (
    Variant,
    add_config_args,
    config_from_args,
    format_table,
    medians,
    ratio,
    run_interleaved,
)
from bench.workload import BenchConfig, lower_bound, make_parents, workload_stats

FULL_SYSTEM = "elastic-fifo"


def ablation_variants(config: BenchConfig) -> list[Variant]:
    """The three GPU batching schemes, weakest first."""
    return [
        Variant("streaming", "rayorch", config.replace(batch_size=1, policy="elastic")),
        Variant("parent-bound", "rayorch", config.replace(policy="parent_bound")),
        Variant(FULL_SYSTEM, "rayorch", config.replace(policy="elastic")),
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_config_args(parser, parents=300, reps=3, name="ablation")
    args = parser.parse_args(argv)

    config = config_from_args(args)
    parents = make_parents(config)
    bound = lower_bound(config, parents).total_s
    print(f"workload: {workload_stats(parents)}\nlower bound (B={config.batch_size}): "
          f"{bound:.2f}s", flush=True)

    runs = run_interleaved(ablation_variants(config), args.reps, args.out_dir, args.timeout)
    for records in runs.values():
        for record in records:
            if "error" not in record:
                record["after_startup_s"] = record["e2e_s"] - record["startup_s"]
    keys = ("e2e_s", "after_startup_s", "first_parent_s", "p50_parent_s", "gpu_calls")
    summary = {label: medians(records, keys) for label, records in runs.items()}
    full = summary.get(FULL_SYSTEM) or {}
    rows = []
    for label, values in summary.items():
        if values is None:
            rows.append([label, "failed", "-", "-", "-", "-", "-", "-"])
            continue
        rows.append([
            label, f"{values['e2e_s']:.2f}", ratio(values["e2e_s"], full.get("e2e_s")),
            ratio(values["e2e_s"], bound), f"{values['after_startup_s']:.2f}",
            ratio(values["after_startup_s"], full.get("after_startup_s")),
            f"{values['p50_parent_s']:.2f}", f"{values['gpu_calls']:.0f}",
        ])
    print(format_table(["variant", "median E2E s", "/ full", "/ bound", "after start-up s",
                        "/ full", "p50 parent s", "GPU calls"], rows))

    report = {"benchmark": "ablation", "config": config.to_json(), "lower_bound_s": bound,
              "reps": args.reps, "summary": summary, "runs": runs}
    out = args.out_dir / "ablation.json"
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
