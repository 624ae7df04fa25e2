"""The shared fan-out/fan-in workload: long-tailed parents, sleep-based UDFs, the lower bound.

Every system under test (rayorch, Ray Data, Daft) runs the same three functions:
``render`` (parent -> ordered child records), ``fake_gpu`` (a batch of children costs
``a + b*B`` seconds) and ``assemble`` (ordered child values -> one parent result that
says whether the children came back complete and in ordinal order). The child counts
follow the shape of the paper's failure workload (1,885 PDFs, 45,507 pages, the 99
largest parents = 5.25% of the parents hold 51.9% of the pages): most parents are short
(lognormal, median 8), about 5% are long (100..max children, uniform).

Each UDF process appends one JSON line per call (stage, start, end, records) to a
trace directory, so ``bench/plots.py`` can draw stage windows for any system.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayorch.core.errors import RayorchError

# The share of parents the failure benchmark poisons: the paper's 99 of 1,885.
PAPER_POISON_FRACTION = 99 / 1885

POISON_CAUSE = "injected failure at child 0 of a poisoned parent"


class BenchError(RayorchError):
    """A benchmark was misconfigured, failed, or produced wrong output; the message says how."""


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark configuration; every runner takes exactly this (JSON round-trips)."""

    parents: int = 300
    max_children: int = 400
    seed: int = 0
    gpus: int = 2
    batch_size: int = 32
    gpu_a: float = 0.02
    gpu_b: float = 0.002
    render_base_s: float = 0.002
    render_per_child_s: float = 0.0002
    assemble_base_s: float = 0.001
    assemble_per_child_s: float = 0.00002
    text_bytes: int = 256
    cpus: int = 8
    poisoned: tuple[int, ...] = ()
    # rayorch only: the GPU Call's reservation policy (``elastic`` | ``parent_bound``).
    policy: str = "elastic"
    # Seconds between ray.init and the run: every system starts on an already-started Ray
    # (its own processes and the workers Ray starts ahead up), as a user's job does.
    ray_settle_s: float = 3.0
    # Ray starts at most this many worker processes at once (0: Ray's default, the machine's
    # core count). Ray prestarts one idle worker per declared CPU only up to this limit, so
    # by default the harness lifts it to ``cpus``: Ray then behaves as on a node with as many
    # cores as it declares, for every system alike.
    ray_startup_concurrency: int | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BenchConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise BenchError(f"unknown benchmark config fields {sorted(unknown)}; "
                             f"use only {sorted(known)}")
        values = dict(data)
        values["poisoned"] = tuple(values.get("poisoned", ()))
        return cls(**values)

    def replace(self, **changes: Any) -> BenchConfig:
        return dataclasses.replace(self, **changes)


def child_counts(parents: int, max_children: int = 400, seed: int = 0) -> list[int]:
    """Seeded long-tailed child counts in ``[1, max_children]``, one per parent."""
    rng = random.Random(seed)
    long_low = min(100, max_children)
    counts = []
    for _ in range(parents):
        if rng.random() < 0.05:
            n = rng.randint(long_low, max_children)
        else:
            n = round(rng.lognormvariate(math.log(8), 0.9))
        counts.append(max(1, min(max_children, n)))
    return counts


def make_parents(config: BenchConfig) -> list[dict[str, int]]:
    """The source records: ``{"doc": index, "n": child count}`` in source order."""
    counts = child_counts(config.parents, config.max_children, config.seed)
    return [{"doc": doc, "n": n} for doc, n in enumerate(counts)]


def largest_parents(parents: Sequence[dict[str, int]], fraction: float) -> tuple[int, ...]:
    """Docs of the ``ceil(fraction * len)`` parents with the most children (ties: lower doc)."""
    k = max(1, math.ceil(fraction * len(parents) - 1e-9))
    ranked = sorted(parents, key=lambda p: (-p["n"], p["doc"]))
    return tuple(sorted(p["doc"] for p in ranked[:k]))


def workload_stats(parents: Sequence[dict[str, int]]) -> dict[str, float]:
    """Totals and tail shape: children, mean, max, share of the top 5.25% of parents."""
    counts = sorted((p["n"] for p in parents), reverse=True)
    total = sum(counts)
    top = largest_parents(parents, PAPER_POISON_FRACTION)
    return {
        "parents": len(counts),
        "children": total,
        "mean_children": total / len(counts),
        "max_children": counts[0],
        "min_children": counts[-1],
        "top_parents": len(top),
        "top_share": sum(counts[: len(top)]) / total,
    }


@dataclass(frozen=True)
class LowerBound:
    """The lower bound (docs/ARCHITECTURE.md, "Lower bound"):
    ``first-render + ceil(N/B)*(a+b*B)/G + last-assemble``."""

    first_render_s: float
    gpu_s: float
    last_assemble_s: float

    @property
    def total_s(self) -> float:
        return self.first_render_s + self.gpu_s + self.last_assemble_s


def render_cost(config: BenchConfig, n: int) -> float:
    return config.render_base_s + config.render_per_child_s * n


def assemble_cost(config: BenchConfig, n: int) -> float:
    return config.assemble_base_s + config.assemble_per_child_s * n


def gpu_batch_cost(config: BenchConfig, size: int) -> float:
    return config.gpu_a + config.gpu_b * size


def lower_bound(config: BenchConfig, parents: Sequence[dict[str, int]]) -> LowerBound:
    """The lower bound of end-to-end time for this workload (no system can beat it).

    ``first-render`` and ``last-assemble`` are the cheapest render and assemble: the
    GPU cannot start before one parent is rendered, and the run cannot end before
    one parent is assembled after the last GPU batch.
    """
    total = sum(p["n"] for p in parents)
    batches = math.ceil(total / config.batch_size)
    gpu = batches * gpu_batch_cost(config, config.batch_size) / config.gpus
    smallest = min(p["n"] for p in parents)
    return LowerBound(render_cost(config, smallest), gpu, assemble_cost(config, smallest))


