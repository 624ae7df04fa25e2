"""The virtual-clock simulator: same results as the reference interpreter, bounds, scaling."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bench.sim import main as sim_main
from bench.simulator.corpus import (
    PAPER_CHILDREN,
    PAPER_MAX,
    PAPER_MIN,
    PAPER_PARENTS,
    corpus_stats,
    long_tail_counts,
)
from bench.simulator.engine import SimResult, Simulator, merge_intervals
from bench.simulator.paper import (
    SimConfig,
    cost_model,
    lower_bound,
    paper_counts,
    plan_for,
    simulate,
    sources,
    strict_lower_bound,
)
from bench.workload import BenchError
from rayorch.core import functional as F
from rayorch.core.facts import ExpansionClosed
from rayorch.core.outcome import ActorFailure, GroupFailure, Item, Outcome
from rayorch.core.program import PipelineBase, RayModule
from rayorch.core.reference import ReferenceResult, evaluate
from rayorch.core.tracer import Port

SMALL = long_tail_counts(parents=40, total=1_500, high=200, seed=3)


def comparable(item: Item) -> tuple[Any, ...]:
    """Outcome and value; a Suppressed Item's cause depends on the schedule, so leave it out."""
    if item.outcome is Outcome.SUPPRESSED:
        return ("suppressed",)
    return (item.outcome.value, item.value, item.cause)


def assert_matches_reference(result: SimResult, ref: ReferenceResult) -> None:
    got = {i: tuple(comparable(x) for x in items) for i, items in result.outputs.items()}
    want = {i: tuple(comparable(x) for x in items) for i, items in ref.outputs.items()}
    assert got == want
    closed = {(f.domain, f.parent): (f.outcome, f.count)
              for f in result.kernel.log if isinstance(f, ExpansionClosed)}
    assert closed == ref.expansions


def max_concurrency(result: SimResult, call: str) -> int:
    edges = sorted([(b.start_s, 1) for b in result.batches if b.call == call]
                   + [(b.end_s, -1) for b in result.batches if b.call == call])
    level = peak = 0
    for _, step in edges:  # ends sort before starts at the same instant
        level += step
        peak = max(peak, level)
    return peak


def test_paper_corpus_shape_is_exact_and_seeded() -> None:
    counts = paper_counts()
    stats = corpus_stats(counts)
    assert (stats["parents"], stats["children"]) == (PAPER_PARENTS, PAPER_CHILDREN)
    assert (stats["min"], stats["max"]) == (PAPER_MIN, PAPER_MAX)
    assert stats["median"] < sum(counts) / len(counts)  # right-skewed: mean above median
    assert counts == paper_counts()
    assert counts != paper_counts(seed=1)


def test_long_tail_counts_refuses_an_impossible_total() -> None:
    with pytest.raises(BenchError, match="cannot draw"):
        long_tail_counts(parents=10, total=5_000, high=427)


@pytest.mark.parametrize("policy", ["elastic", "parent_bound"])
@pytest.mark.parametrize("gpus", [1, 3, 8])
def test_outputs_equal_the_reference_interpreter(policy: str, gpus: int) -> None:
    config = SimConfig(gpus=gpus, batch_size=8, policy=policy, render_actors=3,
                       assemble_actors=2, max_active_sources=6, failing_docs=(2, 17))
    plan = plan_for(config)
    srcs = sources(SMALL)
    result = Simulator(plan, cost_model(config), config.max_active_sources).run(srcs)
    assert_matches_reference(result, evaluate(plan, srcs))
    for doc, items in result.outputs.items():
        if doc in config.failing_docs:
            assert items[0].outcome is Outcome.SUPPRESSED
        else:
            assert items[0].value == (SMALL[doc], True)  # every page back, in order


class FlakyGroupGpu:
    """The first batch of the run fails physically (its actor is replaced and the batch
    retried); a page with ordinal 5 fails its whole parent."""

    failures_left = 0  # set by the test: the actors of one process share it

    def __init__(self, flaky: bool = True) -> None:
        self.flaky = flaky

    def __call__(self, pages: list[tuple[int, int]]) -> list[object]:
        if self.flaky and FlakyGroupGpu.failures_left > 0:
            FlakyGroupGpu.failures_left -= 1
            raise ActorFailure("transient device error")  # a physical failure: retried
        return [GroupFailure(f"doc {d} is bad") if i == 5 else i for d, i in pages]


