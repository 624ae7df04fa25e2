"""Progress of a run from its stored facts: what ``rayorch status`` prints.

Reads only the store (facts, leases, the driver registry, the manifest); imports no
user code, so it works on any run, running, finished or abandoned.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.core.vocabulary import FAILOVER_CAUSE, Outcome
from rayorch.core.words import plural
from rayorch.runtime.manifest import RunManifest
from rayorch.runtime.pool_sizer import pool_changes, pool_lines
from rayorch.store.base import LineageStore
from rayorch.store.errors import RunNotFoundError


@dataclass
class ShardStatus:
    shard: int
    holder: str | None
    epoch: int | None
    done: bool
    completed_fact: bool
    facts: int


@dataclass
class RunStatus:
    """Counts of one run, as its facts tell them."""

    run_id: str
    total: int | None
    admitted: int = 0
    emitted_present: int = 0
    emitted_not_present: int = 0
    calls: dict[str, Counter[str]] = field(default_factory=dict)
    expansions: dict[str, Counter[str]] = field(default_factory=dict)
    """Per child Domain: expansions by outcome, and ``children`` (of the succeeded ones)."""
    shards: list[ShardStatus] = field(default_factory=list)
    drivers: list[str] = field(default_factory=list)
    failovers: int = 0
    pools: list[bytes] = field(default_factory=list)
    """The pool log: each size change of a pool that sizes itself (runtime/pool_sizer.py)."""

    @property
    def in_progress(self) -> int:
        return self.admitted - self.emitted_present - self.emitted_not_present

    @property
    def complete(self) -> bool:
        return bool(self.shards) and all(s.done or s.completed_fact for s in self.shards) and (
            self.total is None or self.emitted_present + self.emitted_not_present == self.total)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run_id, "complete": self.complete, "total": self.total,
            "parents": {"done": self.emitted_present, "failed": self.emitted_not_present,
                        "in_progress": self.in_progress,
                        "not_admitted": None if self.total is None
                        else self.total - self.admitted},
            "calls": {call: dict(c) for call, c in self.calls.items()},
            "expansions": {domain: dict(c) for domain, c in self.expansions.items()},
            "drivers": self.drivers, "failover_retries": self.failovers,
            "pools": [asdict(change) for change in pool_changes(self.pools)],
            "shards": [{"shard": s.shard, "holder": s.holder, "epoch": s.epoch, "done": s.done,
                        "facts": s.facts} for s in self.shards],
        }

    def lines(self) -> list[str]:
        total = "?" if self.total is None else str(self.total)
        state = "complete" if self.complete else "not complete"
        out = [f"run {self.run_id}: {state}; parents {total}: {self.emitted_present} done, "
               f"{self.emitted_not_present} failed, {self.in_progress} in progress, "
               f"{'?' if self.total is None else self.total - self.admitted} not admitted"]
        for call, c in self.calls.items():
            parts = ", ".join(f"{k} {n}" for k, n in sorted(c.items()))
            out.append(f"  call {call}: {parts}")
        for domain, c in self.expansions.items():
            parts = ", ".join(f"{k} {n}" for k, n in sorted(c.items()) if k != "children")
            out.append(f"  domain {domain}: {plural(c['children'], 'child', 'children')} "
                       f"of {plural(sum(n for k, n in c.items() if k != 'children'), 'parent')} "
                       f"(expansions {parts})")
        out.append(f"  live drivers ({len(self.drivers)}): {', '.join(self.drivers) or '-'}")
        for s in self.shards:
            lease = f"held by {s.holder} (epoch {s.epoch})" if s.holder else "free"
            out.append(f"  shard {s.shard}: {'done' if s.done else lease}, {s.facts} facts")
        if self.failovers:
            out.append(f"  {self.failovers} grains re-dispatched after a driver failover")
        out += pool_lines(self.pools)
        return out


def run_status(store: LineageStore, run_id: str) -> RunStatus:
    """Fold the run's facts into counts; add leases and live drivers."""
    info = store.run_info(run_id)
    blob = store.load_manifest(run_id)
    total: int | None = None
    if blob is not None:
        total = len(RunManifest.decode(blob).sources)
    elif isinstance(info.config.get("sources"), int):
        total = int(info.config["sources"])
    status = RunStatus(run_id, total, drivers=store.live_drivers(run_id),
                       pools=store.pool_sizes(run_id))
    done = store.done_shards(run_id)
    for shard, view in store.read_view(run_id).shards.items():
        status.admitted += sum(len(a) for a in view.admitted.values())
        for emits in view.emitted.values():
            present = sum(e.outcome == Outcome.PRESENT for _, e in emits)
            status.emitted_present += present
            status.emitted_not_present += len(emits) - present
        keyed: list[tuple[int, str, str]] = []  # (seq, call, what): counted in fact order
        for grain in view.grains.values():
            call = grain.call
            keyed += [(seq, call, "dispatched") for seq, _ in grain.dispatched]
            keyed += [(seq, call, "retried") for seq, _ in grain.retried]
            keyed += [(seq, call, "failed") for seq, _ in grain.failed]
            keyed += [(seq, call, c.outcome) for seq, c in grain.committed]
            keyed += [(seq, call, "reused") for seq, _ in grain.reused]
            status.failovers += sum(r.cause == FAILOVER_CAUSE for _, r in grain.retried)
        for _, call, what in sorted(keyed):
            status.calls.setdefault(call, Counter())[what] += 1
        for (domain, _), closes in view.expansions.items():
            counts = status.expansions.setdefault(domain, Counter(children=0))
            for _, closed in closes:
                counts[closed.outcome] += 1
                counts["children"] += closed.count
        holder = store.lease_holder(run_id, shard)
        status.shards.append(ShardStatus(
            shard, None if holder is None else holder.driver,
            None if holder is None else holder.epoch, shard in done, bool(view.completed),
            view.facts))
    return status


