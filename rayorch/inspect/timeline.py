"""The timeline of a stored run: per-Call active windows, throughput, failovers, retries and
the sizes of pools that size themselves (:func:`rayorch.inspect.pool_log.pool_history`).

Everything is computed from the run's facts (their writer's wall-clock ``ts``);
no user code is imported. The computation (:func:`compute_timeline`) is pure and
separate from the drawing (:func:`draw_timeline`, matplotlib with the Agg backend).

Example::

    store = open_store("redis://127.0.0.1:6379/0")
    timeline = load_timeline(store, "run-1")
    draw_timeline(timeline, "run-1.png")
    timeline.as_dict()          # the same numbers, JSON-able
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path as FilePath
from typing import Any

import numpy as np

from rayorch.core.errors import MissingExtraError, RayorchError
from rayorch.core.facts import GrainFailed
from rayorch.core.ids import CallId, Path, format_grain
from rayorch.core.run_view import ShardView, fold_shard
from rayorch.core.vocabulary import REPORT_OUTCOMES
from rayorch.core.words import plural
from rayorch.inspect.pool_log import PoolHistory, draw_pool_sizes, pool_history
from rayorch.store.base import LineageStore, StoredFact

DEFAULT_TARGET_BINS = 60
_NICE_STEPS = (1.0, 2.0, 2.5, 5.0)


class NoFactsError(RayorchError):
    """The run exists but has no facts to draw a timeline from."""

    def __init__(self, run_id: str, url: str) -> None:
        super().__init__(run_id, url)
        self.run_id, self.url = run_id, url

    def __str__(self) -> str:
        return (
            f"run {self.run_id!r} has no facts in the lineage store {self.url}: nothing has "
            "run yet (a driver writes its first fact when it takes a shard lease). Start the "
            "run first, or check the run id with `rayorch runs --store URL`."
        )


class PlottingUnavailableError(MissingExtraError):
    """matplotlib is not installed, so no picture can be drawn (``--json`` still works)."""

    def __init__(self) -> None:
        super().__init__("drawing a timeline (rayorch timeline -o FILE.png)", "matplotlib",
                         "timeline")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), ())

    def __str__(self) -> str:
        return super().__str__() + "; or pass --json for the numbers alone"


@dataclass(frozen=True)
class CallWindow:
    """One Call's active window, first dispatch to last commit, in seconds since run start.

    ``committed`` counts sealed Grains (one ``GrainCommitted`` each, any outcome);
    ``dispatched`` counts attempts; ``barred`` Grains were dispatched but a sibling's
    GroupFailure barrier suppressed them before they committed; ``in_flight`` Grains
    were dispatched and are neither committed, failed nor barred when the facts end.
    With nothing committed, ``end`` is the last dispatch.
    """

    call: CallId
    start: float
    end: float
    dispatched: int
    committed: int
    outcomes: Mapping[str, int]
    retried: int
    failed: int
    in_flight: int
    barred: int = 0

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def mean_rate(self) -> float:
        """Committed Grains per second over the window (0 for an empty window)."""
        return self.committed / self.duration if self.duration > 0 else 0.0


@dataclass(frozen=True)
class Throughput:
    """Grains committed per Call in fixed bins of ``bin_s`` seconds from the run's start."""

    bin_s: float
    bin_starts: tuple[float, ...]
    counts: Mapping[CallId, tuple[int, ...]]

    def rates(self, call: CallId) -> tuple[float, ...]:
        """Grains committed per second in each bin."""
        return tuple(n / self.bin_s for n in self.counts[call])

    def peak_rate(self, call: CallId) -> float:
        return max(self.rates(call), default=0.0)


@dataclass(frozen=True)
class FailoverEvent:
    """A shard lease taken with epoch > 1: a new driver (or the same one, re-acquiring)."""

    t: float
    shard: int
    driver: str
    epoch: int
    previous: str | None

    @property
    def same_driver(self) -> bool:
        """The previous holder re-acquired its own expired lease (no driver change)."""
        return self.previous == self.driver

    def label(self) -> str:
        verb = "re-acquired by" if self.same_driver else "->"
        return f"shard {self.shard} {verb} {self.driver} (epoch {self.epoch})"