def _pages(docs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    return [[(d, i) for i in range(n)] for d, n in docs]


def _count(texts: list[list[int]]) -> list[int]:
    return [len(t) for t in texts]


class GroupPipeline(PipelineBase):
    def __init__(self, gpus: int, flaky: bool = True) -> None:
        super().__init__()
        self.render = RayModule(_pages, replicas=2)
        self.gpu = RayModule(FlakyGroupGpu, flaky, replicas=gpus, batch_size=4, max_attempts=3)
        self.assemble = RayModule(_count)

    def forward(self, docs: Port) -> Port:
        pages = F.expand(self.render(docs))
        texts: Port = F.reduce(self.gpu(pages))
        done: Port = self.assemble(texts)
        return done


def test_group_failures_and_physical_retries_match_the_reference() -> None:
    counts = [3, 9, 1, 12, 6, 2]
    srcs = [((d, n),) for d, n in enumerate(counts)]
    plan = GroupPipeline(gpus=2).compile()

    def cost(call: str, rows: Sequence[tuple[Any, ...]]) -> float:
        return 1.0 + len(rows)

    FlakyGroupGpu.failures_left = 1
    result = Simulator(plan, cost, max_active_sources=None).run(srcs)
    assert result.retries > 0
    # (the reference interpreter models no actors: its GPU is not flaky)
    assert_matches_reference(result, evaluate(GroupPipeline(gpus=2, flaky=False).compile(), srcs))
    outcomes = [result.outputs[d][0].outcome for d in range(len(counts))]
    assert outcomes == [Outcome.PRESENT if n <= 5 else Outcome.SUPPRESSED for n in counts]


@pytest.mark.parametrize("gpus", [1, 2, 5, 16])
def test_makespan_is_at_least_the_lower_bound(gpus: int) -> None:
    config = SimConfig(gpus=gpus, render_actors=4, assemble_actors=2)
    result = simulate(config, SMALL)
    strict = strict_lower_bound(config, SMALL).total_s
    design = lower_bound(config, SMALL).total_s
    assert result.makespan_s >= strict - 1e-9
    # the lower-bound formula prices the last partial batch as full: off by at most b*B/G
    assert design - strict <= config.gpu_b_s * config.batch_size / gpus + 1e-9
    assert max_concurrency(result, "gpu") <= gpus
    assert max(result.batch_sizes("gpu")) <= config.batch_size
    assert sum(result.batch_sizes("gpu")) == sum(SMALL)
    assert result.makespan_s == max(result.completion_s.values())


def test_more_gpus_are_never_slower_on_the_same_workload() -> None:
    counts = long_tail_counts(parents=150, total=6_000, seed=7)
    makespans = [simulate(SimConfig(gpus=g), counts).makespan_s for g in (1, 2, 3, 4, 6, 8, 16)]
    assert all(b <= a for a, b in itertools.pairwise(makespans)), makespans


def test_one_gpu_is_busy_from_the_first_render_to_the_last_batch() -> None:
    result = simulate(SimConfig(gpus=1), SMALL)
    (window,) = result.windows("gpu")  # never idle once started
    first_render = min(b.end_s for b in result.batches if b.call == "render")
    assert window[0] == pytest.approx(first_render)
    assert result.utilization("gpu") > 0.99


def test_merge_intervals_unions_overlaps() -> None:
    assert merge_intervals([(3, 4), (0, 1), (0.5, 2), (2, 2.5)]) == [(0, 2.5), (3, 4)]


def test_quick_cli_writes_table_json_and_plot(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    figure = tmp_path / "figures" / "sim_scaling.png"
    assert sim_main(["--quick", "--out", str(tmp_path / "out"), "--figure", str(figure)]) == 0
    printed = capsys.readouterr().out
    assert "% of linear" in printed and "max_active_sources" in printed
    report = json.loads((tmp_path / "out" / "sim.json").read_text())
    rows = {r["gpus"]: r for r in report["scaling"]}
    assert set(rows) == {1, 2, 4, 8}
    assert all(r["makespan_s"] >= r["strict_bound_s"] for r in rows.values())
    assert rows[8]["makespan_s"] < rows[1]["makespan_s"] / 6
    assert figure.stat().st_size > 10_000
    assert (tmp_path / "out" / "sim_scaling.png").read_bytes() == figure.read_bytes()


# -- model stages on continuous-batching engines (bench/simulator/llm.py) ---------------------
def test_engine_model_batch_ends_with_its_longest_request() -> None:
    from bench.simulator.llm import EngineModel, EnginePool

    model = EngineModel(tokens=lambda row: row[0], step_a_s=1.0, step_b_s=0.0, max_seqs=8,
                        latency_s=0.5, inflight=1, depth=2)
    pool = EnginePool(model, actors=1)
    pool.send(0, 7, [(10,), (20,)], now=0.0)
    pool.send(0, 8, [(5,)], now=0.0)  # queued behind the first (inflight=1)
    ended = []
    while (t := pool.next_s()) != float("inf"):
        ended.extend(pool.advance(t))
    # arrives at 0.5, 20 steps of 1 s; the queued batch then runs 5 steps; results +0.5 s
    assert ended == [(7, 21.0), (8, 26.0)]
    assert pool.busy_fraction() == pytest.approx(1.0)
    assert pool.occupancy() == pytest.approx((2 * 10 + 1 * 10 + 1 * 5) / 25 / 8)


def test_engine_busy_sim_several_batches_in_flight_fill_the_engine(tmp_path: Path) -> None:
    from bench.engine_busy import main as busy_main

    assert busy_main(["sim", "--quick", "--out", str(tmp_path)]) == 0  # checks every output
    rows = json.loads((tmp_path / "engine_busy_sim.json").read_text())
    by_inflight = {row["max_inflight"]: row for row in rows}
    assert all(0.0 < row["busy_fraction"] <= 1.0 + 1e-9 for row in rows)
    assert by_inflight[4]["occupancy"] > 2 * by_inflight[1]["occupancy"]
    assert by_inflight[8]["pages_per_s"] > by_inflight[4]["pages_per_s"] > \
        by_inflight[1]["pages_per_s"]
