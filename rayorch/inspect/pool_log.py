"""A run's pool log (its records: :mod:`rayorch.store.records.pool_log`) and the one
computation of each pool's size over time from it (:func:`pool_history`) that
``rayorch status``, the timeline (its numbers and its picture) and the web view show.

Written by :mod:`rayorch.runtime.pool_sizer`; a record that is not one is skipped, with a
note saying which and why; printed sanitised, escaped by the web view's templates.

Example::

    history = pool_history(store.pool_sizes(run_id), plan=info.plan, start_ts=start_ts)
    for series in history.series:           # one step line per pool (per driver)
        series.label, series.points         # ("ocr", ((0.0, 1), (2.5, 1), (2.5, 4), ...))
    history.entries                         # the changes, in time order, with their reasons
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rayorch.core.ids import CallId
from rayorch.core.sanitize import sanitize
from rayorch.store.records.pool_log import PoolChange, decoded_pool_change

MOST_NOTES = 5  # notes kept about unreadable records (the count says how many in all)


@dataclass(frozen=True, slots=True)
class PoolSeries:
    """One pool's size over time, as one driver sized it (each driver starts its own pools).

    ``points``: ``(t, size)`` from the driver's start (the size before its first change),
    then two points per change (the size just before and just after, at its time): a step
    line, ready to draw. ``calls``: the Calls the pool serves (from the stored plan)."""

    module: str
    driver: str
    calls: tuple[CallId, ...]
    points: tuple[tuple[float, int], ...]
    changes: tuple[PoolChange, ...]
    label: str

    @property
    def last(self) -> int:
        return self.points[-1][1] if self.points else 0

    @property
    def most(self) -> int:
        return max((size for _, size in self.points), default=0)


@dataclass(frozen=True, slots=True)
class PoolEntry:
    """One change in a history's table: at ``t`` seconds, of the pool named ``label``."""

    t: float
    label: str
    change: PoolChange