@dataclass(frozen=True)
class RetryEvent:
    """A physical failure of one attempt: ``GrainRetried``, or ``GrainFailed`` (``final``)."""

    t: float
    call: CallId
    path: Path
    generation: int
    cause: str
    final: bool = False


@dataclass(frozen=True)
class Timeline:
    """What :func:`compute_timeline` found in a run's facts (times relative to ``start_ts``)."""

    run_id: str
    start_ts: float
    elapsed: float
    shards: int
    facts: int
    windows: tuple[CallWindow, ...]
    throughput: Throughput
    failovers: tuple[FailoverEvent, ...]
    retries: tuple[RetryEvent, ...]
    sources: int
    outputs: Mapping[str, int]
    completed_shards: int
    idle_calls: tuple[CallId, ...] = field(default=())
    children: Mapping[str, int] = field(default_factory=dict)
    """Per child Domain, the children its succeeded expansions published (the fan-out)."""
    pools: PoolHistory = field(default_factory=PoolHistory)
    """Each sizing pool's size over time, from the run's pool log (times as the windows')."""

    @property
    def committed(self) -> int:
        return sum(w.committed for w in self.windows)

    @property
    def completed(self) -> bool:
        """Every shard has announced ``RunCompleted``."""
        return self.completed_shards >= self.shards > 0

    def totals(self) -> dict[str, Any]:
        outcomes: Counter[str] = Counter()
        for w in self.windows:
            outcomes.update(w.outcomes)
        return {
            "facts": self.facts,
            "sources": self.sources,
            "grains_committed": self.committed,
            "grain_outcomes": dict(sorted(outcomes.items())),
            "attempts": sum(w.dispatched for w in self.windows),
            "retries": sum(1 for r in self.retries if not r.final),
            "grains_failed": sum(1 for r in self.retries if r.final),
            "in_flight": sum(w.in_flight for w in self.windows),
            "barred": sum(w.barred for w in self.windows),
            "outputs": dict(sorted(self.outputs.items())),
            "children": dict(sorted(self.children.items())),
            "failovers": len(self.failovers),
            "completed": self.completed,
        }

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able copy of every computed number (what ``rayorch timeline --json`` prints)."""
        tp = self.throughput
        return {
            "run": self.run_id,
            "start_ts": self.start_ts,
            "elapsed_s": self.elapsed,
            "shards": self.shards,
            "totals": self.totals(),
            "calls": [
                {
                    "call": w.call, "start_s": w.start, "end_s": w.end,
                    "duration_s": w.duration, "dispatched": w.dispatched,
                    "committed": w.committed, "outcomes": dict(w.outcomes),
                    "retried": w.retried, "failed": w.failed, "in_flight": w.in_flight,
                    "barred": w.barred,
                    "mean_per_s": w.mean_rate, "peak_per_s": tp.peak_rate(w.call),
                }
                for w in self.windows
            ],
            "idle_calls": list(self.idle_calls),
            "throughput": {
                "bin_s": tp.bin_s,
                "bin_starts_s": list(tp.bin_starts),
                "committed": {call: list(n) for call, n in tp.counts.items()},
                "per_s": {call: list(tp.rates(call)) for call in tp.counts},
            },
            "failovers": [
                {"t_s": f.t, "shard": f.shard, "driver": f.driver, "epoch": f.epoch,
                 "previous": f.previous, "same_driver": f.same_driver}
                for f in self.failovers
            ],
            "retries": [
                {"t_s": r.t, "grain": format_grain((r.call, r.path)), "call": r.call,
                 "generation": r.generation, "cause": r.cause,
                 "kind": "failed" if r.final else "retried"}
                for r in self.retries
            ],
            "pools": self.pools.as_dict(),
        }


# -- computation (pure) ---------------------------------------------------------------
def nice_bin_width(span_s: float, target_bins: int = DEFAULT_TARGET_BINS) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k seconds giving at most ``target_bins`` bins."""
    if span_s <= 0 or target_bins < 1:
        return 1.0
    raw = span_s / target_bins
    exponent = math.floor(math.log10(raw))
    for step in (*_NICE_STEPS, 10.0):
        width = step * 10.0**exponent
        if width >= raw * (1 - 1e-9):
            return width
    return 10.0 ** (exponent + 1)  # pragma: no cover - the loop always returns


