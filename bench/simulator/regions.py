"""The region grain as a simulated workload: two model stages of different costs.

render (CPU) -> F.expand pages -> layout (GPU, per page) -> F.expand regions ->
recognize (GPU, per region) -> F.reduce per page -> F.reduce per document -> assemble (CPU).

Costs (virtual seconds, one actor): render ``0.2 + 0.05/page``; layout a batch of up to 16
pages ``0.5 + 0.3/page`` (0.33 GPU-s a page); recognize a batch of up to 32 regions
``0.4 + 0.24/region`` (0.25 GPU-s a region); assemble ``0.05 + 0.002/page``. A page of a
born-digital document has 1-2 regions to recognise (0.38 GPU-s), a scanned one 3-7
(1.26 GPU-s), so the right split of the GPUs between the two model stages depends on the
corpus: about 2:3 (layout:recognize) for a born-digital corpus, 2:7 for a scanned one.
Region counts are a hash of (document, page): every run sees the same work.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.simulator.corpus import long_tail_counts
from bench.simulator.engine import CostModel, SimResult, Simulator
from rayorch.core import functional as F
from rayorch.core.ids import CallId
from rayorch.core.plan import Plan
from rayorch.core.pool_sizing import SizingSettings
from rayorch.core.program import PipelineBase, RayModule
from rayorch.core.tracer import Port
from rayorch.core.udf import Row

Doc = tuple[int, int, bool]  # (source index, pages, scanned)
Page = tuple[int, int, bool]  # (source index, ordinal, scanned)
Region = tuple[int, int, int]  # (source index, page, region)


def regions_of(doc: int, page: int, scanned: bool) -> int:
    """How many regions a page has to recognise (1-2 born-digital, 3-7 scanned)."""
    h = (doc * 1_000_003 + page * 7_919) % 9_973
    return 3 + h % 5 if scanned else 1 + h % 2


def render(docs: list[Doc]) -> list[list[Page]]:
    return [[(doc, i, scanned) for i in range(n)] for doc, n, scanned in docs]


def layout(pages: list[Page]) -> list[list[Region]]:
    return [[(doc, i, r) for r in range(regions_of(doc, i, s))] for doc, i, s in pages]


def recognize(regions: list[Region]) -> list[int]:
    return [r for _, _, r in regions]


def assemble(pages: list[list[list[int]]]) -> list[tuple[int, bool]]:
    """A document's pages -> (pages, every page's regions back in order)."""
    return [(len(p), all(t == list(range(len(t))) for t in p)) for p in pages]


@dataclass(frozen=True)
class RegionConfig:
    """One run: the GPUs, how they are split (or ``"auto"``), the costs."""

    gpus: int = 8
    layout_gpus: int | str = "auto"  # an int: layout gets it, recognize the rest
    render_actors: int = 16
    assemble_actors: int = 8
    layout_batch: int = 16
    recognize_batch: int = 32
    model_start_s: float = 30.0  # building an engine (virtual seconds)
    max_active_sources: int | None = 256
    sizing: SizingSettings = field(default_factory=SizingSettings)

    def replicas(self) -> tuple[int | tuple[int, int], int | tuple[int, int]]:
        if self.layout_gpus == "auto":
            return (1, self.gpus - 1), (1, self.gpus - 1)
        assert isinstance(self.layout_gpus, int) and 0 < self.layout_gpus < self.gpus
        return self.layout_gpus, self.gpus - self.layout_gpus


class RegionPipeline(PipelineBase):
    def __init__(self, config: RegionConfig) -> None:
        super().__init__()
        layout_replicas, recognize_replicas = config.replicas()
        self.render = RayModule(render, replicas=config.render_actors, num_cpus=1)
        self.layout = RayModule(layout, replicas=layout_replicas, num_gpus=1, num_cpus=0,
                                batch_size=config.layout_batch)
        self.recognize = RayModule(recognize, replicas=recognize_replicas, num_gpus=1,
                                   num_cpus=0, batch_size=config.recognize_batch)
        self.assemble = RayModule(assemble, replicas=config.assemble_actors, num_cpus=1)

    def forward(self, docs: Port) -> Port:
        pages = F.expand(self.render(docs))
        texts = self.recognize(F.expand(self.layout(pages)))
        done: Port = self.assemble(F.reduce(F.reduce(texts)))
        return done


def cost_model() -> CostModel:
    def cost(call: CallId, rows: Sequence[Row]) -> float:
        if call == "layout":
            return 0.5 + 0.3 * len(rows)
        if call == "recognize":
            return 0.4 + 0.24 * len(rows)
        if call == "render":
            return float(sum(0.2 + 0.05 * row[0][1] for row in rows))
        return float(sum(0.05 + 0.002 * len(row[0]) for row in rows))

    return cost


def corpus(kind: str, *, docs: int, seed: int = 0) -> list[Doc]:
    """The paper's long-tailed page counts (1-427 pages, 47.4 a document on average), for
    ``docs`` documents; ``born-digital``: 1 in 10 scanned, ``scanned``: 9 in 10."""
    counts = long_tail_counts(docs, round(docs * 174_744 / 3_689), seed=seed)
    share = {"born-digital": 0.1, "scanned": 0.9}[kind]
    rng = random.Random(seed + 1)
    return [(i, n, rng.random() < share) for i, n in enumerate(counts)]


def plan_for(config: RegionConfig) -> Plan:
    return RegionPipeline(config).compile()


def simulate(config: RegionConfig, docs: Sequence[Doc]) -> SimResult:
    auto = config.layout_gpus == "auto"
    simulator = Simulator(
        plan_for(config), cost_model(), config.max_active_sources,
        sizing=config.sizing if auto else None,
        capacity={"GPU": float(config.gpus),
                  "CPU": float(config.render_actors + config.assemble_actors)},
        start_s={"layout": config.model_start_s, "recognize": config.model_start_s})
    result = simulator.run([(doc,) for doc in docs])
    bad = [i for i, items in result.outputs.items()
           if not items[0].present or items[0].value != (docs[i][1], True)]
    if bad or len(result.outputs) != len(docs):
        raise SystemExit(f"the simulation gave wrong outputs for docs {bad[:5]}")
    return result


__all__ = ["RegionConfig", "RegionPipeline", "corpus", "cost_model", "plan_for",
           "regions_of", "simulate"]
