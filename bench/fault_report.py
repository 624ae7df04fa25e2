"""What the fault harness (``bench/faults.py``) checks of one replica run, and its report.

A replica run is checked against the reference interpreter: its sink files (``read_outputs``)
must hold every source once with the reference's value, the store one ``OutputEmitted`` per
source, and ``rayorch audit`` must say OK.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any


def replica_outcome(store: Any, run_id: str, out_dir: Path, docs: list[str],
                    kills: list[tuple[float, str, list[int]]]) -> dict[str, Any]:
    """Lost, duplicated and wrong sources of one replica run, its re-run Grains, the recovery
    time of each driver kill of this run (kill -> every shard it held leased again) and the
    audit's problems."""
    from bench.fault_callers import cli_audit
    from bench.faults import FaultPipeline
    from rayorch.core.facts import GrainRetried, LeaseAcquired, OutputEmitted
    from rayorch.core.reference import evaluate
    from rayorch.runtime.sinks import read_outputs

    reference = evaluate(FaultPipeline(gpu_ms=0).compile(), [(d,) for d in docs]).outputs
    problems: list[str] = []
    try:
        files = {record["index"]: record for record in read_outputs(out_dir)}
    except Exception as exc:
        files = {}
        problems.append(f"read_outputs refused {out_dir}: {exc}")
    emitted: Counter[int] = Counter()
    retried: Counter[str] = Counter()
    leases: list[tuple[float, int, str]] = []
    for shard, facts in store.read_run(run_id).items():
        for stored in facts:
            fact = stored.fact
            if isinstance(fact, OutputEmitted):
                emitted[fact.index] += 1
            elif isinstance(fact, GrainRetried):
                key = "driver failover" if fact.cause == "driver failover" else (
                    "actor died" if "died" in fact.cause or "replaced" in fact.cause
                    else "other")
                retried[key] += 1
            elif isinstance(fact, LeaseAcquired):
                leases.append((fact.ts, shard, fact.driver))
    wrong = []
    for index, items in reference.items():
        record = files.get(index)
        item = items[0]
        if record is None:
            continue
        if item.present != (record["outcome"] == "present") or (
                item.present and record["value"] != item.value):
            wrong.append(index)
    recovery = []
    for t_kill, victim, held in kills:
        waits = [min((ts for ts, k, d in leases if k == shard and ts > t_kill and d != victim),
                     default=float("nan")) - t_kill for shard in held]
        if waits:
            recovery.append(round(max(waits), 2))
    problems += cli_audit(store.url, run_id, None)  # `rayorch audit RUN` (+ its sink)
    return {
        "lost": sorted(set(reference) - {i for i in files if emitted[i] >= 1}),
        "duplicated": sorted(i for i, n in emitted.items() if n > 1),
        "wrong": wrong, "retried": retried, "recovery": recovery, "problems": problems,
    }


def report(result: dict[str, Any]) -> str:
    rec = result["recovery_s"]
    finite = [r for r in rec if r == r]
    runs = result["runs"]
    lines = [
        f"replica run{'s' if len(runs) > 1 else ''} {', '.join(runs)}: {result['docs']} docs "
        f"each; {result['caller_runs']} caller runs of "
        f"{result['caller_sources'] // max(result['caller_runs'], 1)} sources "
        f"({result['caller_threads']} at a time); {result['elapsed_s']}s "
        f"({result['drivers_started']} replica drivers and {result['resumes']} resumes started)",
        "faults injected: " + (", ".join(f"{k} {n}" for k, n in sorted(result["faults"].items()))
                               or "none"),
        f"driver kills: {result['driver_kills']} (replica drivers, callers and resumes)",
        f"deposed wake-ups: {result['deposed_wakeups']}",
        f"lost replies: {result['lost_replies']}",
        f"redis restarts: {result['redis_restarts']}, rollbacks: {result['rollbacks']} "
        f"(drivers that saw the store go back and rebuilt: {result['rollbacks_seen']})",
        f"outputs lost: {result['outputs_lost']}",
        f"outputs duplicated beyond one re-delivery per interrupted caller: "
        f"{result['outputs_duplicated']} (re-delivered, allowed: "
        f"{result['caller_redelivered']}; callers printed {result['caller_printed']})",
        f"caller outputs re-delivered because a rollback forgot their acknowledgement: "
        f"{result['caller_rolled_back']}",
        f"outputs different from the reference: {result['outputs_wrong']}",
        "grains re-run: " + (", ".join(f"{k} {n}" for k, n in sorted(
            result["grains_rerun"].items())) or "none"),
        "recovery per driver failover (s, kill -> shards re-leased): " + (
            ", ".join(f"{r:.2f}" for r in rec) or "-")
        + (f"  [median {sorted(finite)[len(finite) // 2]:.2f}, max {max(finite):.2f}]"
           if finite else ""),
        f"audit: {'OK' if result['audit_ok'] else 'FAILED ' + str(result['audit_violations'])}",
    ]
    return "\n".join(lines)


__all__ = ["replica_outcome", "report"]