@dataclass(frozen=True)
class PoolHistory:
    """Each pool's size over time and each change with its reason (:func:`pool_history`)."""

    series: tuple[PoolSeries, ...] = ()
    entries: tuple[PoolEntry, ...] = ()  # every change, in time order
    skipped: int = 0  # records of the log that could not be read
    notes: tuple[str, ...] = field(default=())  # which ones and why (the first few)
    relative: bool = False  # times are seconds since ``start_ts``, else into each driver's run

    @property
    def empty(self) -> bool:
        return not self.series and not self.skipped

    @property
    def end(self) -> float:
        """The time of the last change (0 without one)."""
        return max((s.points[-1][0] for s in self.series), default=0.0)

    def latest(self, most: int) -> tuple[PoolEntry, ...]:
        """The newest ``most`` changes, in time order."""
        return self.entries[-most:] if most > 0 else ()

    def note(self) -> str:
        """One sentence on the records left out ("" when none were)."""
        if not self.skipped:
            return ""
        more = self.skipped - len(self.notes)
        return (f"{self.skipped} pool records could not be read and were skipped: "
                + "; ".join(self.notes) + (f"; and {more} more" if more > 0 else ""))

    def lines(self) -> list[str]:
        """``rayorch status``'s lines: each pool's sizes over time and its latest reason,
        sanitised (the store's text is data)."""
        out = []
        several = len({s.driver for s in self.series}) > 1
        for s in sorted(self.series, key=lambda s: (s.module, s.driver)):
            name = f"{s.module} @ {s.driver}" if several else s.module
            sized = [(t, c) for (t, _), c in zip(s.points[1::2], s.changes, strict=True)
                     if not c.recycle]
            if sized:
                steps = " -> ".join(f"{c.after} ({t:.0f}s)" for t, c in sized)
                out.append(sanitize(f"  pool {name}: {sized[0][1].before} -> {steps}; last: "
                                    f"{sized[-1][1].reason}"))
            recycled = [c for c in s.changes if c.recycle]
            if recycled:
                out.append(sanitize(f"  pool {name}: {len(recycled)} actors recycled; last: "
                                    f"{recycled[-1].reason}"))
        if self.skipped:
            out.append(sanitize(f"  ({self.note()})"))
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: each pool's step line and changes (``t_s``: the history's time)."""
        return {
            "times": "since the run's first fact" if self.relative else "into each driver's run",
            "series": [{"pool": s.module, "driver": s.driver, "calls": list(s.calls),
                        "label": s.label, "points": [list(p) for p in s.points],
                        "last": s.last} for s in self.series],
            "changes": [{"t_s": e.t, "label": e.label, **asdict(e.change)}
                        for e in self.entries],
            "skipped": self.skipped, "notes": list(self.notes),
        }


def _label(module: str, calls: Sequence[CallId], driver: str) -> str:
    name = ", ".join(calls) if calls else module
    return f"{name} @ {driver}" if driver else name


def calls_by_module(plan: Mapping[str, Any] | None) -> dict[str, tuple[CallId, ...]]:
    """``{module: its Calls}`` from a stored plan description (anything else: left out)."""
    out: dict[str, list[CallId]] = {}
    nodes = plan.get("nodes", ()) if isinstance(plan, Mapping) else ()
    for node in nodes if isinstance(nodes, (list, tuple)) else ():
        call = node.get("call") if isinstance(node, Mapping) else None
        if isinstance(call, Mapping) and isinstance(call.get("module"), str) \
                and isinstance(call.get("id"), str):
            out.setdefault(call["module"], []).append(call["id"])
    return {module: tuple(calls) for module, calls in out.items()}


def pool_history(records: Sequence[bytes], *, plan: Mapping[str, Any] | None = None,
                 start_ts: float | None = None) -> PoolHistory:
    """Each pool's size over time from a run's pool log (``store.pool_sizes(run_id)``).

    One series per pool and driver (drivers size their own pools), labelled by the Calls the
    pool serves (``plan``, the stored plan description) and, with several drivers, the
    driver. Times are seconds since ``start_ts`` (the run's first fact: the timeline's and
    the web view's clock) from each record's clock time; without it, seconds into each
    driver's run. A record that cannot be read is skipped, counted and noted; never raised.
    """
    calls = calls_by_module(plan)
    changes: list[PoolChange] = []
    notes: list[str] = []
    skipped = 0
    for i, raw in enumerate(records):
        change = decoded_pool_change(raw)
        if isinstance(change, PoolChange):
            changes.append(change)
            continue
        skipped += 1
        if len(notes) < MOST_NOTES:
            notes.append(f"record {i + 1}: {change}")
    relative = start_ts is not None

    def when(c: PoolChange) -> float:
        if start_ts is None or c.ts <= 0:
            return c.at_s
        return max(c.ts - start_ts, 0.0)

    by_pool: dict[tuple[str, str], list[PoolChange]] = {}
    for c in changes:
        by_pool.setdefault((c.module, c.driver), []).append(c)
    several = len({driver for _, driver in by_pool}) > 1
    series = []
    entries = []
    for (module, driver), mine in by_pool.items():
        first = mine[0]
        began = 0.0 if not relative or first.ts <= 0 else max(when(first) - first.at_s, 0.0)
        points = [(began, first.before)]
        size = first.before
        label = _label(module, calls.get(module, ()), driver if several else "")
        for c in mine:
            t = max(when(c), points[-1][0])  # a step line never goes back in time
            points += [(t, size), (t, c.after)]
            size = c.after
            entries.append(PoolEntry(t, label, c))
        series.append(PoolSeries(module, driver, calls.get(module, ()), tuple(points),
                                 tuple(mine), label))
    entries.sort(key=lambda e: e.t)  # stable: each driver's own order kept
    return PoolHistory(tuple(series), tuple(entries), skipped, tuple(notes), relative)


def pool_lines(records: Sequence[bytes]) -> list[str]:
    """``rayorch status``'s lines for a run's pool log (:meth:`PoolHistory.lines`)."""
    return pool_history(records).lines()


def draw_pool_sizes(ax: Any, history: PoolHistory, colors: Mapping[str, Any], end: float
                    ) -> None:
    """The timeline picture's panel: each pool's size as a step line to ``end``, its changes
    marked (matplotlib ``ax``; ``colors``: by Call, as the other panels have them)."""
    for i, s in enumerate(history.series):
        color = next((colors[c] for c in s.calls if c in colors), f"C{i % 10}")
        points = [*s.points, (max(end, s.points[-1][0]), s.last)]
        ax.plot([t for t, _ in points], [n for _, n in points], color=color, linewidth=1.8,
                label=s.label)
        ax.plot([t for t, _ in s.points[2::2]], [n for _, n in s.points[2::2]], "o",
                color=color, markersize=4)
    ax.set_ylabel("actors")
    ax.set_ylim(bottom=0, top=max((s.most for s in history.series), default=0) + 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    note = f"; {history.skipped} unreadable records skipped" if history.skipped else ""
    ax.set_title(f"pool size per Call (dots: changes; their reasons: --json){note}",
                 fontsize=10, loc="left")


__all__ = ["PoolEntry", "PoolHistory", "PoolSeries", "calls_by_module", "draw_pool_sizes",
           "pool_history", "pool_lines"]
