"""What every system runner shares: Ray start-up, the arrival log, metrics, subprocess runs."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.workload import BenchConfig, BenchError, load_traces, lower_bound, make_parents, verify

REPO_ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = ("rayorch", "raydata", "daft", "rayorch-warm")
"""``rayorch-warm``: rayorch on an ``ro.Executor`` whose actors a first run started."""
PEER_SYSTEMS = ("rayorch", "raydata", "daft")
"""Each system once, from a cold start."""


def init_ray(config: BenchConfig) -> None:
    """Start an in-process local Ray with the declared resources every system gets."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # The runners import ``bench``; workers must find it too. Through the environment Ray's
    # workers inherit (not a job runtime_env): then the idle workers Ray starts ahead serve
    # the first actors and tasks of every system alike.
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    concurrency = (config.cpus if config.ray_startup_concurrency is None
                   else config.ray_startup_concurrency)
    if concurrency > 0:
        os.environ["RAY_worker_maximum_startup_concurrency"] = str(concurrency)  # noqa: SIM112
    import ray

    ray.init(
        address="local",
        num_cpus=config.cpus,
        num_gpus=config.gpus,
        include_dashboard=False,
        log_to_driver=False,
    )
    time.sleep(config.ray_settle_s)


@dataclass
class ArrivalLog:
    """When each parent result reached the driver, relative to the run's start ``t0``."""

    t0: float = field(default_factory=time.time)
    arrivals: list[tuple[int, float, dict[str, Any] | None]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # system-specific measurements

    def restart(self) -> None:
        self.t0 = time.time()

    def arrived(self, doc: int, result: dict[str, Any] | None) -> None:
        self.arrivals.append((int(doc), time.time() - self.t0, result))


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) by linear interpolation; ``nan`` for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def trace_totals(trace_dir: Path, t0: float) -> dict[str, float]:
    """From the traces: start-up (run start to the first UDF call), the first GPU batch's
    start, and GPU UDF counts."""
    lines = [t for t in load_traces(trace_dir) if t["start"] >= t0]  # not a warm-up run's
    gpu = [t for t in lines if t["stage"] == "gpu"]
    return {
        "startup_s": lines[0]["start"] - t0 if lines else float("nan"),
        "first_gpu_s": min(t["start"] for t in gpu) - t0 if gpu else float("nan"),
        "gpu_calls": len(gpu),
        "gpu_records": sum(t["records"] for t in gpu),
        "gpu_poisoned_records": sum(t["poisoned"] for t in gpu),
    }


def summarize(system: str, config: BenchConfig, log: ArrivalLog, trace_dir: Path) -> dict[str, Any]:
    """One run's record: metrics, lower bound, correctness; raises if the output is wrong."""
    parents = make_parents(config)
    check = verify(config, parents, ((doc, result) for doc, _, result in log.arrivals))
    if not check.ok:
        raise BenchError(f"{system} produced wrong output ({len(check.wrong)} problems): "
                         + "; ".join(check.wrong[:5]))
    times = [t for _, t, _ in log.arrivals]
    bound = lower_bound(config, parents)
    return {
        "system": system,
        "config": config.to_json(),
        "t0": log.t0,
        "e2e_s": max(times),
        "first_parent_s": min(times),
        "p50_parent_s": percentile(times, 0.5),
        "p99_parent_s": percentile(times, 0.99),
        "lower_bound_s": bound.total_s,
        "correct_parents": check.correct,
        "failed_parents": check.failed_as_expected,
        "children": sum(p["n"] for p in parents),
        "trace_dir": str(trace_dir),
        "arrivals_s": sorted(times),
        **trace_totals(trace_dir, log.t0),
        **log.extra,
    }


