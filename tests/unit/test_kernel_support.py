"""Small pipelines and a manual driver for the kernel unit tests."""

from __future__ import annotations

from typing import Any

import rayorch as ro
from rayorch import F
from rayorch.core.facts import (
    REPORT_GROUP_FAILURE,
    REPORT_PRESENT,
    REPORT_RECORD_FAILURE,
    BarrierInstalled,
    Fact,
    GrainCommitted,
    GrainDispatched,
    SourceAdmitted,
)
from rayorch.core.ids import GrainKey
from rayorch.core.state import Kernel


def pages_of(docs: list[int]) -> list[list[int]]:
    return [list(range(d)) for d in docs]


def ocr(pages: list[int]) -> list[int]:
    return [p * 10 for p in pages]


def assemble(texts: list[list[int]]) -> list[int]:
    return [sum(t) for t in texts]


class Parse(ro.Pipeline):
    """docs -> render -> expand -> ocr -> reduce -> assemble."""

    def __init__(self, batch: int = 4, policy: str = "elastic", max_attempts: int = 3) -> None:
        super().__init__()
        self.render = ro.RayModule(pages_of, batch_size=2)
        self.ocr = ro.RayModule(ocr, batch_size=batch, policy=policy, max_attempts=max_attempts)
        self.assemble = ro.RayModule(assemble)

    def forward(self, docs: Any) -> Any:
        return self.assemble(F.reduce(self.ocr(F.expand(self.render(docs)))))


class Driver:
    """Drives a Kernel by hand: every fact goes through ``write`` and is logged."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.log: list[Fact] = []

    def write(self, fact: Fact) -> list[Fact]:
        self.log.append(fact)
        derived = self.kernel.apply(fact)
        self.log.extend(derived)
        return derived

    def admit(self, index: int, *values: Any) -> None:
        self.write(SourceAdmitted(index, tuple(values)))

    def dispatch(self, call: str, limit: int = 100) -> list[tuple[GrainKey, int]]:
        batch = self.kernel.take_batch(call, limit)
        for (c, path), gen in batch:
            self.write(GrainDispatched(c, path, gen))
        return batch

    def commit(self, grain: GrainKey, gen: int, value: Any) -> None:
        self.write(GrainCommitted(grain[0], grain[1], gen, REPORT_PRESENT, (value,)))

    def record_failure(self, grain: GrainKey, gen: int, cause: str) -> None:
        self.write(GrainCommitted(grain[0], grain[1], gen, REPORT_RECORD_FAILURE, None, cause))

    def group_failure(self, grain: GrainKey, gen: int, cause: str) -> None:
        self.write(GrainCommitted(grain[0], grain[1], gen, REPORT_GROUP_FAILURE, None, cause))
        if len(grain[1]) > 1:
            self.write(BarrierInstalled(grain[0], grain[1][:-1], cause))

    def run_render(self) -> None:
        for grain, gen in self.dispatch("render"):
            (docs,) = self.kernel.inputs_of(grain)
            self.commit(grain, gen, list(range(docs)))
