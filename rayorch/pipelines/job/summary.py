"""A job run's summary: counts of sources and parts, failures, warnings, rate; its text.

The counts grow as results are delivered (the job's writer counts each one); the text is
what ``rayorch run <job>`` prints when the run ends, the exit code follows from it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rayorch.core.words import plural
from rayorch.pipelines.job.layouts import JobLayout, job_layout
from rayorch.pipelines.sources import failure_kind

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
MAX_NAMED_FAILURES = 10
"""Failed sources the printed summary names (the rest are counted)."""
MAX_KEPT_FAILURES = 1000
"""Failed sources a summary keeps by name (``--json``'s ``failed_files``): those first by
name; the rows file has every one, the summary only counts the rest (a run of a million
failures holds a thousand)."""


def format_rate(rate: float | None) -> str:
    """A rate per second for people: one decimal from 10 up, three digits below (OCR on a
    CPU runs 0.2-0.4 pages/s); ``-`` when not known."""
    if rate is None:
        return "-"
    return f"{rate:.1f}" if rate >= 10 else f"{rate:.3g}"


def run_cost(result: dict[str, Any], part: str, *, cpus: float, gpus: float,
             cpu_price: float | None, gpu_price: float | None) -> dict[str, Any]:
    """What the run cost at ``cpu_price``/``gpu_price`` dollars per hour per CPU core and
    per GPU, for the cluster it ran on (``cpus``, ``gpus``: what you pay for, whoever used
    it) over its wall time (start-up included): ``{"cost_usd", "usd_per_million_<part>s",
    "<part>s_per_s_per_gpu", ...}``; ``{}`` without a price.

    >>> cost = run_cost({"pages": 500, "wall_s": 3600.0, "pages_per_s": 0.2}, "page",
    ...                 cpus=8, gpus=1, cpu_price=0.05, gpu_price=2.0)
    >>> cost["cost_usd"], cost["usd_per_million_pages"], cost["pages_per_s_per_gpu"]
    (2.4, 4800.0, 0.2)
    """
    if cpu_price is None and gpu_price is None:
        return {}
    hours = float(result.get("wall_s") or 0.0) / 3600.0
    usd = hours * (cpus * (cpu_price or 0.0) + gpus * (gpu_price or 0.0))
    parts = int(result.get(f"{part}s") or 0)
    rate = result.get(f"{part}s_per_s")
    return {"cost_usd": round(usd, 6), "cpus": cpus, "gpus": gpus,
            "cpu_price_per_h": cpu_price, "gpu_price_per_h": gpu_price,
            f"usd_per_million_{part}s": round(usd / parts * 1e6, 4) if parts else None,
            f"{part}s_per_s_per_gpu": round(rate / gpus, 4) if gpus and rate else None}


def model_usage(stats: Any) -> dict[str, int]:
    """The model tokens a run's stages counted (a ``RunStats``): ``{"tokens_in",
    "tokens_out"}``, or ``{}`` when no stage counted any (no model in the run)."""
    tokens_in = sum(c.tokens_in for c in stats.calls.values())
    tokens_out = sum(c.tokens_out for c in stats.calls.values())
    return {"tokens_in": tokens_in, "tokens_out": tokens_out} if tokens_in or tokens_out else {}


def per_part(usage: dict[str, int], parts: int, part: str) -> dict[str, Any]:
    """``usage`` with tokens per part (page, clip) added.

    >>> per_part({"tokens_in": 900, "tokens_out": 300}, 3, "page")["tokens_per_page"]
    400.0
    """
    if not usage:
        return {}
    total = usage["tokens_in"] + usage["tokens_out"]
    return {**usage, f"tokens_per_{part}": round(total / parts, 1) if parts else None}


def usage_line(result: dict[str, Any], part: str) -> str:
    """The summary's model-token line."""
    per = result.get(f"tokens_per_{part}")
    return (f"model tokens: {result['tokens_in']:,} in, {result['tokens_out']:,} out"
            + (f" = {per:,.1f} per {part}" if per is not None else ""))


