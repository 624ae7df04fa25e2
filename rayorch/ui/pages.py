"""What each page of the web view shows, as template contexts built from :mod:`rayorch.inspect`.

One :class:`Runs` per served store keeps a :class:`~rayorch.inspect.live.LiveRun` per run it
showed lately (extended on each request, never refolded) and the summaries of complete runs
(which never change). Every list is paginated; nothing here formats HTML.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from rayorch.core.ids import Path, format_path
from rayorch.inspect.live import (
    FailureGroup,
    LiveRun,
    failure_groups,
    progress_series,
    source_indexes,
    source_row,
)
from rayorch.inspect.pool_log import PoolHistory, pool_history
from rayorch.inspect.show import lineage
from rayorch.inspect.status import COMPLETE, RunSummary, summary_of
from rayorch.inspect.timeline import Timeline, timeline_of
from rayorch.store.base import LineageStore
from rayorch.ui.charts import pool_chart, progress_charts, timeline_chart
from rayorch.ui.page_view import page_view

READING = "reading"  # a run's first read is still going on
RUNS_PER_PAGE = 20
ROWS_PER_PAGE = 50
POOL_ROWS = 50  # the newest pool size changes a run page lists (its timeline page: 4x)


class PageNotFound(LookupError):
    """A page asked for something the store does not hold (a 404 page says what)."""


@dataclass(frozen=True)
class Pager:
    """One page of ``total`` rows, ``per`` a page (pages count from 1)."""

    page: int
    per: int
    total: int

    @classmethod
    def of(cls, page: str | None, per: int, total: int) -> Pager:
        try:
            number = int(page or 1)
        except ValueError:
            number = 1
        pages = max(1, math.ceil(total / per))
        return cls(min(max(number, 1), pages), per, total)

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.per))

    @property
    def start(self) -> int:
        return (self.page - 1) * self.per

    @property
    def stop(self) -> int:
        return min(self.start + self.per, self.total)


class Runs:
    """The served store, its runs' live views (the latest ``keep``) and complete summaries."""

    def __init__(self, store: LineageStore, *, keep: int = 8, first_wait_s: float = 0.2
                 ) -> None:
        self.store = store
        self.keep = keep
        self.first_wait_s = first_wait_s
        self._live: OrderedDict[str, LiveRun] = OrderedDict()
        self._complete: dict[tuple[str, float], RunSummary] = {}
        self._timelines: dict[str, tuple[tuple[int, int, bytes], Timeline]] = {}
        self.audits: dict[str, AuditJob] = {}
        self._lock = threading.Lock()

    def live(self, run_id: str) -> LiveRun:
        """The run's live view, refreshed (``RunNotFoundError`` for an unknown run)."""
        with self._lock:
            live = self._live.pop(run_id, None)
            fresh = live is None
            if live is None:
                live = LiveRun(self.store, run_id)
            self._live[run_id] = live
            while len(self._live) > self.keep:
                self._live.popitem(last=False)
        if fresh:  # a large run is read on a thread: pages show what is filed so far
            live.read_in_background(wait_s=self.first_wait_s)
        with live.lock:
            live.refresh()
        return live

    def summary(self, run_id: str, created_ts: float) -> RunSummary:
        done = self._complete.get((run_id, created_ts))
        if done is not None:
            return done
        live = self.live(run_id)
        with live.lock:
            summary = summary_of(live.info, live.status())
        if live.reading:
            return replace(summary, state=READING)
        if summary.state == COMPLETE:
            self._complete[(run_id, created_ts)] = summary
        return summary

    def timeline(self, live: LiveRun, pool_log: list[bytes]) -> Timeline:
        """The run's timeline, computed again only when facts or pool changes were added
        since (``pool_log``: the run's, read for this request)."""
        seen = (live.view.facts, len(pool_log), pool_log[-1] if pool_log else b"")
        cached = self._timelines.get(live.run_id)
        if cached is not None and cached[0] == seen:
            return cached[1]
        view = live.view
        timeline = timeline_of(live.run_id, [view.shards[k] for k in sorted(view.shards)],
                               call_order=view.call_order, pool_log=pool_log, plan=view.plan)
        self._timelines[live.run_id] = (seen, timeline)
        return timeline