def run_in_subprocess(
    system: str, config: BenchConfig, out_dir: Path, tag: str, timeout_s: float = 180.0
) -> dict[str, Any]:
    """Run one system once in a fresh Python process; returns its ``summarize`` record."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{tag}.json"
    trace_dir = out_dir / f"{tag}-trace"
    cmd = [
        sys.executable, "-m", "bench.peers.run_one", "--system", system,
        "--config", json.dumps(config.to_json()), "--out", str(out), "--trace-dir", str(trace_dir),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0"}
    log_path = out_dir / f"{tag}.log"
    with log_path.open("w") as log_file:
        try:
            proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, stdout=log_file,
                                  stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise BenchError(f"{system} run {tag} took over {timeout_s:.0f}s; see {log_path} "
                             "(lower --parents or raise --timeout)") from None
    if proc.returncode != 0 or not out.exists():
        tail = log_path.read_text()[-2000:]
        raise BenchError(f"{system} run {tag} failed (exit {proc.returncode}); "
                         f"log {log_path}:\n{tail}")
    record: dict[str, Any] = json.loads(out.read_text())
    return record


def median_of(records: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in records))


@dataclass(frozen=True)
class Variant:
    """One column of a benchmark: a label, the system to run and its configuration."""

    label: str
    system: str
    config: BenchConfig


def run_interleaved(
    variants: list[Variant], reps: int, out_dir: Path, timeout_s: float
) -> dict[str, list[dict[str, Any]]]:
    """Each variant ``reps`` times, interleaved (v1 v2 v3 v1 v2 v3 …), each in a fresh process.

    A failed run is kept as ``{"error": message}`` so one broken system does not stop
    the others; its message is printed as it happens.
    """
    runs: dict[str, list[dict[str, Any]]] = {v.label: [] for v in variants}
    for rep in range(reps):
        for variant in variants:
            tag = f"{variant.label}-rep{rep}"
            print(f"[{time.strftime('%H:%M:%S')}] {tag} ...", flush=True)
            try:
                record = run_in_subprocess(variant.system, variant.config, out_dir, tag, timeout_s)
            except BenchError as exc:
                print(f"  FAILED: {exc}", flush=True)
                runs[variant.label].append({"error": str(exc)})
                continue
            print(f"  e2e {record['e2e_s']:.2f}s, first parent {record['first_parent_s']:.2f}s, "
                  f"{record['correct_parents']} correct", flush=True)
            runs[variant.label].append(record)
    return runs


def medians(records: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, float] | None:
    """Median of each key over the successful records; ``None`` when every run failed."""
    ok = [r for r in records if "error" not in r]
    if not ok:
        return None
    return {key: median_of(ok, key) for key in keys}


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """A plain fixed-width text table."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(c).rjust(w) for c, w in zip(header, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).rjust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def ratio(value: float | None, base: float | None) -> str:
    """``value/base`` as ``1.23x``, or ``n/a``."""
    if value is None or base is None or base <= 0:
        return "n/a"
    return f"{value / base:.2f}x"


def add_config_args(parser: argparse.ArgumentParser, *, parents: int, reps: int, name: str) -> None:
    """The options every harness takes: workload size, GPUs, batch, repetitions, output."""
    defaults = BenchConfig()
    parser.add_argument("--parents", type=int, default=parents, help="source parents")
    parser.add_argument("--max-children", type=int, default=defaults.max_children)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--gpus", type=int, default=defaults.gpus, help="G: GPU actors")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size, help="B")
    parser.add_argument("--gpu-a", type=float, default=defaults.gpu_a,
                        help="fixed seconds per GPU batch (a in a + b*B)")
    parser.add_argument("--gpu-b", type=float, default=defaults.gpu_b,
                        help="seconds per record of a GPU batch (b in a + b*B)")
    parser.add_argument("--reps", type=int, default=reps, help="repetitions per system")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per run")
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench" / "out" / name)
    parser.add_argument("--ray-startup-concurrency", type=int, default=None,
                        help="Ray's worker_maximum_startup_concurrency (default: --cpus, so "
                             "Ray prestarts a worker per declared CPU; 0: Ray's own default)")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    return BenchConfig(parents=args.parents, max_children=args.max_children, seed=args.seed,
                       gpus=args.gpus, batch_size=args.batch_size, gpu_a=args.gpu_a,
                       gpu_b=args.gpu_b, ray_startup_concurrency=args.ray_startup_concurrency)
