"""Progress of a run from its stored facts: what ``rayorch status``, ``rayorch runs`` and the
web view (``rayorch ui``) show.

The counts come from the run view's tallies (:class:`~rayorch.core.run_view.CallTally`, the
Expansion and output entries), so a live reader that extends its view computes them
without another pass over the Grains. Reads only the store (facts, leases, the driver
registry, the manifest); imports no user code, so it works on any run, running, finished
or abandoned.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from rayorch.core.ids import CallId
from rayorch.core.pool_sizing import AUTO_MAX_REPLICAS
from rayorch.core.run_view import RunView, is_complete
from rayorch.core.vocabulary import Outcome
from rayorch.core.words import plural
from rayorch.inspect.drops import VerdictReader, drops_by_reason, run_drops
from rayorch.inspect.pool_log import calls_by_module, pool_lines
from rayorch.store.base import LeaseHolder, LineageStore, RunInfo
from rayorch.store.progress import declared_sources
from rayorch.store.records.pool_log import pool_changes


@dataclass
class ShardStatus:
    shard: int
    holder: str | None
    epoch: int | None
    done: bool
    completed_fact: bool
    facts: int


@dataclass
class CallStatus:
    """One Call over all shards: its fact counts, active window and attempt time."""

    call: CallId
    counts: Counter[str] = field(default_factory=Counter)
    first_ts: float | None = None
    last_ts: float | None = None
    busy_s: float = 0.0
    batch_busy_s: float = 0.0
    replicas: int | None = None  # its pool's fixed size, as the stored plan declares it
    batch_size: int | None = None
    sizes: str | None = None  # a pool that sizes itself: "auto" or "min-max"

    @property
    def sealed(self) -> int:
        """Grains committed (any outcome) or reused."""
        return sum(n for k, n in self.counts.items()
                   if k not in ("dispatched", "retried", "failed"))

    @property
    def window_s(self) -> float:
        if self.first_ts is None or self.last_ts is None:
            return 0.0
        return max(self.last_ts - self.first_ts, 0.0)

    @property
    def per_s(self) -> float:
        """Grains sealed per second over its window."""
        return self.sealed / self.window_s if self.window_s > 0 else 0.0

    @property
    def mean_in_flight(self) -> float:
        """Attempt-seconds per second of its window: how many Grains ran at once, on average."""
        return self.busy_s / self.window_s if self.window_s > 0 else 0.0

    @property
    def busy_fraction(self) -> float | None:
        """Batch-seconds (dispatch to commit) over ``replicas`` x its window: the batches at
        each actor on average, queued ones included (an actor holds up to ``depth``); below
        1 its pool idled. None without a pool size."""
        if not self.replicas or self.window_s <= 0:
            return None
        return self.batch_busy_s / (self.replicas * self.window_s)


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
    call_status: dict[CallId, CallStatus] = field(default_factory=dict)
    first_ts: float | None = None
    last_ts: float | None = None
    dropped: dict[str, int] = field(default_factory=dict)
    """Sources a data-quality stage dropped, by ``stage: reason`` (inspect/drops.py)."""

    @property
    def in_progress(self) -> int:
        return self.admitted - self.emitted_present - self.emitted_not_present

    @property
    def complete(self) -> bool:
        return is_complete([s.done or s.completed_fact for s in self.shards],
                           self.emitted_present + self.emitted_not_present, self.total)

    @property
    def reused(self) -> int:
        return sum(c.get("reused", 0) for c in self.calls.values())

    @property
    def state(self) -> str:
        """``complete``; ``running`` while a driver is registered or holds a lease; else
        ``abandoned``."""
        if self.complete:
            return COMPLETE
        if self.drivers or any(s.holder for s in self.shards):
            return RUNNING
        return ABANDONED

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run_id, "complete": self.complete, "total": self.total,
            "parents": {"done": self.emitted_present, "failed": self.emitted_not_present,
                        "in_progress": self.in_progress,
                        "not_admitted": None if self.total is None
                        else self.total - self.admitted},
            "calls": {call: dict(c) for call, c in self.calls.items()},
            "expansions": {domain: dict(c) for domain, c in self.expansions.items()},
            "dropped": dict(self.dropped),
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
        if self.dropped:
            reasons = ", ".join(f"{label} {n}" for label, n in self.dropped.items())
            out.append(f"  dropped {sum(self.dropped.values())} by data-quality stages: "
                       f"{reasons}")
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


def status_of(view: RunView, *, total: int | None, drivers: list[str],
              holders: Mapping[int, LeaseHolder | None], done: frozenset[int],
              verdicts: VerdictReader | None = None) -> RunStatus:
    """The counts of a run's view, with its leases and live drivers (pure but for
    ``verdicts``, which reads the drops' verdicts that left their facts)."""
    status = RunStatus(view.run_id, total, drivers=drivers)
    order = {call: i for i, call in enumerate(view.call_order)}
    calls: dict[CallId, CallStatus] = {}
    for shard, sv in sorted(view.shards.items()):
        status.admitted += sv.admissions
        present = sv.outputs.get(Outcome.PRESENT.value, 0)
        status.emitted_present += present
        status.emitted_not_present += sum(sv.outputs.values()) - present
        for call, tally in sv.calls.items():
            merged = calls.get(call)
            if merged is None:
                merged = calls[call] = CallStatus(call)
            merged.counts.update(tally.counts)
            merged.busy_s += tally.busy_s
            merged.batch_busy_s += tally.batch_busy_s
            status.failovers += tally.failovers
            merged.first_ts = _earliest(merged.first_ts, tally.first_ts)
            merged.last_ts = _latest(merged.last_ts, tally.last_ts)
        for domain, counts in sv.domains.items():
            status.expansions.setdefault(domain, Counter(children=0)).update(counts)
        status.first_ts = _earliest(status.first_ts, sv.first_ts)
        status.last_ts = _latest(status.last_ts, sv.last_ts)
        holder = holders.get(shard)
        status.shards.append(ShardStatus(
            shard, None if holder is None else holder.driver,
            None if holder is None else holder.epoch, shard in done, bool(sv.completed),
            sv.facts))
    status.dropped = drops_by_reason(run_drops(view, verdicts))
    pools = pool_sizes(view.plan)
    for call, merged in calls.items():
        merged.replicas, merged.batch_size, merged.sizes = pools.get(call, (None, None, None))
    ranked = sorted(calls, key=lambda c: (order.get(c, len(order)), c))
    status.call_status = {call: calls[call] for call in ranked}
    status.calls = {call: calls[call].counts for call in ranked}
    return status