def pools_context(history: PoolHistory, elapsed: float, most: int, **chart: int
                  ) -> dict[str, Any]:
    """The pool sizes' chart and the newest ``most`` changes, for the templates."""
    rows = history.latest(most)
    return {"pools": history, "pool_rows": rows,
            "pool_rows_left": len(history.entries) - len(rows),
            "pool_chart": pool_chart(history, elapsed=elapsed, **chart)}


def _flags(live: LiveRun, complete: bool) -> dict[str, Any]:
    """``reading``: the facts filed so far while the first read goes on; ``live``: poll."""
    return {"reading": live.view.facts if live.reading else None,
            "live": live.reading or not complete}


def runs_page(runs: Runs, page: str | None) -> dict[str, Any]:
    infos = sorted(runs.store.list_runs(), key=lambda i: (-i.created_ts, i.run_id))
    pager = Pager.of(page, RUNS_PER_PAGE, len(infos))
    now = time.time()
    rows = [(info, runs.summary(info.run_id, info.created_ts), now - info.created_ts)
            for info in infos[pager.start:pager.stop]]
    return {"rows": rows, "pager": pager, "live": any(s.state != COMPLETE for _, s, _ in rows)}


def run_page(runs: Runs, run_id: str) -> dict[str, Any]:
    live = runs.live(run_id)
    pool_log = runs.store.pool_sizes(run_id)  # short (the newest POOL_LOG_MAX): read per poll
    with live.lock:
        status = live.status()
        series = progress_series(live.view)
        progress, grains = progress_charts(series)
        history = pool_history(pool_log, plan=live.view.plan,
                               start_ts=series.start_ts if live.view.facts else None)
        groups = failure_groups(live.view)
        leases = [(k, [fact for _, fact in sv.leases[-5:]], len(sv.leases))
                  for k, sv in sorted(live.view.shards.items())]
        facts = live.view.facts
    return {"run_id": run_id, "info": live.info, "status": status, "progress": progress,
            "grains_chart": grains, "groups": groups[:30], "groups_left": len(groups) - 30,
            "failed_grains": sum(len(g.grains) for g in groups), "leases": leases,
            "facts": facts, "age": time.time() - live.info.created_ts,
            **pools_context(history, series.elapsed, POOL_ROWS),
            **_flags(live, status.state == COMPLETE)}


def sources_page(runs: Runs, run_id: str, page: str | None, only: str | None
                 ) -> dict[str, Any]:
    live = runs.live(run_id)
    with live.lock:
        indexes = source_indexes(live.view)
        if only == "failed":
            indexes = [i for i in indexes if (e := live.shard_of(i).emitted.get(i))
                       and e[-1][1].outcome != "present"]
        pager = Pager.of(page, ROWS_PER_PAGE, len(indexes))
        rows = [source_row(live.shard_of(i), i) for i in indexes[pager.start:pager.stop]]
        complete = live.status().state == COMPLETE
    return {"run_id": run_id, "rows": rows, "pager": pager, "only": only or "",
            "total": live.total, **_flags(live, complete)}


def entity_page(runs: Runs, run_id: str, path: Path, page: str | None) -> dict[str, Any]:
    live = runs.live(run_id)
    with live.lock:
        if path[0] not in live.view.shards[live.info.shard_of(path[0])].admitted \
                and len(path) == 1 and not live.reading:
            raise PageNotFound(f"run {run_id} has no source {path[0]} (yet)")
        story = lineage(live.shard_of(path[0]), path, live.verdicts)
        complete = live.status().state == COMPLETE
    if story.empty and not live.reading:
        raise PageNotFound(f"run {run_id} has no facts about entity {format_path(path)}")
    pager = Pager.of(page, ROWS_PER_PAGE, len(story.root.children))
    crumbs = [path[:i] for i in range(1, len(path))]
    return {"run_id": run_id, "story": story, "node": story.root, "pager": pager,
            "children": story.root.children[pager.start:pager.stop], "crumbs": crumbs,
            **_flags(live, complete)}


