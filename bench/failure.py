"""Parent-scoped failure injection: a failure at child 0 of the largest parents.

``python -m bench.failure`` (defaults: 300 parents, 3 repetitions, G=2, B=32);
``python -m bench.failure --parents 50 --reps 1 --systems rayorch`` for a smoke run.

The largest 5.25% of the parents (the share of RayOrch's failure workload: 99 of 1,885,
holding 51.9% of the children) are poisoned: child 0 of each fails in the GPU stage. rayorch
signals ``ro.GroupFailure``, so the ready siblings of a poisoned parent are suppressed
before they reach the GPU UDF; Ray Data and Daft can only mark the failed row and drop
the parent at reassembly, so every sibling still runs. For each system, clean and
injected runs alternate (paired per repetition); reported: siblings suppressed (never
entered the GPU UDF), non-trigger GPU UDF calls (records) clean vs injected, and the
paired time saved. Every run checks its healthy outputs are complete and in order and
every poisoned parent came back failed. Writes ``<out-dir>/failure.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from bench.peers.common import (
    PEER_SYSTEMS,
    SYSTEMS,
    Variant,
    add_config_args,
    config_from_args,
    format_table,
    run_interleaved,
)
from bench.workload import PAPER_POISON_FRACTION, BenchConfig, largest_parents, make_parents


def failure_report(
    system: str, config: BenchConfig, clean: list[dict[str, Any]],
    injected: list[dict[str, Any]],
) -> dict[str, Any]:
    """Suppressed siblings, avoided UDF records and paired time saved for one system."""
    pairs = [(c, i) for c, i in zip(clean, injected) if "error" not in c and "error" not in i]
    if not pairs:
        return {"system": system, "error": "no successful clean/injected pair of runs"}
    counts = {p["doc"]: p["n"] for p in make_parents(config)}
    triggers = len(config.poisoned)
    poisoned_children = sum(counts[doc] for doc in config.poisoned)
    siblings = poisoned_children - triggers
    suppressed = [poisoned_children - i["gpu_poisoned_records"] for _, i in pairs]
    non_trigger_clean = [c["gpu_records"] - triggers for c, _ in pairs]
    non_trigger_injected = [i["gpu_records"] - triggers for _, i in pairs]
    saved = [(c["e2e_s"] - i["e2e_s"]) / c["e2e_s"] for c, i in pairs]
    # The same without start-up (run start to the first UDF call), which on a busy
    # machine varies by seconds between runs and hides the effect being measured.
    spans = [(c["e2e_s"] - c["startup_s"], i["e2e_s"] - i["startup_s"]) for c, i in pairs]
    saved_after_startup = [(c - i) / c for c, i in spans]
    # rayorch only: from the run's own facts, the siblings not yet dispatched when each
    # barrier was installed, and how many of those never reached the UDF.
    barrier = [i["barriers"] for _, i in pairs if "barriers" in i]
    undispatched = [b["undispatched_at_barrier"] for b in barrier]
    before_dispatch = [b["suppressed_before_dispatch"] for b in barrier]
    return {
        "system": system,
        "pairs": len(pairs),
        "undispatched_at_barrier_median": statistics.median(undispatched) if barrier else None,
        "suppressed_before_dispatch_median": (
            statistics.median(before_dispatch) if barrier else None),
        "undispatched_suppressed_share": (
            sum(before_dispatch) / sum(undispatched) if barrier and sum(undispatched) else None),
        "poisoned_parents": triggers,
        "poisoned_siblings": siblings,
        "suppressed_siblings_median": statistics.median(suppressed),
        "suppressed_share": statistics.median(suppressed) / siblings if siblings else 0.0,
        "non_trigger_udf_records_clean": statistics.median(non_trigger_clean),
        "non_trigger_udf_records_injected": statistics.median(non_trigger_injected),
        "e2e_clean_s": statistics.median(c["e2e_s"] for c, _ in pairs),
        "e2e_injected_s": statistics.median(i["e2e_s"] for _, i in pairs),
        "time_saved_mean": statistics.mean(saved),
        "time_saved_min": min(saved),
        "time_saved_max": max(saved),
        "time_saved_after_startup_mean": statistics.mean(saved_after_startup),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_config_args(parser, parents=300, reps=3, name="failure")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(PEER_SYSTEMS))
    parser.add_argument("--poison-fraction", type=float, default=PAPER_POISON_FRACTION,
                        help="share of the parents (the largest) to poison")
    args = parser.parse_args(argv)

    clean = config_from_args(args)
    parents = make_parents(clean)
    poisoned = largest_parents(parents, args.poison_fraction)
    injected = clean.replace(poisoned=poisoned)
    total = sum(p["n"] for p in parents)
    share = sum(p["n"] for p in parents if p["doc"] in set(poisoned)) / total
    print(f"poisoning {len(poisoned)} of {len(parents)} parents "
          f"({len(poisoned) / len(parents):.2%}), holding {share:.1%} of {total} children",
          flush=True)

    variants = []
    for system in args.systems:
        variants += [Variant(f"{system}-clean", system, clean),
                     Variant(f"{system}-injected", system, injected)]
    runs = run_interleaved(variants, args.reps, args.out_dir, args.timeout)
    reports = [failure_report(s, injected, runs[f"{s}-clean"], runs[f"{s}-injected"])
               for s in args.systems]

    rows = []
    for r in reports:
        if "error" in r:
            rows.append([r["system"], "failed", "-", "-", "-", "-", "-"])
            continue
        share = r.get("undispatched_suppressed_share")
        rows.append([
            r["system"],
            "n/a (no lineage)" if share is None else
            f"{r['suppressed_before_dispatch_median']:.0f} / "
            f"{r['undispatched_at_barrier_median']:.0f} ({share:.1%})",
            f"{r['suppressed_siblings_median']:.0f} / {r['poisoned_siblings']} "
            f"({r['suppressed_share']:.1%})",
            f"{r['non_trigger_udf_records_clean']:.0f} -> "
            f"{r['non_trigger_udf_records_injected']:.0f}",
            f"{r['e2e_clean_s']:.2f} -> {r['e2e_injected_s']:.2f}",
            f"{r['time_saved_mean']:.2%} [{r['time_saved_min']:.2%}, {r['time_saved_max']:.2%}]",
            f"{r['time_saved_after_startup_mean']:.2%}",
        ])
    print(format_table(["system", "not-yet-dispatched siblings suppressed",
                        "siblings never run", "non-trigger UDF records",
                        "median E2E s", "paired time saved (mean [min, max])",
                        "saved after start-up"], rows))

    report = {"benchmark": "failure", "config": injected.to_json(), "poisoned_share": share,
              "reps": args.reps, "systems": reports, "runs": runs}
    out = args.out_dir / "failure.json"
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