def _bin_index(t: float, bin_s: float, n_bins: int) -> int:
    return min(max(int(t // bin_s), 0), n_bins - 1)


def compute_timeline(
    run_id: str,
    facts_by_shard: Mapping[int, Sequence[StoredFact]],
    *,
    call_order: Sequence[CallId] = (),
    bin_s: float | None = None,
    target_bins: int = DEFAULT_TARGET_BINS,
    pool_log: Sequence[bytes] = (),
    plan: Mapping[str, Any] | None = None,
) -> Timeline:
    """Windows, throughput bins, failovers and retries of a run, from its facts alone (and
    its pool sizes from ``pool_log``, ``store.pool_sizes(run_id)``; ``plan``: the stored one).

    ``facts_by_shard`` is what :meth:`LineageStore.read_run` returns. Times are
    seconds since the earliest fact; ``bin_s`` defaults to a round width giving
    about ``target_bins`` bins over the run.
    """
    views = [fold_shard(k, ((s.seq, s.fact) for s in sorted(facts_by_shard[k],
                                                            key=lambda s: s.seq)))
             for k in sorted(facts_by_shard)]
    return timeline_of(run_id, views, call_order=call_order, bin_s=bin_s,
                       target_bins=target_bins, pool_log=pool_log, plan=plan)


def timeline_of(
    run_id: str,
    views: Sequence[ShardView],
    *,
    call_order: Sequence[CallId] = (),
    bin_s: float | None = None,
    target_bins: int = DEFAULT_TARGET_BINS,
    pool_log: Sequence[bytes] = (),
    plan: Mapping[str, Any] | None = None,
) -> Timeline:
    """:func:`compute_timeline` from the run's shard views (in shard order).

    It reads the views' tallies (per Call: counts, dispatch span, commit times), their open
    attempts and physical failures, never every Grain: a live page recomputes it per poll.
    """
    start_ts = min((v.first_ts for v in views if v.first_ts is not None), default=0.0)
    end_ts = max((v.last_ts for v in views if v.last_ts is not None), default=0.0)
    elapsed = end_ts - start_ts

    def rel(ts: float) -> float:
        return max(ts - start_ts, 0.0)

    spans: dict[CallId, tuple[float, float]] = {}
    dispatched: Counter[CallId] = Counter()
    commit_times: dict[CallId, list[float]] = {}
    outcomes: dict[CallId, Counter[str]] = {}
    open_grains: dict[CallId, list[Path]] = {}
    retries: list[tuple[float, int, int, RetryEvent]] = []  # (t, shard, seq, event)
    failovers: list[FailoverEvent] = []
    children: Counter[str] = Counter()
    barriers: set[tuple[CallId, Path]] = set()
    outputs: Counter[str] = Counter()
    for view in views:
        for call, tally in view.calls.items():
            if tally.dispatch_span is not None:
                lo, hi = tally.dispatch_span
                old = spans.get(call)
                spans[call] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
                dispatched[call] += tally.counts["dispatched"]
            if tally.commit_ts:
                commit_times.setdefault(call, []).extend(tally.commit_ts)
                outcomes.setdefault(call, Counter()).update(
                    {k: n for k, n in tally.counts.items() if k in REPORT_OUTCOMES})
        for call, path in view.open:
            open_grains.setdefault(call, []).append(path)
        for seq, fact in view.physical:
            t = rel(fact.ts)
            final = isinstance(fact, GrainFailed)
            retries.append((t, view.shard, seq, RetryEvent(
                t, fact.call, fact.path, fact.generation, fact.cause, final)))
        holder: str | None = None
        for _, lease in view.leases:
            if lease.epoch > 1:
                failovers.append(FailoverEvent(rel(lease.ts), lease.shard, lease.driver,
                                               lease.epoch, holder))
            holder = lease.driver
        barriers.update((b.call, b.parent) for _, b in view.barriers)
        outputs.update(view.outputs)
        for domain, closed in view.domains.items():
            children[domain] += closed["children"]
    events = [r for *_, r in sorted(retries, key=lambda r: r[:3])]

    ranked = {call: i for i, call in enumerate(call_order)}
    first_dispatch = {call: rel(span[0]) for call, span in spans.items()}
    active = sorted(first_dispatch,
                    key=lambda c: (ranked.get(c, len(ranked)), first_dispatch[c], c))
    retried = Counter(r.call for r in events if not r.final)
    failed = Counter(r.call for r in events if r.final)
    windows = tuple(
        CallWindow(
            call=call,
            start=first_dispatch[call],
            end=rel(max(commit_times[call])) if call in commit_times else rel(spans[call][1]),
            dispatched=dispatched[call],
            committed=sum(outcomes.get(call, Counter()).values()),
            outcomes=dict(sorted(outcomes.get(call, Counter()).items())),
            retried=retried[call],
            failed=failed[call],
            in_flight=sum(1 for p in open_grains.get(call, ()) if (call, p[:-1]) not in barriers),
            barred=sum(1 for p in open_grains.get(call, ()) if (call, p[:-1]) in barriers),
        )
        for call in active
    )
    width = bin_s if bin_s is not None and bin_s > 0 else nice_bin_width(elapsed, target_bins)
    n_bins = max(1, math.ceil(elapsed / width - 1e-9))
    counts: dict[CallId, tuple[int, ...]] = {}
    for call in active:
        times = np.maximum(np.asarray(commit_times.get(call, ()), dtype=float) - start_ts, 0.0)
        bins = np.minimum(np.floor_divide(times, width).astype(np.int64), n_bins - 1)
        counts[call] = tuple(int(n) for n in np.bincount(bins, minlength=n_bins))
    return Timeline(
        run_id=run_id,
        start_ts=start_ts,
        elapsed=elapsed,
        shards=len(views),
        facts=sum(v.facts for v in views),
        windows=windows,
        throughput=Throughput(width, tuple(i * width for i in range(n_bins)), counts),
        failovers=tuple(sorted(failovers, key=lambda f: (f.t, f.shard))),
        retries=tuple(events),
        sources=sum(v.admissions for v in views),
        outputs=dict(outputs),
        completed_shards=sum(len(v.completed) for v in views),
        idle_calls=tuple(c for c in call_order if c not in first_dispatch),
        children=dict(children),
        pools=pool_history(pool_log, plan=plan, start_ts=start_ts if views and any(
            v.first_ts is not None for v in views) else None),
    )


def load_timeline(store: LineageStore, run_id: str, *, bin_s: float | None = None,
                  target_bins: int = DEFAULT_TARGET_BINS) -> Timeline:
    """Read a run's facts from ``store`` and compute its timeline.

    Raises :class:`~rayorch.store.errors.RunNotFoundError` for an unknown run and
    :class:`NoFactsError` for a run without facts.
    """
    view = store.read_view(run_id)
    if not any(v.facts for v in view.shards.values()):
        raise NoFactsError(run_id, store.url)
    return timeline_of(run_id, [view.shards[k] for k in sorted(view.shards)],
                       call_order=view.call_order, bin_s=bin_s, target_bins=target_bins,
                       pool_log=store.pool_sizes(run_id), plan=view.plan)


# -- drawing ------------------------------------------------------------------------------
def format_seconds(seconds: float) -> str:
    """``2.5 ms``, ``0.42 s``, ``12.3 s``, ``4 min 05 s``, ``1 h 02 min``."""
    if seconds < 0.1:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def title_lines(timeline: Timeline) -> tuple[str, str]:
    """The picture's title: run id and elapsed time; then the totals."""
    totals = timeline.totals()
    state = "completed" if timeline.completed else "not completed"
    head = (f"run {timeline.run_id}  -  {format_seconds(timeline.elapsed)} elapsed, "
            f"{state}, {plural(timeline.shards, 'shard')}")
    outs = ", ".join(f"{n} {k}" for k, n in totals["outputs"].items()) or "none"
    fan_out = "".join(f" -> {plural(n, 'child', 'children')} in {domain}"
                      for domain, n in totals["children"].items())
    tail = (f"{plural(totals['sources'], 'source')}{fan_out}, "
            f"{plural(totals['grains_committed'], 'grain')} committed "
            f"({plural(totals['attempts'], 'attempt')}), "
            f"{plural(totals['retries'], 'retry', 'retries')}, {totals['grains_failed']} failed, "
            f"{plural(totals['failovers'], 'failover')}; "
            f"outputs: {outs}")
    return head, tail


def _window_label(w: CallWindow) -> str:
    parts = [f"{w.committed} committed"]
    bad = sum(n for k, n in w.outcomes.items() if k != "present")
    if bad:
        parts.append(f"{bad} failures")
    if w.retried:
        parts.append(f"{w.retried} retried")
    if w.barred:
        parts.append(f"{w.barred} barred")
    if w.in_flight:
        parts.append(f"{w.in_flight} in flight")
    return ", ".join(parts) + f"  |  {w.mean_rate:.1f}/s"


def draw_timeline(timeline: Timeline, out: str | FilePath, *, dpi: int = 120) -> None:
    """Draw ``timeline`` to a PNG file at ``out`` (matplotlib, Agg backend)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise PlottingUnavailableError() from exc

    windows = timeline.windows
    n_rows = max(len(windows), 1)
    lane = bool(timeline.failovers)
    pools = timeline.pools if timeline.pools.series else None
    ratios = [0.55 * (n_rows + lane) + 0.6, 3.2, *([2.4] if pools else [])]
    height = 1.8 + sum(ratios)
    fig, axes = plt.subplots(len(ratios), 1, sharex=True, figsize=(13, height),
                             gridspec_kw={"height_ratios": ratios})
    ax_win, ax_rate = axes[0], axes[1]
    colors = plt.get_cmap("tab10")
    color = {w.call: colors(i % 10) for i, w in enumerate(windows)}
    span = max(timeline.elapsed, timeline.pools.end, 1e-3)

    # Windows: one bar per Call, retries and failures as ticks on its row.
    for row, w in enumerate(windows):
        ax_win.barh(row, max(w.duration, span * 0.002), left=w.start, height=0.6,
                    color=color[w.call], alpha=0.85, edgecolor="black", linewidth=0.5)
        label = _window_label(w)
        if w.duration > span * 0.45:
            ax_win.text(w.start + span * 0.01, row, label, va="center", ha="left",
                        fontsize=8.5, color="white", fontweight="bold")
        elif w.end < span * 0.55:
            ax_win.text(w.end + span * 0.01, row, label, va="center", ha="left", fontsize=8.5)
        else:
            ax_win.text(w.start - span * 0.01, row, label, va="center", ha="right",
                        fontsize=8.5)
    rows = {w.call: i for i, w in enumerate(windows)}
    retried = [r for r in timeline.retries if not r.final and r.call in rows]
    failed = [r for r in timeline.retries if r.final and r.call in rows]
    if retried:
        ax_win.scatter([r.t for r in retried], [rows[r.call] for r in retried], marker="|",
                       s=260, linewidths=2, color="crimson", zorder=5)
        # Several retries at one spot (a lost batch) read as one tick: say how many.
        bunches = Counter((r.call, round(r.t / (span * 0.01))) for r in retried)
        for (call, slot), n in bunches.items():
            if n > 1:
                ax_win.text(slot * span * 0.01, rows[call] - 0.36, f"{n}x", color="crimson",
                            fontsize=7.5, ha="center", va="bottom", fontweight="bold")
    if failed:
        ax_win.scatter([r.t for r in failed], [rows[r.call] for r in failed], marker="x",
                       s=60, linewidths=2, color="black", zorder=6)
    first = min((w.start for w in windows), default=0.0)
    if first > span * 0.05:
        for ax in axes:
            ax.axvspan(0, first, color="gray", alpha=0.08, linewidth=0)
        ax_win.text(first / 2, n_rows - 0.55, "start-up before the first dispatch\n"
                    "(leases, actor pools)", ha="center", va="bottom", fontsize=8,
                    color="dimgray")
    if not windows:
        ax_win.text(0.5, 0.5, "no Grain dispatched yet", transform=ax_win.transAxes,
                    ha="center", va="center", fontsize=11, color="gray")
    ax_win.set_yticks(range(len(windows)), [w.call for w in windows])
    ax_win.set_ylim(n_rows - 0.4, -0.6 - (1.0 if lane else 0.0))
    ax_win.set_ylabel("Call")
    ax_win.grid(axis="x", alpha=0.3)
    ax_win.set_title("active window per Call (first dispatch to last commit)", fontsize=10,
                     loc="left")

    # Throughput: committed Grains per second, binned, per Call.
    tp = timeline.throughput
    edges = [*tp.bin_starts, tp.bin_starts[-1] + tp.bin_s] if tp.bin_starts else [0.0]
    for w in windows:
        rates = list(tp.rates(w.call))
        ax_rate.fill_between(edges, [*rates, rates[-1]], step="post", alpha=0.18,
                             color=color[w.call])
        ax_rate.step(edges, [*rates, rates[-1]], where="post", color=color[w.call],
                     linewidth=1.6, label=w.call)
    ax_rate.set_ylabel("grains committed / s")
    if pools is not None:  # each sizing pool's size: a step line per Call, changes marked
        draw_pool_sizes(axes[2], pools, color, span)
    axes[-1].set_xlabel("seconds since the run's first fact")
    ax_rate.set_ylim(bottom=0)
    ax_rate.grid(alpha=0.3)
    ax_rate.set_title(f"throughput per Call ({format_seconds(tp.bin_s)} bins)", fontsize=10,
                      loc="left")
    ax_rate.set_xlim(-span * 0.01, span * 1.01)

    # Failovers: vertical lines through both panels, labelled in the top lane.
    last_x, level = -math.inf, 0
    for f in timeline.failovers:
        style = ":" if f.same_driver else "--"
        for ax in axes:
            ax.axvline(f.t, color="purple", linestyle=style, linewidth=1.3, zorder=4)
        level = (level + 1) % 2 if f.t - last_x < span * 0.28 else 0
        last_x = f.t
        ha = "left" if f.t < span * 0.7 else "right"
        dx = span * 0.005 * (1 if ha == "left" else -1)
        ax_win.text(f.t + dx, -1.25 + 0.45 * level, f.label(), fontsize=8, color="purple",
                    ha=ha, va="center")

    handles: list[Any] = [Patch(color=color[w.call], label=w.call) for w in windows]
    if retried:
        handles.append(Line2D([], [], color="crimson", marker="|", linestyle="none",
                              markersize=12, markeredgewidth=2,
                              label="physical retry (GrainRetried)"))
    if failed:
        handles.append(Line2D([], [], color="black", marker="x", linestyle="none",
                              markersize=7, markeredgewidth=2, label="Grain failed"))
    if any(not f.same_driver for f in timeline.failovers):
        handles.append(Line2D([], [], color="purple", linestyle="--",
                              label="failover (lease to a new driver)"))
    if any(f.same_driver for f in timeline.failovers):
        handles.append(Line2D([], [], color="purple", linestyle=":",
                              label="lease re-acquired (same driver)"))
    if handles:
        fig.legend(handles=handles, loc="upper left",
                   bbox_to_anchor=(0.805, 1 - 0.55 / height), fontsize=8.5,
                   frameon=True, title="legend", title_fontsize=9)
    head, tail = title_lines(timeline)
    fig.suptitle(f"{head}\n{tail}", fontsize=10.5, x=0.01, y=0.995, ha="left", va="top")
    fig.tight_layout(rect=(0, 0, 0.8, 1 - 0.42 / height), h_pad=1.2)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