RUNNING, COMPLETE, ABANDONED = "running", "complete", "abandoned"


@dataclass(frozen=True)
class RunSummary:
    """One line of ``rayorch runs``: when, in what state, how far."""

    run_id: str
    plan: str
    created_ts: float
    state: str  # running | complete | abandoned
    done: int  # sources emitted (present or not)
    total: int | None
    failures: int  # sources emitted not present
    drivers: int

    def as_dict(self, now: float) -> dict[str, Any]:
        return {"run": self.run_id, "plan": self.plan, "created_ts": self.created_ts,
                "age_s": round(max(0.0, now - self.created_ts), 3), "status": self.state,
                "sources_done": self.done, "sources_total": self.total,
                "failures": self.failures, "live_drivers": self.drivers}


def run_state(status: RunStatus) -> str:
    """``complete``; ``running`` while a driver is registered or holds a lease; else abandoned."""
    if status.complete:
        return COMPLETE
    if status.drivers or any(s.holder for s in status.shards):
        return RUNNING
    return ABANDONED


def run_summary(store: LineageStore, run_id: str) -> RunSummary:
    info = store.run_info(run_id)
    status = run_status(store, run_id)
    return RunSummary(run_id, str(info.plan.get("name", "?")), info.created_ts, run_state(status),
                      status.emitted_present + status.emitted_not_present, status.total,
                      status.emitted_not_present, len(status.drivers))


class RunFinishedError(RayorchError):
    """A run id names a run that already finished; its facts are sealed."""


def refuse_finished_run(store: LineageStore, run_id: str, store_url: str) -> None:
    """Raise :class:`RunFinishedError` (one line) when ``run_id`` is a finished run."""
    try:
        store.run_info(run_id)
    except RunNotFoundError:
        return
    if run_status(store, run_id).complete:
        raise RunFinishedError(
            f"run {run_id!r} already finished in {store_url}; pass another run_id (or none, "
            f"for a fresh one), or remove it first with: rayorch delete {run_id} --store "
            f"{store_url}")


__all__ = ["ABANDONED", "COMPLETE", "RUNNING", "RunFinishedError", "RunStatus", "RunSummary",
           "ShardStatus", "refuse_finished_run", "run_state", "run_status", "run_summary"]
