"""A stored run kept up to date for a live reader, and what its pages show, as data.

:class:`LiveRun` folds a run once, then on each :meth:`~LiveRun.refresh` reads only the facts
after each shard's last seq and files them with ``RunView.extend``: a page polled every two
seconds costs the new facts, not the run. The functions below read its view:
:func:`failure_groups` (failed Grains by cause, with their sources), :func:`progress_series`
(sources admitted and done, Grains sealed per Call, over time) and :func:`source_rows`
(the sources, in index order, with their state). ``rayorch status`` and the web view
(``rayorch ui``) read the same status (:func:`rayorch.inspect.status.status_of`).

Example::

    live = LiveRun(store, "run-1")
    with live.lock:
        live.refresh()
        status = live.status()
        groups = failure_groups(live.view)
"""

from __future__ import annotations

import hashlib
import threading
import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from rayorch.core.ids import CallId, GrainKey
from rayorch.core.run_view import RunView, ShardView
from rayorch.core.vocabulary import REPORT_PRESENT
from rayorch.inspect.drops import VerdictReader
from rayorch.inspect.status import RunStatus, status_of
from rayorch.store.base import DEFAULT_READ_LIMIT, LineageStore, StoredFact
from rayorch.store.progress import declared_sources

READ_BATCH = 2_000  # facts a shard's first read files at a time (under the view's lock)


class LiveRun:
    """One run's view, extended with the facts written since the last :meth:`refresh`.

    Hold :attr:`lock` while refreshing and while reading the view: a web server reads it
    from several threads. A large run is first read on a thread (:meth:`read_in_background`),
    a batch per shard at a time, so a page can show what is filed so far (:attr:`reading`).
    """

    def __init__(self, store: LineageStore, run_id: str, *, min_interval_s: float = 0.5
                 ) -> None:
        self.store = store
        self.info = store.run_info(run_id)  # RunNotFoundError for an unknown run
        self.run_id = run_id
        self.view = RunView(run_id, self.info.plan,
                            {k: ShardView(k) for k in range(self.info.shards)})
        self.total = declared_sources(store, self.info)
        self.lock = threading.RLock()
        self.min_interval_s = min_interval_s
        self.reading = False  # the first read is still going on (on its thread)
        self._read_done = threading.Event()
        self._read_at = -float("inf")
        self.verdicts = VerdictReader(store.resolve_payload, self.info.plan)
        """Drop verdicts that left their facts, each read once (inspect/drops.py)."""

    def refresh(self, *, force: bool = False) -> int:
        """File the facts written since the last call; returns how many (0 when the last
        read is under ``min_interval_s`` old, unless ``force``, or while :attr:`reading`)."""
        now = time.monotonic()
        if self.reading or (not force and now - self._read_at < self.min_interval_s):
            return 0
        self._read_at = now
        new = 0
        while (batch := self._read_batch()):
            new += batch
        if self.total is None:
            self.total = declared_sources(self.store, self.info)
        return new

    def _read_batch(self) -> int:
        """File one batch of newer facts per shard; returns how many."""
        return self._file(self._fetch())

    def _fetch(self, limit: int = DEFAULT_READ_LIMIT) -> dict[int, list[StoredFact]]:
        """One batch of newer facts per shard (a store read: no lock needed)."""
        return {shard: self.store.read(self.run_id, shard, view.last_seq, limit=limit,
                                       payloads=False)
                for shard, view in self.view.shards.items()}

    def _file(self, batches: dict[int, list[StoredFact]]) -> int:
        for shard, batch in batches.items():
            self.view.shards[shard].extend((s.seq, s.fact) for s in batch)
        return sum(len(batch) for batch in batches.values())

    def read_in_background(self, wait_s: float = 0.0) -> None:
        """Read the run so far on a thread, a batch per shard at a time, taking :attr:`lock`
        only to file each; wait up to ``wait_s`` for it (a small run is read by then)."""
        self.reading = True

        def read() -> None:
            try:  # small batches, each filed under the lock on its own: pages interleave
                while (batches := self._fetch(READ_BATCH)) and any(batches.values()):
                    for shard, batch in batches.items():
                        with self.lock:
                            self._file({shard: batch})
            except Exception:  # the next refresh meets the store's error itself
                pass
            finally:
                self.reading = False
                self._read_at = time.monotonic()
                self._read_done.set()

        threading.Thread(target=read, name=f"rayorch-read-{self.run_id}", daemon=True).start()
        self._read_done.wait(wait_s)

    def status(self) -> RunStatus:
        """The run's counts with its leases and live drivers, as the store has them now."""
        store, run_id = self.store, self.run_id
        holders = {k: store.lease_holder(run_id, k) for k in self.view.shards}
        return status_of(self.view, total=self.total, drivers=store.live_drivers(run_id),
                         holders=holders, done=store.done_shards(run_id),
                         verdicts=self.verdicts)

    def shard_of(self, index: int) -> ShardView:
        return self.view.shards[self.info.shard_of(index)]


@dataclass(frozen=True)
class FailedGrain:
    """One Grain sealed by a failure: where, which attempt, why."""

    shard: int
    key: GrainKey
    outcome: str  # record_failure | group_failure | failed (physical, attempts exhausted)
    generation: int
    cause: str

    @property
    def source(self) -> int:
        return self.key[1][0]


@dataclass(frozen=True)
class FailureGroup:
    """The failed Grains that share one cause, with the sources they belong to."""

    key: str  # a stable id of the cause, for links
    cause: str
    grains: tuple[FailedGrain, ...]
    sources: tuple[int, ...]  # ascending
    calls: dict[CallId, int] = field(default_factory=dict)