def pool_sizes(plan: Mapping[str, Any]
               ) -> dict[CallId, tuple[int | None, int | None, str | None]]:
    """``{call: (replicas, batch_size, sizes)}`` of its module, from a stored plan
    description: a pool that sizes itself has no one ``replicas``; ``sizes`` says its range
    (``"auto"``, ``"2-8"``)."""
    modules = {m.get("name"): m.get("options", {}) for m in plan.get("modules", ())
               if isinstance(m, Mapping)}
    out: dict[CallId, tuple[int | None, int | None, str | None]] = {}
    for module, calls in calls_by_module(plan).items():
        options = modules.get(module)
        if not isinstance(options, Mapping):
            continue
        replicas, batch = options.get("replicas"), options.get("batch_size")
        most, sizes = options.get("max_replicas"), None
        if most is not None:  # it sized itself: no one size
            sizes = ("auto" if replicas == 1 and most == AUTO_MAX_REPLICAS
                     else f"{replicas}-{most}" if isinstance(replicas, int)
                     and isinstance(most, int) else "?")
            replicas = None
        for call in calls:
            out[call] = (replicas if isinstance(replicas, int) else None,
                         batch if isinstance(batch, int) else None, sizes)
    return out


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _latest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def run_status(store: LineageStore, run_id: str, view: RunView | None = None,
               total: int | None = None) -> RunStatus:
    """Fold the run's facts into counts (or use ``view``); add leases and live drivers."""
    info = store.run_info(run_id)
    if view is None:
        view = store.read_view(run_id)
    if total is None:
        total = declared_sources(store, info)
    holders = {k: store.lease_holder(run_id, k) for k in view.shards}
    status = status_of(view, total=total, drivers=store.live_drivers(run_id), holders=holders,
                       done=store.done_shards(run_id),
                       verdicts=VerdictReader(store.resolve_payload, info.plan))
    status.pools = store.pool_sizes(run_id)
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
    reused: int = 0  # Grains sealed by an earlier run's outputs
    admitted: int = 0  # sources admitted so far (the measure when ``total`` is unknown)

    def as_dict(self, now: float) -> dict[str, Any]:
        return {"run": self.run_id, "plan": self.plan, "created_ts": self.created_ts,
                "age_s": round(max(0.0, now - self.created_ts), 3), "status": self.state,
                "sources_done": self.done, "sources_total": self.total,
                "failures": self.failures, "live_drivers": self.drivers}


def run_state(status: RunStatus) -> str:
    """``complete``; ``running`` while a driver is registered or holds a lease; else abandoned."""
    return status.state


def summary_of(info: RunInfo, status: RunStatus) -> RunSummary:
    return RunSummary(info.run_id, str(info.plan.get("name", "?")), info.created_ts,
                      status.state, status.emitted_present + status.emitted_not_present,
                      status.total, status.emitted_not_present, len(status.drivers),
                      status.reused, status.admitted)


def run_summary(store: LineageStore, run_id: str) -> RunSummary:
    return summary_of(store.run_info(run_id), run_status(store, run_id))


__all__ = ["ABANDONED", "COMPLETE", "RUNNING", "CallStatus", "RunStatus", "RunSummary",
           "ShardStatus", "pool_sizes", "run_state", "run_status",
           "run_summary", "status_of", "summary_of"]
