"""A scripted run of a small PDF-like pipeline, written through any lineage store.

It plays the driver and the workers by hand (no Ray, no kernel), producing the
facts a real run produces: admissions, dispatches, commits (with a physical retry,
a stale report, a RecordFailure and a GroupFailure), expansion and output
announcements. Tests, the store benchmark and the audit CLI's tests use it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rayorch.core import functional as F
from rayorch.core.compiler import compile_pipeline
from rayorch.core.facts import (
    REPORT_GROUP_FAILURE,
    REPORT_PRESENT,
    REPORT_RECORD_FAILURE,
    ExpansionClosed,
    Fact,
    GrainCommitted,
    GrainDispatched,
    GrainRetried,
    OutputEmitted,
    RunCompleted,
    SourceAdmitted,
)
from rayorch.core.ids import Path
from rayorch.core.plan import Plan
from rayorch.core.program import PipelineBase, RayModule
from rayorch.core.vocabulary import EXPANSION_SUCCEEDED, CommitVerdict, Outcome
from rayorch.store.base import LineageStore, shard_of


class _Pages:
    def __call__(self, docs: list[Any]) -> list[Any]:
        return docs


class ScriptedPdfPipeline(PipelineBase):
    """render (root) -> expand -> ocr (root/0) -> reduce -> assemble (root)."""

    def __init__(self) -> None:
        super().__init__()
        self.render = RayModule(_Pages, batch_size=4)
        self.ocr = RayModule(_Pages, batch_size=64)
        self.assemble = RayModule(_Pages)

    def forward(self, pdfs: Any) -> Any:
        pages = F.expand(self.render(pdfs))
        texts = self.ocr(pages)
        return self.assemble(F.reduce(texts))


def scripted_plan() -> Plan:
    """The compiled plan of :class:`ScriptedPdfPipeline` (calls render, ocr, assemble)."""
    return compile_pipeline(ScriptedPdfPipeline())


@dataclass
class ScriptedRun:
    """What the script did: every verdict it got, per report."""

    run_id: str
    verdicts: list[tuple[GrainCommitted, CommitVerdict]] = field(default_factory=list)


def write_scripted_run(
    store: LineageStore,
    run_id: str,
    *,
    pages: Sequence[int] = (3, 1, 0, 5),
    shards: int = 2,
    micro_batch: int = 2,
    record_failure: tuple[int, int] | None = (0, 1),
    group_failure: tuple[int, int] | None = (3, 2),
    retry: tuple[int, int] | None = (3, 0),
    page_bytes: int = 8,
    complete: bool = True,
    plan: Plan | None = None,
) -> ScriptedRun:
    """Write a run of ``len(pages)`` sources (``pages[i]`` pages each) into ``store``.

    ``record_failure``/``group_failure``/``retry`` name a page ``(source, ordinal)``
    whose OCR fails logically, fails its group, or crashes once (physical retry).
    ``plan``: :func:`scripted_plan` with other module options (its Calls the same).
    """
    plan = plan or scripted_plan()
    store.open_run(run_id, plan, shards=shards, micro_batch=micro_batch)
    result = ScriptedRun(run_id)
    driver = "scripted-driver"
    epochs = {k: store.acquire_lease(run_id, k, driver, ttl_s=300) for k in range(shards)}

    def shard(index: int) -> int:
        return shard_of(index, micro_batch, shards)

    def append(index: int, facts: list[Fact]) -> None:
        store.append(run_id, shard(index), epochs[shard(index)], facts, driver=driver)

    def commit(reports: list[GrainCommitted]) -> None:
        verdicts = store.commit(run_id, reports)
        result.verdicts.extend(zip(reports, verdicts))

    now: Callable[[], float] = time.time
    for index, count in enumerate(pages):
        src: Path = (index,)
        append(index, [SourceAdmitted(index, (f"doc{index}.pdf",), ts=now()),
                       GrainDispatched("render", src, 0, ts=now())])
        page_values = [f"p{index}.{o}".ljust(page_bytes, "x") for o in range(count)]
        commit([GrainCommitted("render", src, 0, REPORT_PRESENT, (page_values,), ts=now())])
        append(index, [ExpansionClosed("root/0", src, EXPANSION_SUCCEEDED, count, ts=now())])
        children = [(index, o) for o in range(count)]
        if children:
            append(index, [GrainDispatched("ocr", p, 0, ts=now()) for p in children])
        reports: list[GrainCommitted] = []
        for path in children:
            if path == retry:
                append(index, [GrainRetried("ocr", path, 1, "worker crashed", ts=now()),
                               GrainDispatched("ocr", path, 1, ts=now())])
                commit([GrainCommitted("ocr", path, 0, REPORT_PRESENT, ("late",), ts=now())])
                reports.append(GrainCommitted("ocr", path, 1, REPORT_PRESENT,
                                              (f"text {path}",), ts=now()))
            elif path == record_failure:
                reports.append(GrainCommitted("ocr", path, 0, REPORT_RECORD_FAILURE,
                                              cause="unreadable page", ts=now()))
            elif path == group_failure:
                reports.insert(0, GrainCommitted("ocr", path, 0, REPORT_GROUP_FAILURE,
                                                 cause="corrupt document", ts=now()))
            else:
                reports.append(GrainCommitted("ocr", path, 0, REPORT_PRESENT,
                                              (f"text {path}",), ts=now()))
        if reports:
            commit(reports)
        mine = [(r, v) for r, v in result.verdicts if r.call == "ocr" and r.path[0] == index]
        if any(v is CommitVerdict.BARRED or (v.accepted and r.outcome != REPORT_PRESENT)
               for r, v in mine):
            append(index, [OutputEmitted(index, Outcome.SUPPRESSED.value, ts=now())])
            continue
        append(index, [GrainDispatched("assemble", src, 0, ts=now())])
        commit([GrainCommitted("assemble", src, 0, REPORT_PRESENT, (f"doc {index}",), ts=now())])
        append(index, [OutputEmitted(index, Outcome.PRESENT.value, ts=now())])
    if complete:
        for k in range(shards):
            admitted = sum(1 for i in range(len(pages)) if shard(i) == k)
            store.append(run_id, k, epochs[k], [RunCompleted(admitted, ts=now())],
                         driver=driver)
    for k, epoch in epochs.items():
        store.release_lease(run_id, k, driver, epoch)
    return result
