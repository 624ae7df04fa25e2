"""Virtual-clock scaling curve: the real kernel scheduling the paper's corpus on 1..64 GPUs.

``python bench/sim.py`` simulates the PDF pipeline (render -> expand -> GPU -> reduce ->
assemble, see ``bench/simulator/paper.py``) over the paper's MinerU corpus shape (3,689
PDFs, 174,744 pages, 1..427 pages each, ``bench/simulator/corpus.py``) on 1, 4, 8, 16, 32
and 64 GPU actors, then sweeps the source admission bound ``max_active_sources`` at the
largest GPU count. It prints one table per part (markdown), writes ``<out>/sim.json`` and
``<out>/sim_scaling.png`` (plus a copy at ``--figure``).

``python bench/sim.py --quick`` runs a small corpus (a few seconds) for the tests.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.simulator.corpus import corpus_stats, long_tail_counts
from bench.simulator.engine import SimResult
from bench.simulator.paper import (
    SimConfig,
    lower_bound,
    paper_counts,
    simulate,
    strict_lower_bound,
)

FULL_GPUS = (1, 4, 8, 16, 32, 64)
QUICK_GPUS = (1, 2, 4, 8)
FULL_SWEEP: tuple[int | None, ...] = (16, 32, 64, 128, 256, 1024, None)
QUICK_SWEEP: tuple[int | None, ...] = (4, 16, None)
# The paper's measured MinerU speed-ups over 4 GPUs (real cluster, for comparison only).
PAPER_SPEEDUPS = {4: 1.0, 8: 2.02, 16: 4.01, 32: 7.92, 64: 15.14}


def measure(config: SimConfig, counts: list[int]) -> tuple[dict[str, Any], SimResult]:
    """One simulated run and its summary row."""
    result = simulate(config, counts)
    bad = [i for i, items in result.outputs.items()
           if not items[0].present or items[0].value != (counts[i], True)]
    if bad or len(result.outputs) != len(counts):
        raise SystemExit(f"simulation produced wrong outputs for docs {bad[:5]} "
                         f"({len(result.outputs)}/{len(counts)} docs came back)")
    bound = lower_bound(config, counts)
    sizes = result.batch_sizes("gpu")
    done = sorted(result.completion_s.values())
    row = {
        "gpus": config.gpus,
        "max_active_sources": config.max_active_sources,
        "makespan_s": result.makespan_s,
        "bound_s": bound.total_s,
        "ratio_to_bound": result.makespan_s / bound.total_s,
        "strict_bound_s": strict_lower_bound(config, counts).total_s,
        "gpu_utilization": result.utilization("gpu"),
        "gpu_batches": len(sizes),
        "mean_batch": statistics.fmean(sizes),
        "first_gpu_s": min(b.start_s for b in result.batches if b.call == "gpu"),
        "p50_parent_s": done[len(done) // 2],
        "wall_s": result.wall_s,
        **gpu_idle_breakdown(result),
    }
    return row, result


def gpu_idle_breakdown(result: SimResult) -> dict[str, float]:
    """Mean idle seconds per GPU actor: before its first batch, between batches, after its last.

    ``after_last_gpu_s`` is the time from the last GPU batch's end to the run's end (the
    last parents' assembly), which every GPU waits through.
    """
    gpus = result.actors["gpu"]
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    busy: dict[int, float] = {}
    for b in result.batches:
        if b.call == "gpu":
            first[b.actor] = min(first.get(b.actor, b.start_s), b.start_s)
            last[b.actor] = max(last.get(b.actor, b.end_s), b.end_s)
            busy[b.actor] = busy.get(b.actor, 0.0) + b.end_s - b.start_s
    gpu_end = max(last.values())
    head = sum(first.get(a, gpu_end) for a in range(gpus)) / gpus
    tail = sum(gpu_end - last.get(a, 0.0) for a in range(gpus)) / gpus
    between = max(0.0, sum(last[a] - first[a] - busy[a] for a in first) / gpus)
    return {"idle_before_first_s": head, "idle_between_s": between,
            "idle_tail_s": tail, "after_last_gpu_s": result.makespan_s - gpu_end}


def scaling_table(rows: list[dict[str, Any]], base_gpus: int) -> str:
    base = next((r for r in rows if r["gpus"] == base_gpus), rows[0])
    one = next((r for r in rows if r["gpus"] == 1), None)
    lines = [
        "| GPUs | makespan (virtual s) | hours | speed-up vs "
        f"{base['gpus']} | % of linear | speed-up vs 1 | bound (s) | makespan / bound "
        "| makespan / strict bound | GPU util | mean batch | wall (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        speedup = base["makespan_s"] / r["makespan_s"]
        linear = r["gpus"] / base["gpus"]
        vs_one = f"{one['makespan_s'] / r['makespan_s']:.2f}x" if one else "-"
        lines.append(
            f"| {r['gpus']} | {r['makespan_s']:,.1f} | {r['makespan_s'] / 3600:.2f} | "
            f"{speedup:.2f}x | {100 * speedup / linear:.1f}% | {vs_one} | "
            f"{r['bound_s']:,.1f} | {r['ratio_to_bound']:.4f} | "
            f"{r['makespan_s'] / r['strict_bound_s']:.4f} | "
            f"{100 * r['gpu_utilization']:.2f}% | {r['mean_batch']:.2f} | {r['wall_s']:.1f} |"
        )
    return "\n".join(lines)


def idle_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| GPUs | makespan - bound (s) | idle per GPU: before 1st batch (s) | between batches (s) "
        "| after its last batch (s) | last assemble after last GPU batch (s) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['gpus']} | {r['makespan_s'] - r['bound_s']:,.1f} | "
            f"{r['idle_before_first_s']:.2f} | {r['idle_between_s']:.2f} | "
            f"{r['idle_tail_s']:.2f} | {r['after_last_gpu_s']:.2f} |"
        )
    return "\n".join(lines)


def sweep_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| max_active_sources | GPUs | makespan (virtual s) | makespan / bound | GPU util "
        "| mean batch | p50 parent done (s) | wall (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        bound = "unbounded" if r["max_active_sources"] is None else r["max_active_sources"]
        lines.append(
            f"| {bound} | {r['gpus']} | {r['makespan_s']:,.1f} | {r['ratio_to_bound']:.4f} | "
            f"{100 * r['gpu_utilization']:.2f}% | {r['mean_batch']:.2f} | "
            f"{r['p50_parent_s']:,.1f} | {r['wall_s']:.1f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], base_gpus: int, largest: SimResult, path: Path) -> None:
    """Speed-up vs GPUs (with ideal) and the largest run's stage windows + parents done."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = next((r for r in rows if r["gpus"] == base_gpus), rows[0])
    scaled = [r for r in rows if r["gpus"] >= base["gpus"]]
    gpus = [r["gpus"] for r in scaled]
    speedup = [base["makespan_s"] / r["makespan_s"] for r in scaled]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.plot(gpus, [g / base["gpus"] for g in gpus], "--", color="gray", label="linear")
    left.plot(gpus, speedup, "o-", color="tab:orange", label="simulated (rayorch kernel)")
    if base["gpus"] == 4:
        paper = [(g, PAPER_SPEEDUPS[g]) for g in gpus if g in PAPER_SPEEDUPS]
        left.plot([g for g, _ in paper], [v for _, v in paper], "x", color="black",
                  label="paper, measured on H20s")
    for g, s in zip(gpus, speedup):
        left.annotate(f"{s:.2f}x ({100 * s / (g / base['gpus']):.1f}%)", (g, s),
                      textcoords="offset points", xytext=(6, -12), fontsize=8)
    left.set_ylim(0.8, max(speedup + [g / base["gpus"] for g in gpus]) * 1.4)
    left.set_xscale("log", base=2)
    left.set_yscale("log", base=2)
    left.set_xticks(gpus, [str(g) for g in gpus])
    left.set_xlim(min(gpus) / 1.3, max(gpus) * 1.6)
    left.set_xlabel("GPU actors")
    left.set_ylabel(f"speed-up vs {base['gpus']} GPUs")
    left.set_title("Strong scaling, 3,689 PDFs / 174,744 pages (virtual clock)")
    left.legend()
    stages = ["render", "gpu", "assemble"]
    colors = {"render": "tab:blue", "gpu": "tab:orange", "assemble": "tab:green"}
    for row, stage in enumerate(stages):
        spans = [(s, e - s) for s, e in largest.windows(stage)]
        right.broken_barh(spans, (row - 0.35, 0.7), color=colors[stage])
    right.set_yticks(range(len(stages)), stages)
    right.set_xlabel("virtual seconds")
    done = sorted(largest.completion_s.values())
    twin = right.twinx()
    twin.plot(done, range(1, len(done) + 1), color="black", linewidth=1)
    twin.set_ylabel("parents completed")
    right.axvline(largest.makespan_s, linestyle="--", color="gray")
    right.set_title(f"{largest.actors['gpu']} GPUs: stage windows and parents done")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_bound(text: str) -> int | None:
    return None if text in ("none", "None", "unbounded") else int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small corpus, 1..8 GPUs")
    parser.add_argument("--gpus", type=int, nargs="+", help="GPU counts to run")
    parser.add_argument("--base", type=int, help="GPU count speed-ups are relative to")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--policy", default="elastic", choices=["elastic", "parent_bound"])
    parser.add_argument("--max-active", type=parse_bound, default=256,
                        help="max_active_sources for the scaling runs (a number or 'none')")
    parser.add_argument("--sweep", type=parse_bound, nargs="*",
                        help="max_active_sources values to sweep at the largest GPU count")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="output folder (default bench/out/sim[-quick])")
    parser.add_argument("--figure", type=Path, help="also copy the PNG here")
    args = parser.parse_args(argv)

    if args.quick:
        counts = long_tail_counts(parents=120, total=5_000, seed=args.seed)
        gpu_counts = tuple(args.gpus or QUICK_GPUS)
        sweep = QUICK_SWEEP if args.sweep is None else tuple(args.sweep)
    else:
        counts = paper_counts(args.seed)
        gpu_counts = tuple(args.gpus or FULL_GPUS)
        sweep = FULL_SWEEP if args.sweep is None else tuple(args.sweep)
    base_gpus = args.base or (4 if 4 in gpu_counts else min(gpu_counts))
    out = args.out or Path("bench/out") / ("sim-quick" if args.quick else "sim")
    config = SimConfig(batch_size=args.batch, policy=args.policy,
                       max_active_sources=args.max_active)
    stats = corpus_stats(counts)
    print(f"corpus: {stats['parents']} parents, {stats['children']} children, "
          f"min {stats['min']} / median {stats['median']:.0f} / p90 {stats['p90']:.0f} / "
          f"p99 {stats['p99']:.0f} / max {stats['max']}, top 5% of parents hold "
          f"{100 * stats['top5pct_share']:.1f}% (seed {args.seed})")
    print(f"config: {json.dumps(asdict(config))}")
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    results: dict[int, SimResult] = {}
    for g in gpu_counts:
        row, result = measure(replace(config, gpus=g), counts)
        rows.append(row)
        results[g] = result
        print(f"  {g} GPUs: makespan {row['makespan_s']:,.1f} s, wall {row['wall_s']:.1f} s",
              flush=True)
    print(f"\nScaling (max_active_sources={config.max_active_sources}, "
          f"policy {config.policy}, B={config.batch_size}):\n")
    print(scaling_table(rows, base_gpus))
    print("\nWhere the GPUs' idle time goes (mean per GPU actor, virtual s):\n")
    print(idle_table(rows))
    largest = max(gpu_counts)
    sweep_rows: list[dict[str, Any]] = []
    for bound in sweep:
        if bound == config.max_active_sources:
            sweep_rows.append(next(r for r in rows if r["gpus"] == largest))
            continue
        row, _ = measure(replace(config, gpus=largest, max_active_sources=bound), counts)
        sweep_rows.append(row)
    if sweep_rows:
        print(f"\nAdmission bound sweep at {largest} GPUs:\n")
        print(sweep_table(sweep_rows))
    out.mkdir(parents=True, exist_ok=True)
    png = out / "sim_scaling.png"
    plot(rows, base_gpus, results[largest], png)
    if args.figure:
        args.figure.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, args.figure)
    report = {"corpus": stats, "config": asdict(config), "base_gpus": base_gpus,
              "scaling": rows, "sweep": sweep_rows}
    (out / "sim.json").write_text(json.dumps(report, indent=2))
    print(f"\nwrote {out / 'sim.json'} and {png}"
          + (f" (copy: {args.figure})" if args.figure else "")
          + f"; total wall {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
