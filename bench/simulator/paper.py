"""The paper's PDF pipeline as a simulated workload: render -> expand -> gpu -> reduce -> assemble.

Costs (virtual seconds) are calibrated on the paper's MinerU numbers: a full GPU batch of
``B = 32`` pages costs ``a + b*B = 1.0 + 1.225*32 = 40.2 s``, i.e. 1.256 GPU-s per page,
which is the paper's 4-GPU figure (15.26 h x 4 GPUs / 174,744 pages). Rendering a PDF costs
``0.2 s + 0.05 s/page`` on a CPU actor, assembling it ``0.05 s + 0.002 s/page``. The UDFs
are trivial Python functions (time is virtual); their values let a test check that every
parent gets all of its pages back, in order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bench.simulator.corpus import long_tail_counts
from bench.simulator.engine import CostModel, SimResult, Simulator
from bench.workload import LowerBound
from rayorch.core import functional as F
from rayorch.core.ids import CallId
from rayorch.core.outcome import RecordFailure
from rayorch.core.plan import Plan
from rayorch.core.program import PipelineBase, RayModule
from rayorch.core.tracer import Port
from rayorch.core.udf import Row

Doc = tuple[int, int]  # (source index, page count)
Page = tuple[int, int]  # (source index, ordinal)


@dataclass(frozen=True)
class SimConfig:
    """Actor counts, batch size, policy, admission bound and stage costs of one run."""

    gpus: int = 4
    batch_size: int = 32
    gpu_a_s: float = 1.0
    gpu_b_s: float = 1.225
    policy: str = "elastic"
    render_actors: int = 16
    render_base_s: float = 0.2
    render_per_page_s: float = 0.05
    assemble_actors: int = 8
    assemble_base_s: float = 0.05
    assemble_per_page_s: float = 0.002
    max_active_sources: int | None = 256
    failing_docs: tuple[int, ...] = ()  # page 0 of these docs returns a RecordFailure

    def render_cost(self, pages: int) -> float:
        return self.render_base_s + self.render_per_page_s * pages

    def assemble_cost(self, pages: int) -> float:
        return self.assemble_base_s + self.assemble_per_page_s * pages

    def gpu_cost(self, batch: int) -> float:
        return self.gpu_a_s + self.gpu_b_s * batch


def render(docs: list[Doc]) -> list[list[Page]]:
    """A document -> its ordered pages."""
    return [[(doc, i) for i in range(n)] for doc, n in docs]


def gpu(pages: list[Page], failing: frozenset[int] = frozenset()) -> list[object]:
    """A batch of pages -> their 'text' (the ordinal); page 0 of a failing doc fails."""
    return [
        RecordFailure(f"doc {doc}: unreadable page") if ordinal == 0 and doc in failing
        else ordinal
        for doc, ordinal in pages
    ]


def assemble(texts: list[list[int]]) -> list[tuple[int, bool]]:
    """A document's page texts in ordinal order -> (pages, came back in order)."""
    return [(len(t), t == list(range(len(t)))) for t in texts]


class PdfSimPipeline(PipelineBase):
    """``assemble(F.reduce(gpu(F.expand(render(docs)))))`` with the config's pools."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__()
        self.render = RayModule(render, replicas=config.render_actors, batch_size=1)
        self.gpu = RayModule(gpu, replicas=config.gpus, batch_size=config.batch_size,
                             num_gpus=1, policy=config.policy,
                             failing=frozenset(config.failing_docs))
        self.assemble = RayModule(assemble, replicas=config.assemble_actors, batch_size=1)

    def forward(self, docs: Port) -> Port:
        pages = F.expand(self.render(docs))
        texts: Port = F.reduce(self.gpu(pages))
        done: Port = self.assemble(texts)
        return done


def cost_model(config: SimConfig) -> CostModel:
    """Virtual seconds per batch for each Call of :class:`PdfSimPipeline`."""

    def cost(call: CallId, rows: Sequence[Row]) -> float:
        if call == "gpu":
            return config.gpu_cost(len(rows))
        if call == "render":
            return sum(config.render_cost(row[0][1]) for row in rows)
        return sum(config.assemble_cost(len(row[0])) for row in rows)

    return cost


def sources(counts: Sequence[int]) -> list[tuple[Doc]]:
    """One forward argument per document: ``(index, page count)``."""
    return [((doc, n),) for doc, n in enumerate(counts)]


def plan_for(config: SimConfig) -> Plan:
    return PdfSimPipeline(config).compile()


def simulate(config: SimConfig, counts: Sequence[int]) -> SimResult:
    """Run the PDF pipeline over documents with these page counts under ``config``."""
    simulator = Simulator(plan_for(config), cost_model(config), config.max_active_sources)
    return simulator.run(sources(counts))


def lower_bound(config: SimConfig, counts: Sequence[int]) -> LowerBound:
    """The lower bound (docs/ARCHITECTURE.md, "Lower bound"):
    ``first-render + ceil(N/B)*(a+b*B)/G + last-assemble``.

    ``first-render`` / ``last-assemble`` are the cheapest document's (nothing reaches the
    GPU before one render ends; nothing ends before one assemble after the last batch).
    """
    batches = math.ceil(sum(counts) / config.batch_size)
    smallest = min(counts)
    return LowerBound(config.render_cost(smallest),
                      batches * config.gpu_cost(config.batch_size) / config.gpus,
                      config.assemble_cost(smallest))


def strict_lower_bound(config: SimConfig, counts: Sequence[int]) -> LowerBound:
    """A bound no schedule can beat: the section 10 bound with partial batches priced exactly.

    The fewest batches are ``ceil(N/B)`` and every page costs ``b``, so the GPU pool needs at
    least ``ceil(N/B)*a + N*b`` actor-seconds, all inside ``[first-render, end - last-assemble]``.
    It differs from :func:`lower_bound` by at most ``b*B/G`` (the last batch's empty slots).
    """
    total = sum(counts)
    smallest = min(counts)
    work = math.ceil(total / config.batch_size) * config.gpu_a_s + total * config.gpu_b_s
    return LowerBound(config.render_cost(smallest), work / config.gpus,
                      config.assemble_cost(smallest))


def paper_counts(seed: int = 0) -> list[int]:
    """The paper's corpus shape (see :mod:`bench.simulator.corpus`)."""
    return long_tail_counts(seed=seed)


__all__ = [
    "PdfSimPipeline",
    "SimConfig",
    "assemble",
    "cost_model",
    "gpu",
    "lower_bound",
    "paper_counts",
    "plan_for",
    "render",
    "simulate",
    "sources",
    "strict_lower_bound",
]
