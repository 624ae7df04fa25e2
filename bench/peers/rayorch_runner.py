"""rayorch runner: ``render -> F.expand -> fake GPU -> F.reduce -> assemble`` as a Pipeline.

No parent keys, ordinals or groupby in the program: the runtime records which child
belongs to which parent and hands ``assemble`` each parent's GPU outputs in ordinal
order as soon as that parent is complete. A poisoned child returns
``ro.GroupFailure``: its not-yet-dispatched siblings are suppressed before they reach
the GPU UDF, and the parent comes back as a failed result.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

from bench.peers.common import ArrivalLog
from bench.workload import (
    BenchConfig,
    StageTrace,
    assemble,
    fake_gpu,
    make_parents,
    render,
)


class Render:
    """Batched render: one list of parents in, one list of child records per parent out."""

    def __init__(self, config: BenchConfig, trace_dir: str | None) -> None:
        self.config = config
        self.trace = StageTrace(trace_dir, "render")

    def __call__(self, parents: list[dict[str, int]]) -> list[list[dict[str, int]]]:
        start = time.time()
        children = [render(parent, self.config) for parent in parents]
        self.trace.record(start, time.time(), len(parents))
        return children


class FakeGpu:
    """Batched fake GPU: a batch of child records (any parents) costs ``a + b*B`` seconds."""

    def __init__(self, config: BenchConfig, trace_dir: str | None) -> None:
        self.config = config
        self.poisoned = frozenset(self.config.poisoned)
        self.trace = StageTrace(trace_dir, "gpu")

    def __call__(self, pages: list[dict[str, int]]) -> list[Any]:
        import rayorch as ro

        start = time.time()
        outputs = fake_gpu([p["doc"] for p in pages], [p["ordinal"] for p in pages],
                           self.config, self.poisoned)
        poisoned = sum(1 for o in outputs if o.doc in self.poisoned)
        self.trace.record(start, time.time(), len(outputs), poisoned)
        return [
            ro.GroupFailure(o.error) if o.error
            else {"doc": o.doc, "ordinal": o.ordinal, "text": o.text}
            for o in outputs
        ]


class Assemble:
    """Batched assemble: each input is one parent's GPU outputs, already in ordinal order."""

    def __init__(self, config: BenchConfig, trace_dir: str | None) -> None:
        self.config = config
        self.trace = StageTrace(trace_dir, "assemble")

    def __call__(self, groups: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
        start = time.time()
        results = [
            assemble(group[0]["doc"] if group else -1, [c["ordinal"] for c in group],
                     [c["text"] for c in group], ["" for _ in group], self.config)
            for group in groups
        ]
        self.trace.record(start, time.time(), len(groups))
        return results


def build_pipeline(config: BenchConfig, trace_dir: str | None) -> Any:
    """The Fanout pipeline for ``config`` (GPU batch size and policy from the config)."""
    import rayorch as ro
    from rayorch import F

    class Fanout(ro.Pipeline):
        def __init__(self) -> None:
            super().__init__()
            self.render = ro.RayModule(Render, batch_size=1, num_cpus=0.5,
                                       config=config, trace_dir=trace_dir)
            self.gpu = ro.RayModule(
                FakeGpu, batch_size=config.batch_size, num_gpus=1, replicas=config.gpus,
                num_cpus=0.1, policy=config.policy, config=config, trace_dir=trace_dir,
            )
            self.assemble = ro.RayModule(Assemble, num_cpus=0.5, config=config,
                                         trace_dir=trace_dir)

        def forward(self, docs: Any) -> Any:
            pages = F.expand(self.render(docs))
            return self.assemble(F.reduce(self.gpu(pages)))

    return Fanout()


def result_of(item: Any) -> tuple[int, dict[str, Any] | None]:
    """``(doc, result)`` from one element of ``Pipeline.run``; ``None`` for a failed parent."""
    from rayorch.core.outcome import FailedResult

    if isinstance(item, FailedResult):
        return item.index, None
    if isinstance(item, tuple) and len(item) == 2:
        index, value = item
        if isinstance(value, FailedResult):
            return int(index), None
        return int(index), value
    if isinstance(item, dict):
        return int(item["doc"]), item
    raise TypeError(f"unexpected element from Pipeline.run: {item!r:.200}")


WARM_UP_PARENTS = 8


def run(config: BenchConfig, trace_dir: str | None, log: ArrivalLog) -> None:
    """Run the Fanout pipeline on the in-memory store (Ray is already initialised)."""
    pipeline = build_pipeline(config, trace_dir)
    parents = make_parents(config)
    log.restart()
    with _memory_store() as store_url:
        _consume(pipeline.run(parents, store=store_url, ordered=False), store_url, log)


def run_warm(config: BenchConfig, trace_dir: str | None, log: ArrivalLog) -> None:
    """The same run on a warm ``ro.Executor``: its actors are up (a first run on the first
    ``WARM_UP_PARENTS`` parents started them), so the measured run starts none."""
    import rayorch as ro

    parents = make_parents(config)
    with _memory_store() as store_url, \
            ro.Executor(build_pipeline(config, trace_dir), store=store_url) as executor:
        executor.run(parents[:WARM_UP_PARENTS], ordered=False, quiet=True)
        started = executor.actors_started
        log.restart()
        _consume(executor.iterate(parents, ordered=False, quiet=True), store_url, log)
        log.extra["actors_started"] = executor.actors_started - started


@contextlib.contextmanager
def _memory_store() -> Iterator[str]:
    """A fresh ``memory://`` URL, held open so the run can be read after it ends."""
    from rayorch.store import open_store

    store_url = f"memory://bench-{uuid.uuid4().hex[:8]}"
    held = open_store(store_url)
    try:
        yield store_url
    finally:
        held.close()


def _consume(handle: Any, store_url: str, log: ArrivalLog) -> None:
    """Log every parent result as it arrives, then the run's barrier effects."""
    for item in handle:
        doc, result = result_of(item)
        log.arrived(doc, result)
    log.extra["barriers"] = barrier_summary(store_url, handle.run_id)


def barrier_summary(store_url: str, run_id: str) -> dict[str, int]:
    """Siblings of every GroupFailure barrier, by their state when it was installed."""
    from rayorch.inspect.barriers import load_barrier_effects
    from rayorch.store import open_store

    effects = load_barrier_effects(open_store(store_url), run_id)
    return {
        "barriers": len(effects),
        "siblings": sum(e.siblings for e in effects),
        "committed_before": sum(e.committed_before for e in effects),
        "in_flight_at_barrier": sum(e.in_flight_at_barrier for e in effects),
        "undispatched_at_barrier": sum(e.undispatched_at_barrier for e in effects),
        "suppressed_before_dispatch": sum(e.suppressed_before_dispatch for e in effects),
    }
