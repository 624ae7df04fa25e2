"""Pools that size themselves, in the simulator: against the best and the default static split.

``python bench/pool_sizing.py`` simulates the region grain (``bench/simulator/regions.py``:
render -> layout (GPU, per page) -> recognize (GPU, per region) -> assemble) over the
paper's corpus shape (long-tailed 1-427 pages, 47.4 a document; ``--docs`` documents,
default 461 = an eighth of the paper's 3,689), born-digital and scanned, on 8 and 64 GPUs:

* ``auto``: both model stages ``replicas=(1, G-1)``, the default sizing settings (no
  tuning), model actors 30 virtual seconds to start;
* the best static split, by a grid search over the layout GPUs (every split on 8 GPUs;
  on 64 every 8th, then every one within 3 of the best, until the best has both
  neighbours run);
* the default static split: half the GPUs each.

It also times the policy alone (``plan_sizes``) for 2, 8 and 32 stages. Tables go to stdout
(markdown), rows to ``<out>/pool_sizing.json``. ``--quick``: a small corpus, for the tests.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.simulator.regions import RegionConfig, corpus, simulate
from rayorch.core.pool_sizing import SizingSettings, StageLoad, plan_sizes

CORPORA = ("born-digital", "scanned")
AUTO: int | str = "auto"


def run_one(kind: str, docs: int, gpus: int, split: int | str) -> dict[str, Any]:
    """One simulated run: its makespan and what its pools held and did."""
    config = RegionConfig(gpus=gpus, layout_gpus=split)
    result = simulate(config, corpus(kind, docs=docs))
    row: dict[str, Any] = {
        "corpus": kind, "docs": docs, "gpus": gpus, "split": split,
        "makespan_s": result.makespan_s, "wall_s": result.wall_s,
        "gpu_actor_s": result.actor_s["layout"] + result.actor_s["recognize"],
    }
    if result.sizer is not None:
        sizer = result.sizer
        row.update(decisions=sizer.decisions, changes=len(sizer.history),
                   decision_ms=1e3 * sizer.decision_s / max(1, sizer.decisions),
                   binding=sizer.binding(),
                   sizes={m: sizer.size_over_time(m) for m in ("layout", "recognize")})
    return row


def first_pass(gpus: int) -> list[int]:
    """The grid search's first splits: every one on a few GPUs, every 8th on more."""
    return list(range(1, gpus)) if gpus <= 16 else list(range(8, gpus, 8))


def sweep(cases: list[tuple[str, int]], docs: int, pool: ProcessPoolExecutor
          ) -> list[dict[str, Any]]:
    """Every case's static splits (grid search), its default split and ``auto``. After the
    first pass, every split within 3 of the best so far, again until the best has both
    neighbours run (the makespan is about unimodal in the split). The runs of one pass go
    to the pool together."""
    rows: list[dict[str, Any]] = []
    todo: list[tuple[str, int, int | str]] = [
        (kind, gpus, k) for kind, gpus in cases
        for k in dict.fromkeys([*first_pass(gpus), gpus // 2, AUTO])]
    while todo:
        args = [(kind, docs, gpus, k) for kind, gpus, k in todo]
        rows += pool.map(run_one, *zip(*args, strict=True))
        todo = []
        for kind, gpus in cases:
            mine = [r for r in rows if (r["corpus"], r["gpus"]) == (kind, gpus)]
            done = {r["split"] for r in mine}
            best = min((r for r in mine if r["split"] != "auto"),
                       key=lambda r: r["makespan_s"])["split"]
            todo += [(kind, gpus, k) for k in range(best - 3, best + 4)
                     if 0 < k < gpus and k not in done]
    return rows


def policy_cost(repeats: int = 2000) -> list[dict[str, Any]]:
    """Microseconds per ``plan_sizes`` call for 2, 8 and 32 backed-up GPU stages."""
    out = []
    for count in (2, 8, 32):
        stages = [StageLoad(f"s{i}", 2, 1, 64, {"GPU": 1.0}, backlog=100 * (i + 1),
                            in_flight=32, coming=50.0 * i, item_cost_s=0.1 + 0.05 * i,
                            batch_size=16) for i in range(count)]
        free = {"GPU": 4.0}
        settings = SizingSettings()
        started = time.perf_counter()
        for _ in range(repeats):
            plan_sizes(stages, free, settings)
        out.append({"stages": count,
                    "us_per_decision": 1e6 * (time.perf_counter() - started) / repeats})
    return out


def tables(rows: list[dict[str, Any]], cost: list[dict[str, Any]]) -> str:
    lines = ["| corpus | GPUs | best static split (layout:recognize) | best static (s) | "
             "default split | default (s) | auto (s) | auto / best | auto / default | "
             "auto GPU actor-s / best's | decisions | changes | bound by |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for kind in CORPORA:
        for gpus in sorted({r["gpus"] for r in rows}):
            mine = [r for r in rows if r["corpus"] == kind and r["gpus"] == gpus]
            if not mine:
                continue
            static = [r for r in mine if r["split"] != "auto"]
            best = min(static, key=lambda r: r["makespan_s"])
            default = next(r for r in static if r["split"] == gpus // 2)
            auto = next(r for r in mine if r["split"] == "auto")
            lines.append(
                f"| {kind} | {gpus} | {best['split']}:{gpus - best['split']} | "
                f"{best['makespan_s']:,.0f} | {gpus // 2}:{gpus - gpus // 2} | "
                f"{default['makespan_s']:,.0f} | {auto['makespan_s']:,.0f} | "
                f"{auto['makespan_s'] / best['makespan_s']:.3f} | "
                f"{auto['makespan_s'] / default['makespan_s']:.3f} | "
                f"{auto['gpu_actor_s'] / best['gpu_actor_s']:.3f} | {auto['decisions']} | "
                f"{auto['changes']} | {auto['binding']} |")
    lines += ["", "| stages | policy cost per decision (µs) |", "|---:|---:|"]
    lines += [f"| {c['stages']} | {c['us_per_decision']:.0f} |" for c in cost]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=461)
    parser.add_argument("--gpus", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--corpus", nargs="+", default=list(CORPORA), choices=CORPORA)
    parser.add_argument("--jobs", type=int, default=1, help="simulations run at once")
    parser.add_argument("--out", type=Path, default=Path("bench/out/pool_sizing"))
    parser.add_argument("--quick", action="store_true", help="40 documents, 4 GPUs")
    args = parser.parse_args(argv)
    if args.quick:
        args.docs, args.gpus = 40, [4]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = sweep([(kind, gpus) for kind in args.corpus for gpus in args.gpus], args.docs,
                     pool)
    print(f"{len(rows)} simulations in {time.perf_counter() - started:.0f}s",
          file=sys.stderr, flush=True)
    cost = policy_cost()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pool_sizing.json").write_text(json.dumps(
        {"rows": rows, "policy_cost": cost, "docs": args.docs}, indent=1))
    print(tables(rows, cost))


if __name__ == "__main__":
    main()
