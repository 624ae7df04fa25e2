"""Chart geometry for the web view, drawn as SVG by the templates (no script, no CDN).

Only numbers are computed here (coordinates, ticks); every label from the store is passed
through as data and escaped by the template engine. Hover text is an SVG ``<title>``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rayorch.inspect.live import ProgressSeries, Series
from rayorch.inspect.pool_log import PoolHistory
from rayorch.inspect.timeline import Timeline, format_seconds

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")


@dataclass(frozen=True)
class Tick:
    pos: float  # pixels along the axis
    label: str


@dataclass(frozen=True)
class Line:
    label: str
    color: str
    points: str  # "x,y x,y ..." of a step line
    last: int


@dataclass(frozen=True)
class Frame:
    """The plot area inside an SVG of ``width`` x ``height``."""

    width: int
    height: int
    left: int
    top: int
    right: int
    bottom: int

    @property
    def plot_w(self) -> int:
        return self.width - self.left - self.right

    @property
    def plot_h(self) -> int:
        return self.height - self.top - self.bottom

    @property
    def x_end(self) -> int:
        return self.left + self.plot_w

    @property
    def y_end(self) -> int:
        return self.top + self.plot_h


@dataclass(frozen=True)
class Dot:
    """A point on a line with hover text (a pool's size change and its reason)."""

    x: float
    y: float
    color: str
    title: str


@dataclass(frozen=True)
class LineChart:
    frame: Frame
    lines: tuple[Line, ...]
    xticks: tuple[Tick, ...]
    yticks: tuple[Tick, ...]
    xlabel: str
    ylabel: str
    dots: tuple[Dot, ...] = ()

    @property
    def empty(self) -> bool:
        return not any(line.points for line in self.lines)


def nice_ticks(top: float, most: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``top`` (1, 2, 5 x 10^k steps)."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / most
    exp = math.floor(math.log10(raw))
    step = next(s * 10**exp for s in (1, 2, 5, 10) if s * 10**exp >= raw)
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(n + 1)]


def _count(v: float) -> str:
    return f"{int(v):,}" if v == int(v) else f"{v:g}"


def line_chart(series: Sequence[Series], *, elapsed: float, ylabel: str,
               width: int = 580, height: int = 240) -> LineChart:
    """Cumulative step lines over the run's seconds."""
    frame = Frame(width, height, 64, 12, 28, 36)
    span = max(elapsed, max((s.points[-1][0] for s in series if s.points), default=0.0), 1e-3)
    yvals = nice_ticks(max((s.last for s in series), default=0) or 1)
    ytop = yvals[-1]
    xvals = nice_ticks(span, 6)
    xtop = xvals[-1]

    def x(t: float) -> float:
        return frame.left + frame.plot_w * t / xtop

    def y(v: float) -> float:
        return frame.y_end - frame.plot_h * v / ytop

    lines = []
    for i, s in enumerate(series):
        pts: list[str] = []
        prev = 0
        for t, v in s.points:
            pts.append(f"{x(t):.1f},{y(prev):.1f}")
            pts.append(f"{x(t):.1f},{y(v):.1f}")
            prev = v
        if pts:
            pts.insert(0, f"{x(0):.1f},{y(0):.1f}")
            pts.append(f"{x(span):.1f},{y(prev):.1f}")
        lines.append(Line(s.label, PALETTE[i % len(PALETTE)], " ".join(pts), s.last))
    return LineChart(frame, tuple(lines),
                     tuple(Tick(x(v), format_seconds(v) if v else "0") for v in xvals),
                     tuple(Tick(y(v), _count(v)) for v in yvals),
                     "seconds since the run's first fact", ylabel)


def progress_charts(progress: ProgressSeries) -> tuple[LineChart, LineChart]:
    """Sources admitted and done; Grains sealed per Call."""
    return (line_chart(progress.sources, elapsed=progress.elapsed, ylabel="sources"),
            line_chart(progress.calls, elapsed=progress.elapsed, ylabel="grains sealed"))


def pool_chart(history: PoolHistory, *, elapsed: float, width: int = 580, left: int = 64,
               most_dots: int = 400) -> LineChart:
    """Each sizing pool's size over time (a step line per pool, to ``elapsed``), a dot per
    change whose hover text is its reason; the newest ``most_dots`` changes get dots."""
    frame = Frame(width, 220, left, 12, 28 if left < 100 else 16, 36)
    span = max(elapsed, history.end, 1e-3)
    most = max((s.most for s in history.series), default=0) or 1
    yvals = [float(n) for n in range(most + 1)] if most <= 5 else nice_ticks(most, 4)
    xvals = nice_ticks(span, 8 if width > 800 else 6)

    def x(t: float) -> float:
        return frame.left + frame.plot_w * t / xvals[-1]

    def y(v: float) -> float:
        return frame.y_end - frame.plot_h * v / yvals[-1]

    lines: list[Line] = []
    colors: dict[tuple[str, str], str] = {}
    for i, s in enumerate(history.series):
        colors[s.module, s.driver] = color = PALETTE[i % len(PALETTE)]
        pts = " ".join(f"{x(t):.1f},{y(n):.1f}" for t, n in (*s.points, (span, s.last)))
        lines.append(Line(s.label, color, pts, s.last))
    dots = tuple(Dot(x(e.t), y(e.change.after), colors[e.change.module, e.change.driver],
                     f"{format_seconds(e.t)}: {e.label} {e.change.before} -> {e.change.after}"
                     f": {e.change.reason}") for e in history.latest(most_dots))
    return LineChart(frame, tuple(lines),
                     tuple(Tick(x(v), format_seconds(v) if v else "0") for v in xvals),
                     tuple(Tick(y(v), _count(v)) for v in yvals),
                     "seconds since the run's first fact" if history.relative
                     else "seconds into each driver's run", "actors", dots)


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    w: float
    h: float
    color: str
    label: str
    title: str


@dataclass(frozen=True)
class Mark:
    x: float
    y: float
    final: bool  # a Grain failed (x) rather than retried (tick)
    title: str


@dataclass(frozen=True)
class VLine:
    x: float
    title: str
    same_driver: bool


@dataclass(frozen=True)
class TimelineChart:
    frame: Frame
    row_h: int
    bars: tuple[Bar, ...]
    marks: tuple[Mark, ...]
    failovers: tuple[VLine, ...]
    rates: LineChart
    xticks: tuple[Tick, ...]
    marks_left_out: int


def timeline_chart(timeline: Timeline, *, width: int = 960, most_marks: int = 400
                   ) -> TimelineChart:
    """Per-Call windows with retries and failures; throughput per Call below."""
    row_h = 30
    rows = max(len(timeline.windows), 1)
    frame = Frame(width, 24 + row_h * rows + 28, 140, 12, 16, 28)
    span = max(timeline.elapsed, timeline.pools.end, 1e-3)
    xvals = nice_ticks(span, 8)
    xtop = xvals[-1]

    def x(t: float) -> float:
        return frame.left + frame.plot_w * t / xtop

    rank = {w.call: i for i, w in enumerate(timeline.windows)}
    bars = tuple(Bar(x(w.start), frame.top + i * row_h + 4, max(x(w.end) - x(w.start), 2.0),
                     row_h - 8, PALETTE[i % len(PALETTE)], w.call,
                     f"{w.call}: {w.committed} committed in {format_seconds(w.duration)} "
                     f"({w.mean_rate:.1f}/s), {w.retried} retried, {w.failed} failed, "
                     f"{w.in_flight} in flight")
                 for i, w in enumerate(timeline.windows))
    events = [r for r in timeline.retries if r.call in rank]
    shown = events[:most_marks]
    marks = tuple(Mark(x(r.t), frame.top + rank[r.call] * row_h + row_h / 2, r.final,
                       f"{'failed' if r.final else 'retried'} {r.call} "
                       f"{'.'.join(map(str, r.path))} attempt {r.generation}: {r.cause}")
                  for r in shown)
    vlines = tuple(VLine(x(f.t), f.label(), f.same_driver) for f in timeline.failovers)
    tp = timeline.throughput
    rate_series = [Series(w.call, tuple((tp.bin_starts[i] + tp.bin_s, n) for i, n in
                                        enumerate(tp.counts.get(w.call, ()))))
                   for w in timeline.windows]
    rates = _rate_chart(rate_series, tp.bin_s, span, width)
    return TimelineChart(frame, row_h, bars, marks, vlines, rates,
                         tuple(Tick(x(v), format_seconds(v) if v else "0") for v in xvals),
                         len(events) - len(shown))


def _rate_chart(series: Sequence[Series], bin_s: float, span: float, width: int) -> LineChart:
    """Grains committed per second, per bin (not cumulative)."""
    frame = Frame(width, 200, 140, 12, 16, 36)
    top = max((n for s in series for _, n in s.points), default=0) / bin_s
    yvals = nice_ticks(top or 1)
    xvals = nice_ticks(span, 8)

    def x(t: float) -> float:
        return frame.left + frame.plot_w * t / xvals[-1]

    def y(v: float) -> float:
        return frame.y_end - frame.plot_h * v / yvals[-1]

    lines = []
    for i, s in enumerate(series):
        pts = []
        for end, n in s.points:
            rate = n / bin_s
            pts += [f"{x(end - bin_s):.1f},{y(rate):.1f}", f"{x(end):.1f},{y(rate):.1f}"]
        lines.append(Line(s.label, PALETTE[i % len(PALETTE)], " ".join(pts),
                          sum(n for _, n in s.points)))
    return LineChart(frame, tuple(lines),
                     tuple(Tick(x(v), format_seconds(v) if v else "0") for v in xvals),
                     tuple(Tick(y(v), _count(v)) for v in yvals),
                     f"seconds ({format_seconds(bin_s)} bins)", "grains / s")


__all__ = ["Bar", "Dot", "Frame", "Line", "LineChart", "Mark", "PALETTE", "Tick",
           "TimelineChart", "VLine", "line_chart", "nice_ticks", "pool_chart", "progress_charts",
           "timeline_chart"]
