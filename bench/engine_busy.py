"""Engine busy fraction of a model stage: one batch in flight per actor versus several.

The busy fraction is the time with at least one request inside the engine, divided by the
stage's wall time after start-up (from each actor's first batch to its last), summed over
the actors. Beside it: the engine's mean occupancy (running requests / ``max_seqs`` while
busy), which says how well the busy time was used, and the stage's throughput.

``python bench/engine_busy.py sim`` drives the real kernel in the virtual-clock simulator
(``bench/simulator/llm.py``) on the PDF pipeline with long-tailed output lengths per page;
``python bench/engine_busy.py real --model DIR`` runs a real vLLM engine on this machine's
CPU (``bench/engine_real.py``). ``--quick`` makes either small.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.simulator.corpus import long_tail_counts
from bench.simulator.engine import Simulator
from bench.simulator.llm import EngineModel
from bench.simulator.paper import SimConfig, cost_model, plan_for, sources

MODES: tuple[tuple[str, int, int], ...] = (
    ("sync generate, 1 batch per actor (depth 1)", 1, 1),
    ("sync generate, 1 running + 1 queued (rayorch's default)", 1, 2),
    ("max_inflight=4 (async engine)", 4, 5),
    ("max_inflight=8 (async engine)", 8, 9),
)


def page_tokens(seed: int, median: float = 150.0, sigma: float = 1.0,
                low: int = 4, high: int = 2048) -> Any:
    """Output tokens per page ``(doc, ordinal)``: lognormal (a blank page ~ a few tokens,
    a dense one ~ 2k), deterministic in the page and the seed."""

    def tokens(row: tuple[Any, ...]) -> int:
        doc, ordinal = row[0]
        rng = random.Random(seed * 1_000_003 + doc * 4099 + ordinal)
        return int(min(high, max(low, rng.lognormvariate(0.0, sigma) * median)))

    return tokens


def simulate_modes(counts: list[int], gpus: int, batch_size: int,
                   latency_s: float, seed: int) -> list[dict[str, Any]]:
    config = SimConfig(gpus=gpus, batch_size=batch_size)
    plan = plan_for(config)
    rows = []
    for name, inflight, depth in MODES:
        model = EngineModel(page_tokens(seed), latency_s=latency_s, inflight=inflight,
                            depth=depth)
        result = Simulator(plan, cost_model(config), engines={"gpu": model}).run(
            sources(counts))
        bad = [i for i, items in result.outputs.items()
               if not items[0].present or items[0].value != (counts[i], True)]
        if bad or len(result.outputs) != len(counts):
            raise SystemExit(f"{name}: wrong outputs for docs {bad[:5]}")
        pool = result.engines["gpu"]
        windows = [(a.first_s or 0.0, a.end_s) for a in pool.actors]
        stage_s = max(end for _, end in windows) - min(start for start, _ in windows)
        rows.append({
            "mode": name, "max_inflight": inflight, "depth": depth,
            "busy_fraction": pool.busy_fraction(), "occupancy": pool.occupancy(),
            "tokens_per_s": pool.tokens_per_s(), "makespan_s": result.makespan_s,
            "pages_per_s": sum(counts) / stage_s,
        })
    base = rows[1]["pages_per_s"]
    for row in rows:
        row["speedup_vs_default"] = row["pages_per_s"] / base
    return rows


def print_sim(rows: list[dict[str, Any]]) -> None:
    print("| mode | busy fraction | occupancy | pages/s | x default | tokens/s | makespan s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['mode']} | {r['busy_fraction']:.1%} | {r['occupancy']:.1%} | "
              f"{r['pages_per_s']:.2f} | {r['speedup_vs_default']:.2f}x | "
              f"{r['tokens_per_s']:.0f} | {r['makespan_s']:.0f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sim = sub.add_parser("sim", help="the virtual-clock simulator")
    sim.add_argument("--quick", action="store_true")
    sim.add_argument("--gpus", type=int, default=4)
    sim.add_argument("--batch-size", type=int, default=16)
    sim.add_argument("--latency-ms", type=float, default=10.0,
                     help="one way, driver <-> actor (Ray's round trip, the commit)")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--out", type=Path, default=Path("bench/out"))
    real = sub.add_parser("real", help="a real vLLM engine on this machine")
    from bench.engine_real import add_arguments
    add_arguments(real)
    args = parser.parse_args(argv)
    if args.what == "real":
        from bench.engine_real import run_real
        return run_real(args)
    parents, total, high = (40, 600, 60) if args.quick else (400, 8000, 200)
    counts = long_tail_counts(parents=parents, total=total, low=1, high=high, seed=args.seed)
    print(f"simulator: {parents} docs, {total} pages (1..{high} per doc), {args.gpus} engines, "
          f"batch {args.batch_size}, output tokens lognormal (median 150, 4..2048), "
          f"latency {args.latency_ms:g} ms each way")
    rows = simulate_modes(counts, args.gpus, args.batch_size, args.latency_ms / 1000, args.seed)
    print_sim(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine_busy_sim.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