def cost_line(cost: dict[str, Any], part: str) -> str:
    """The summary's cost line."""
    per = cost.get(f"usd_per_million_{part}s")
    line = (f"cost ${cost['cost_usd']:.4g} for {cost['cpus']:g} CPUs, {cost['gpus']:g} GPUs "
            f"over the wall time = " + ("-" if per is None else f"${per:,.2f}")
            + f" per million {part}s")
    per_gpu = cost.get(f"{part}s_per_s_per_gpu")
    return line + (f"; {per_gpu:g} {part}s/s per GPU" if per_gpu is not None else "")


@dataclass
class JobSummary:
    """Counts of a job run (sources and their parts), its failures and warnings, its clock.

    ``job`` is a :class:`JobLayout` or a shipped job's name; its words (``document``/
    ``page``, ``video``/``clip``) and rows file name are the ones the summary uses.
    """

    job: JobLayout | str
    total: int | None
    """Sources of the input (None while the listing goes on)."""
    done: int = 0
    """Sources this run finished, ok or failed (``kept`` ones not included)."""
    succeeded: int = 0
    parts: int = 0
    kept: int = 0
    failed: int = 0
    """Sources this run failed."""
    failure_counts: Counter[str] = field(default_factory=Counter)
    """Failed sources by the kind of their cause (``missing``, ``encrypted``...)."""
    named_failures: list[tuple[str, str]] = field(default_factory=list, repr=False)
    """``(source, cause)`` of failed sources in the words of their rows, at most
    :data:`MAX_KEPT_FAILURES` of them, first by name (see :attr:`failures`)."""
    warnings: list[str] = field(default_factory=list)
    engines: Counter[str] = field(default_factory=Counter)
    dropped: int = 0
    """Sources a data-quality stage dropped (this run's)."""
    drops: dict[str, int] = field(default_factory=dict)
    """This run's drops by ``stage: reason`` (read from its facts when it ends)."""
    run_started: float | None = None
    """``time.monotonic()`` when the run began (its actors may still be starting)."""
    run_ended: float | None = None
    actors_up: Callable[[], float | None] = field(default=lambda: None, repr=False)
    """When the run's actors were all up (``None`` while some start): :meth:`rate` counts
    from then on, when that is later than ``run_started``."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    layout: JobLayout = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.layout = job_layout(self.job)

    def add_ok(self, parts: int) -> None:
        with self.lock:
            self.done += 1
            self.succeeded += 1
            self.parts += parts

    def add_failed(self, source: str, cause: str) -> None:
        with self.lock:
            self.done += 1
            self.failed += 1
            self.failure_counts[failure_kind(cause)] += 1
            self.named_failures.append((source, cause))
            if len(self.named_failures) >= 2 * MAX_KEPT_FAILURES:  # amortised: O(1) a call
                self.named_failures.sort()
                del self.named_failures[MAX_KEPT_FAILURES:]

    def add_dropped(self) -> None:
        with self.lock:
            self.done += 1
            self.dropped += 1

    @property
    def failures(self) -> list[tuple[str, str]]:
        """``(source, cause)`` of the failed sources, sorted by source: all of them up to
        :data:`MAX_KEPT_FAILURES`, else the first that many (:attr:`failed` counts all)."""
        with self.lock:
            self.named_failures.sort()
            del self.named_failures[MAX_KEPT_FAILURES:]
            return list(self.named_failures)

    def exit_code(self, *, allow_failures: bool = False) -> int:
        """0 when every source succeeded (or ``allow_failures``), else 1."""
        return EXIT_OK if not self.failed or allow_failures else EXIT_FAILED

    def failure_kinds(self) -> dict[str, int]:
        return dict(sorted(self.failure_counts.items()))

    def rate(self) -> float | None:
        """Parts per second after start-up: parts so far over the time since every actor
        was up (the run's start when that was earlier) until now or the run's end. The
        progress lines and the summary both say this figure."""
        now = self.run_ended or time.monotonic()
        start = self.run_started or now
        up = self.actors_up()
        if up is not None and start < up <= now:
            start = up
        return self.parts / (now - start) if now > start else None

    def progress_line(self) -> str:
        unit, part = self.layout.unit, self.layout.part
        with self.lock:
            rate = self.rate()
            shown = format_rate(rate)
            total = "?" if self.total is None else self.total
            return (f"rayorch: {self.done + self.kept}/{total} {unit}s, "
                    f"{plural(self.parts, part)}, {shown} {part}s/s after start-up, "
                    f"{plural(self.failed, 'failure')}")

    def failure_lines(self) -> list[str]:
        lines = [f"  {source}: {cause}" for source, cause in self.failures[:MAX_NAMED_FAILURES]]
        more = self.failed - MAX_NAMED_FAILURES
        if more > 0:
            lines.append(f"  ... and {more} more (see {self.layout.rows})")
        return lines


def format_seconds(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 600 else f"{seconds / 60:.1f} min"


def pools_line(pools: dict[str, Any], bound_by: str | None) -> str:
    """``pools: render auto (1, up to 2, 1 at the end), ocr x2, assemble x1; bound by
    render``: each pool's size, how a pool that sizes itself moved, the binding stage."""
    parts = []
    for name, pool in pools.items():
        replicas = pool["replicas"]
        if replicas.isdigit():
            parts.append(f"{name} x{replicas}")
        elif pool["changes"]:
            parts.append(f"{name} {replicas} ({pool['start']}, up to {pool['most']}, "
                         f"{pool['end']} at the end)")
        else:
            parts.append(f"{name} {replicas} ({pool['start']})")
    return "pools: " + ", ".join(parts) + (f"; bound by {bound_by}" if bound_by else "")


def summary_text(result: dict[str, Any], summary: JobSummary, outputs: str) -> str:
    """The summary a job prints: counts, rate, start-up, failed files, warnings, outputs."""
    unit, part = summary.layout.unit, summary.layout.part
    done = result[f"{unit}s"]
    if result["run_id"] is None:
        return (f"nothing to run: all {plural(done, unit)} were done by the earlier run\n"
                f"output: {outputs}")
    head = (f"run {result['run_id']} done: {plural(done, unit)} "
            f"({result['succeeded']} ok, {result['failed']} failed")
    if result.get("dropped"):
        head += f", {result['dropped']} dropped"
    head += f", {result['kept']} kept from the earlier run)" if result["kept"] else ")"
    engines = ", ".join(f"{n} {e}" for e, n in result[f"{part}_engines"].items())
    rate = result[f"{part}s_per_s"]
    lines = [
        head,
        f"{plural(result[f'{part}s'], part)} in {format_seconds(result['run_s'])} after "
        f"start-up = {format_rate(rate)} {part}s/s "
        f"({result['engine_option']} {result['engine']}"
        + (f"; {part}s by engine: {engines})" if engines else ")"),
        f"start-up {format_seconds(result['startup_s'])} (Ray "
        f"{format_seconds(result['ray_start_s'])}, pools "
        f"{format_seconds(result['pools_start_s'])}); wall {format_seconds(result['wall_s'])}",
    ]
    if result.get("pools"):
        lines.append(pools_line(result["pools"], result.get("bound_by")))
    if "tokens_in" in result:
        lines.append(usage_line(result, part))
    if "cost_usd" in result:
        lines.append(cost_line(result, part))
    if summary.failed:
        lines.append(f"failed ({plural(summary.failed, unit)}):")
        lines.extend(summary.failure_lines())
    else:
        lines.append("failures: none")
    if summary.dropped:
        reasons = ", ".join(f"{label} {n}" for label, n in summary.drops.items())
        lines.append(f"dropped {plural(summary.dropped, unit)} (listed in dropped.jsonl)"
                     + (f": {reasons}" if reasons else ""))
    if summary.warnings:
        lines.append(f"warnings ({len(summary.warnings)}):")
        lines.extend(f"  {w}" for w in summary.warnings[:MAX_NAMED_FAILURES])
        if len(summary.warnings) > MAX_NAMED_FAILURES:
            lines.append(f"  ... and {len(summary.warnings) - MAX_NAMED_FAILURES} more")
    lines.append(f"output: {outputs}")
    return "\n".join(lines)


__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "MAX_KEPT_FAILURES", "MAX_NAMED_FAILURES",
           "JobSummary",
           "cost_line", "format_seconds", "model_usage", "per_part", "pools_line", "run_cost",
           "summary_text", "usage_line"]