# --- stage traces ---------------------------------------------------------------------


class StageTrace:
    """Appends one JSON line per UDF call to ``<dir>/<stage>-<pid>-<uid>.jsonl``.

    Wall-clock (``time.time``) so that lines from different processes share one axis.
    """

    def __init__(self, trace_dir: str | None, stage: str) -> None:
        self.stage = stage
        self.path: Path | None = None
        if trace_dir:
            Path(trace_dir).mkdir(parents=True, exist_ok=True)
            name = f"{stage}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
            self.path = Path(trace_dir) / name

    def record(self, start: float, end: float, records: int, poisoned: int = 0) -> None:
        if self.path is None:
            return
        line = {"stage": self.stage, "pid": os.getpid(), "start": start, "end": end,
                "records": records, "poisoned": poisoned}
        with self.path.open("a") as out:
            out.write(json.dumps(line) + "\n")


_TRACES: dict[tuple[str | None, str], StageTrace] = {}


def trace_for(trace_dir: str | None, stage: str) -> StageTrace:
    """This process's trace file for ``stage`` (for task-based UDFs that have no instance)."""
    key = (trace_dir, stage)
    if key not in _TRACES:
        _TRACES[key] = StageTrace(trace_dir, stage)
    return _TRACES[key]


def load_traces(trace_dir: str | Path) -> list[dict[str, Any]]:
    """Every trace line under ``trace_dir``, sorted by start time."""
    lines: list[dict[str, Any]] = []
    for path in sorted(Path(trace_dir).glob("*.jsonl")):
        with path.open() as f:
            lines.extend(json.loads(line) for line in f if line.strip())
    return sorted(lines, key=lambda line: line["start"])


# --- the UDFs (plain functions; each system wraps them in its own ABI) ------------------


def render(parent: dict[str, int], config: BenchConfig) -> list[dict[str, int]]:
    """One parent -> its ordered child records ``{"doc", "ordinal"}`` (sleeps its cost)."""
    time.sleep(render_cost(config, parent["n"]))
    return [{"doc": parent["doc"], "ordinal": i} for i in range(parent["n"])]


@dataclass
class GpuOutput:
    """What ``fake_gpu`` gives for one child: its text, or the injected failure."""

    doc: int
    ordinal: int
    text: str = ""
    error: str = ""


def fake_gpu(
    docs: Sequence[int], ordinals: Sequence[int], config: BenchConfig, poisoned: frozenset[int]
) -> list[GpuOutput]:
    """A batch of children costs ``a + b*B`` seconds; child 0 of a poisoned parent fails."""
    time.sleep(gpu_batch_cost(config, len(docs)))
    outputs = []
    for doc, ordinal in zip(docs, ordinals, strict=True):
        if ordinal == 0 and doc in poisoned:
            outputs.append(GpuOutput(int(doc), int(ordinal), error=POISON_CAUSE))
        else:
            text = f"doc {doc} page {ordinal} ".ljust(config.text_bytes, ".")[: config.text_bytes]
            outputs.append(GpuOutput(int(doc), int(ordinal), text=text))
    return outputs


def assemble(doc: int, ordinals: Sequence[int], texts: Sequence[str],
             errors: Sequence[str], config: BenchConfig) -> dict[str, Any]:
    """Ordered child values -> one parent result; ``in_order`` is ordinals == 0..n-1."""
    time.sleep(assemble_cost(config, len(ordinals)))
    failed = [e for e in errors if e]
    return {
        "doc": int(doc),
        "children": len(ordinals),
        "in_order": [int(o) for o in ordinals] == list(range(len(ordinals))),
        "chars": sum(len(t) for t in texts),
        "error": failed[0] if failed else "",
    }


# --- checking a run's output ------------------------------------------------------------


@dataclass
class Verification:
    """How a run's parent results compare with what the workload must produce."""

    correct: int = 0
    failed_as_expected: int = 0
    wrong: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.wrong


def verify(
    config: BenchConfig,
    parents: Sequence[dict[str, int]],
    results: Iterable[tuple[int, dict[str, Any] | None]],
) -> Verification:
    """Check ``(doc, result)`` pairs; ``None`` (or an ``error``) marks a failed parent.

    A healthy parent must come back exactly once, complete, in ordinal order, with the
    full text; a poisoned parent must come back failed.
    """
    expected = {p["doc"]: p["n"] for p in parents}
    poisoned = set(config.poisoned)
    seen: set[int] = set()
    check = Verification()
    for doc, result in results:
        if doc in seen:
            check.wrong.append(f"doc {doc} came back twice")
            continue
        seen.add(doc)
        if doc not in expected:
            check.wrong.append(f"doc {doc} is not a source parent")
        elif result is None or result.get("error"):
            if doc in poisoned:
                check.failed_as_expected += 1
            else:
                check.wrong.append(f"healthy doc {doc} failed: {result}")
        elif doc in poisoned:
            check.wrong.append(f"poisoned doc {doc} came back healthy")
        elif (result["children"], result["in_order"], result["chars"]) != (
            expected[doc], True, expected[doc] * config.text_bytes
        ):
            check.wrong.append(f"doc {doc}: expected {expected[doc]} children in order, "
                               f"got {result}")
        else:
            check.correct += 1
    missing = sorted(set(expected) - seen)
    if missing:
        check.wrong.append(f"{len(missing)} docs never came back, e.g. {missing[:5]}")
    return check