def cause_key(cause: str) -> str:
    """A short id of a cause (its SHA-256 prefix): link targets never carry the text."""
    return hashlib.sha256(cause.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def failed_grains(view: RunView) -> list[FailedGrain]:
    """Every Grain sealed by a failure, shard by shard, in the order they failed."""
    out: list[FailedGrain] = []
    for shard, sv in sorted(view.shards.items()):
        seen: set[GrainKey] = set()
        for key in sv.failures:
            if key in seen:
                continue
            seen.add(key)
            grain = sv.grains[key]
            if grain.failed:
                last = grain.failed[-1][1]
                out.append(FailedGrain(shard, key, "failed", last.generation, last.cause))
            elif grain.commit is not None and grain.commit.outcome != REPORT_PRESENT:
                commit = grain.commit
                out.append(FailedGrain(shard, key, commit.outcome, commit.generation,
                                       commit.cause or commit.outcome))
    return out


def failure_groups(view: RunView) -> list[FailureGroup]:
    """Failed Grains grouped by cause, the largest group first."""
    by_cause: dict[str, list[FailedGrain]] = {}
    for failed in failed_grains(view):
        by_cause.setdefault(failed.cause, []).append(failed)
    groups = [FailureGroup(cause_key(cause), cause, tuple(grains),
                           tuple(sorted({g.source for g in grains})),
                           dict(Counter(g.key[0] for g in grains)))
              for cause, grains in by_cause.items()]
    return sorted(groups, key=lambda g: (-len(g.grains), g.cause))


@dataclass(frozen=True)
class Series:
    """A step line: ``points`` are ``(seconds since start, cumulative count)``."""

    label: str
    points: tuple[tuple[float, int], ...]

    @property
    def last(self) -> int:
        return self.points[-1][1] if self.points else 0


@dataclass(frozen=True)
class ProgressSeries:
    start_ts: float
    elapsed: float
    sources: tuple[Series, ...]  # admitted, done
    calls: tuple[Series, ...]  # Grains sealed per Call


def _cumulative(label: str, stamps: list[float], start: float, most: int) -> Series:
    """At most ``most`` points of the running count of ``stamps`` (sorted in place)."""
    stamps.sort()
    n = len(stamps)
    if n == 0:
        return Series(label, ())
    if n <= most:
        return Series(label, tuple((t - start, i + 1) for i, t in enumerate(stamps)))
    span = stamps[-1] - stamps[0]
    if span <= 0:
        return Series(label, ((stamps[-1] - start, n),))
    points = []
    for j in range(1, most + 1):
        t = stamps[0] + span * j / most
        points.append((t - start, bisect_right(stamps, t)))
    return Series(label, tuple(points))


def progress_series(view: RunView, *, most: int = 240) -> ProgressSeries:
    """Sources admitted and done and Grains sealed per Call, cumulative over time."""
    firsts = [sv.first_ts for sv in view.shards.values() if sv.first_ts is not None]
    lasts = [sv.last_ts for sv in view.shards.values() if sv.last_ts is not None]
    start = min(firsts, default=0.0)
    elapsed = max(lasts, default=start) - start
    admitted = [e[0][1].ts for sv in view.shards.values() for e in sv.admitted.values()
                if e[0][1].ts > 0]
    done = [e[0][1].ts for sv in view.shards.values() for e in sv.emitted.values()
            if e[0][1].ts > 0]
    sealed: dict[CallId, list[float]] = {}
    for sv in view.shards.values():
        for call, tally in sv.calls.items():
            stamps = sealed.setdefault(call, [])
            stamps.extend(t for t in tally.commit_ts if t > 0)
            stamps.extend(t for t in tally.reused_ts if t > 0)
    order = {c: i for i, c in enumerate(view.call_order)}
    calls = tuple(_cumulative(call, sealed[call], start, most)
                  for call in sorted(sealed, key=lambda c: (order.get(c, len(order)), c)))
    return ProgressSeries(start, elapsed, (_cumulative("admitted", admitted, start, most),
                                           _cumulative("done", done, start, most)), calls)


@dataclass(frozen=True)
class SourceRow:
    """One source in the run's list: its state and how many of its Grains failed."""

    index: int
    key: str | None
    values: tuple[object, ...]
    state: str  # an output outcome (present, failed, suppressed...), or "in progress"
    grains: int
    failed: int
    sink: str


def source_indexes(view: RunView) -> list[int]:
    """Every admitted source index, ascending."""
    return sorted(i for sv in view.shards.values() for i in sv.admitted)


def source_row(sv: ShardView, index: int) -> SourceRow:
    admitted = sv.admitted[index][0][1]
    emits = sv.emitted.get(index)
    keys = sv.by_source.get(index, [])
    failed = sum(1 for k in keys if sv.grains[k].failed or (
        (c := sv.grains[k].commit) is not None and c.outcome != REPORT_PRESENT))
    last = emits[-1][1] if emits else None
    return SourceRow(index, admitted.key, admitted.values,
                     last.outcome if last is not None else "in progress", len(keys), failed,
                     last.sink if last is not None else "")


def source_rows(live: LiveRun, indexes: Sequence[int]) -> list[SourceRow]:
    return [source_row(live.shard_of(i), i) for i in indexes]


__all__ = ["FailedGrain", "FailureGroup", "LiveRun", "ProgressSeries", "Series", "SourceRow",
           "cause_key", "failed_grains", "failure_groups", "progress_series", "source_indexes",
           "source_row", "source_rows"]
