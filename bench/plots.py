"""Plots: per-system stage timelines and a scaling curve.

``python -m bench.plots timeline bench/out/fanout/fanout.json`` draws, for the first
successful run of each system, the windows in which each stage was active (union of
its UDF calls, from the run's trace files) and the parents completed over time, one
PNG per system plus one figure with all systems on a shared time axis.
``python -m bench.plots timeline bench/out/fanout/raydata-rep0.json`` draws one run.

``python -m bench.plots scaling points.json`` draws speedup against GPUs with the ideal
line; ``points.json`` is ``[{"gpus": 4, "e2e_s": 900.0}, ...]`` (or ``{"points": [...]}``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: before pyplot is imported
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from bench.workload import load_traces

STAGES = ("render", "gpu", "assemble")
COLORS = {"render": "tab:blue", "gpu": "tab:orange", "assemble": "tab:green"}


def active_windows(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals, as sorted disjoint ``(start, end)`` pairs."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def stage_windows(record: dict[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """Per stage, its active windows in seconds since the run's start."""
    t0 = record["t0"]
    by_stage: dict[str, list[tuple[float, float]]] = {stage: [] for stage in STAGES}
    for line in load_traces(record["trace_dir"]):
        by_stage.setdefault(line["stage"], []).append((line["start"] - t0, line["end"] - t0))
    return {stage: active_windows(intervals) for stage, intervals in by_stage.items()}


def draw_timeline(ax: Axes, record: dict[str, Any], x_max: float | None = None) -> None:
    """Stage windows as bars, parents completed as a line, E2E as a dashed line."""
    windows = stage_windows(record)
    stages = [s for s in windows if windows[s]]
    for row, stage in enumerate(stages):
        spans = [(start, end - start) for start, end in windows[stage]]
        ax.broken_barh(spans, (row - 0.35, 0.7), color=COLORS.get(stage, "tab:gray"))
    ax.set_yticks(range(len(stages)), stages)
    ax.set_ylim(-0.6, len(stages) - 0.4)
    ax.axvline(record["e2e_s"], color="black", linestyle="--", linewidth=1)
    done = ax.twinx()
    arrivals = record.get("arrivals_s", [])
    done.step(arrivals, range(1, len(arrivals) + 1), where="post", color="tab:red", linewidth=1)
    done.set_ylabel("parents done", color="tab:red")
    done.set_ylim(0, max(1, len(arrivals)) * 1.05)
    ax.set_xlim(0, x_max if x_max is not None else record["e2e_s"] * 1.03)
    ax.set_title(f"{record['system']}: E2E {record['e2e_s']:.1f}s "
                 f"(lower bound {record['lower_bound_s']:.1f}s)", fontsize=10)


def first_runs(report_or_run: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs to draw: a run record itself, or the first successful run of each system."""
    if "runs" not in report_or_run:
        return [report_or_run]
    chosen = []
    for records in report_or_run["runs"].values():
        ok = [r for r in records if "error" not in r]
        if ok:
            chosen.append(ok[0])
    return chosen


def plot_timelines(path: Path, out_dir: Path) -> list[Path]:
    """One PNG per drawn run and, for several, one with all on a shared time axis."""
    records = first_runs(json.loads(path.read_text()))
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for record in records:
        fig, ax = plt.subplots(figsize=(9, 2.6))
        draw_timeline(ax, record)
        ax.set_xlabel("seconds since run start")
        fig.tight_layout()
        run_tag = Path(record["trace_dir"]).name.removesuffix("-trace")
        out = out_dir / f"timeline-{run_tag}.png"
        fig.savefig(out, dpi=120)
        plt.close(fig)
        written.append(out)
    if len(records) > 1:
        x_max = max(r["e2e_s"] for r in records) * 1.03
        fig, axes = plt.subplots(len(records), 1, figsize=(9, 2.3 * len(records)), sharex=True)
        for ax, record in zip(axes, records):
            draw_timeline(ax, record, x_max)
        axes[-1].set_xlabel("seconds since run start")
        fig.tight_layout()
        out = out_dir / f"timelines-{path.stem}.png"
        fig.savefig(out, dpi=120)
        plt.close(fig)
        written.append(out)
    return written


def plot_scaling(path: Path, out_dir: Path) -> Path:
    """Speedup over the smallest GPU count, with the ideal linear speedup."""
    data = json.loads(path.read_text())
    points = sorted(data["points"] if isinstance(data, dict) else data, key=lambda p: p["gpus"])
    base = points[0]
    gpus = [p["gpus"] for p in points]
    speedup = [base["e2e_s"] / p["e2e_s"] for p in points]
    ideal = [g / base["gpus"] for g in gpus]
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(gpus, ideal, "--", color="gray", label="ideal")
    ax.plot(gpus, speedup, "o-", label="measured")
    for g, s, i in zip(gpus, speedup, ideal):
        ax.annotate(f"{s:.2f}x ({s / i:.0%})", (g, s), textcoords="offset points",
                    xytext=(4, -12), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel(f"speedup over {base['gpus']} GPUs")
    ax.legend()
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"scaling-{path.stem}.png"
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("timeline", "scaling"))
    parser.add_argument("path", type=Path, help="a report or run JSON (timeline) or points")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="where the PNGs go (default: beside the input)")
    args = parser.parse_args(argv)
    out_dir = args.out_dir or args.path.parent
    if args.kind == "timeline":
        written = plot_timelines(args.path, out_dir)
    else:
        written = [plot_scaling(args.path, out_dir)]
    for path in written:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