def page_page(runs: Runs, run_id: str, path: tuple[int, int]) -> dict[str, Any]:
    """The page viewer's page (rayorch/ui/page_view.py)."""
    live = runs.live(run_id)
    with live.lock:
        view = page_view(live, path)
        complete = live.status().state == COMPLETE
    return {"run_id": run_id, "view": view, **_flags(live, complete)}


def region_png(runs: Runs, run_id: str, path: tuple[int, int], order: int) -> bytes | None:
    """The image a region's Grain committed (a figure's crop), or None."""
    live = runs.live(run_id)
    with live.lock:
        shard = live.view.shards.get(live.info.shard_of(path[0]))
        grains = [] if shard is None else [
            shard.grains[key] for key in shard.by_source.get(path[0], ())
            if tuple(key[1]) == (*path, order)]
    for grain in grains:
        commit = grain.commit or grain.reuse
        if commit is None:
            continue
        try:
            outputs = runs.store.resolve_payload(commit).outputs or ()
        except Exception:  # freed or unreachable: no image
            return None
        block = outputs[0] if outputs else None
        if isinstance(block, dict) and isinstance(block.get("image"), (bytes, bytearray)):
            return bytes(block["image"])
    return None


def failures_page(runs: Runs, run_id: str, key: str, page: str | None) -> dict[str, Any]:
    live = runs.live(run_id)
    with live.lock:
        groups = failure_groups(live.view)
        group = next((g for g in groups if g.key == key), None)
        if group is None and live.reading:
            group = FailureGroup(key, "(not read yet)", (), ())
        if group is None:
            raise PageNotFound(f"run {run_id} has no failures with cause id {key}")
        pager = Pager.of(page, ROWS_PER_PAGE, len(group.grains))
        rows = []
        for failed in group.grains[pager.start:pager.stop]:
            grain = live.view.shards[failed.shard].grains[failed.key]
            rows.append((failed, len(grain.dispatched), format_path(failed.key[1])))
        complete = live.status().state == COMPLETE
    return {"run_id": run_id, "group": group, "rows": rows, "pager": pager,
            **_flags(live, complete)}


def timeline_page(runs: Runs, run_id: str) -> dict[str, Any]:
    live = runs.live(run_id)
    pool_log = runs.store.pool_sizes(run_id)
    with live.lock:
        timeline = runs.timeline(live, pool_log)
        complete = live.status().state == COMPLETE
    return {"run_id": run_id, "timeline": timeline, "chart": timeline_chart(timeline),
            "totals": timeline.totals(),
            **pools_context(timeline.pools, timeline.elapsed, 4 * POOL_ROWS, width=960,
                            left=140),
            **_flags(live, complete)}


@dataclass
class AuditJob:
    """One audit of a run, computed on a thread of its own (it folds every shard through
    the kernel: minutes for a large run); the page shows it when it is done."""

    facts: int  # the run's facts when it started
    started: float
    report: Any = None
    error: str | None = None
    seconds: float | None = None

    @property
    def done(self) -> bool:
        return self.report is not None or self.error is not None


def audit_page(runs: Runs, run_id: str, again: bool = False) -> dict[str, Any]:
    from rayorch.inspect.audit import audit_with_delivery

    live = runs.live(run_id)
    with live.lock:
        facts = live.view.facts
    with runs._lock:
        job = runs.audits.get(run_id)
        if job is None or (again and job.done):
            job = runs.audits[run_id] = AuditJob(facts, time.time())

            def work(job: AuditJob = job) -> None:
                start = time.perf_counter()
                try:
                    job.report = audit_with_delivery(runs.store, run_id)
                except Exception as exc:  # shown on the page, never a traceback
                    job.error = f"{type(exc).__name__}: {exc}"
                job.seconds = time.perf_counter() - start

            threading.Thread(target=work, name=f"rayorch-ui-audit-{run_id}",
                             daemon=True).start()
    return {"run_id": run_id, "job": job, "report": job.report, "facts_now": facts,
            "running": time.time() - job.started, "live": not job.done}


__all__ = ["AuditJob", "PageNotFound", "Pager", "Runs", "audit_page", "entity_page",
           "failures_page", "run_page", "runs_page", "sources_page", "timeline_page"]
