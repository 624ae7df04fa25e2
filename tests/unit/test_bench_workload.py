"""The benchmark workload: tail shape, lower bound, UDF checks and output verification."""

from __future__ import annotations

import math

import pytest

from bench.peers.common import percentile
from bench.workload import (
    PAPER_POISON_FRACTION,
    BenchConfig,
    BenchError,
    assemble,
    child_counts,
    fake_gpu,
    largest_parents,
    lower_bound,
    make_parents,
    verify,
    workload_stats,
)

FAST = BenchConfig(gpu_a=0.0, gpu_b=0.0, render_base_s=0.0, render_per_child_s=0.0,
                   assemble_base_s=0.0, assemble_per_child_s=0.0, text_bytes=40)


def test_child_counts_are_seeded_bounded_and_long_tailed() -> None:
    counts = child_counts(1885, 400, seed=0)
    assert counts == child_counts(1885, 400, seed=0)
    assert counts != child_counts(1885, 400, seed=1)
    assert min(counts) >= 1 and max(counts) <= 400
    stats = workload_stats(make_parents(BenchConfig(parents=1885)))
    # The paper's failure workload: 99 of 1,885 parents hold 51.9% of 45,507 children.
    assert stats["top_parents"] == 99
    assert 0.45 < stats["top_share"] < 0.6
    assert 40_000 < stats["children"] < 55_000


def test_largest_parents_picks_the_biggest_and_breaks_ties_by_doc() -> None:
    parents = [{"doc": d, "n": n} for d, n in enumerate([5, 9, 9, 1, 7])]
    assert largest_parents(parents, 0.4) == (1, 2)
    assert largest_parents(parents, 0.01) == (1,)
    assert len(largest_parents(make_parents(BenchConfig(parents=1885)),
                               PAPER_POISON_FRACTION)) == 99


def test_lower_bound_follows_design_section_10() -> None:
    config = BenchConfig(gpus=2, batch_size=4, gpu_a=0.5, gpu_b=0.25, render_base_s=1.0,
                         render_per_child_s=0.0, assemble_base_s=2.0, assemble_per_child_s=0.0)
    parents = [{"doc": 0, "n": 5}, {"doc": 1, "n": 4}]
    bound = lower_bound(config, parents)
    assert bound.gpu_s == math.ceil(9 / 4) * (0.5 + 0.25 * 4) / 2
    assert bound.total_s == 1.0 + bound.gpu_s + 2.0


def test_fake_gpu_fails_only_child_zero_of_poisoned_parents() -> None:
    out = fake_gpu([3, 3, 4, 4], [0, 1, 0, 1], FAST, frozenset({3}))
    assert [bool(o.error) for o in out] == [True, False, False, False]
    assert all(len(o.text) == FAST.text_bytes for o in out if not o.error)


def test_assemble_detects_order_and_failure() -> None:
    assert assemble(1, [0, 1, 2], ["a", "b", "c"], ["", "", ""], FAST)["in_order"]
    assert not assemble(1, [0, 2, 1], ["a", "b", "c"], ["", "", ""], FAST)["in_order"]
    assert assemble(1, [0, 1], ["", "b"], ["boom", ""], FAST)["error"] == "boom"


def good_result(doc: int, n: int) -> dict[str, object]:
    return {"doc": doc, "children": n, "in_order": True, "chars": n * FAST.text_bytes,
            "error": ""}


def test_verify_accepts_correct_output_and_names_every_kind_of_wrong() -> None:
    config = FAST.replace(parents=3, poisoned=(2,))
    parents = [{"doc": 0, "n": 2}, {"doc": 1, "n": 3}, {"doc": 2, "n": 4}]
    ok = verify(config, parents, [(1, good_result(1, 3)), (0, good_result(0, 2)), (2, None)])
    assert ok.ok and ok.correct == 2 and ok.failed_as_expected == 1

    shuffled = dict(good_result(1, 3), in_order=False)
    bad = verify(config, parents, [(0, good_result(0, 2)), (0, good_result(0, 2)),
                                   (1, shuffled), (2, good_result(2, 4))])
    assert len(bad.wrong) == 3  # duplicate, out of order, poisoned came back healthy
    missing = verify(config, parents, [(0, None)])
    assert any("healthy doc 0 failed" in w for w in missing.wrong)
    assert any("never came back" in w for w in missing.wrong)


def test_config_round_trips_and_rejects_unknown_fields() -> None:
    config = BenchConfig(parents=7, poisoned=(1, 2))
    assert BenchConfig.from_json(config.to_json()) == config
    with pytest.raises(BenchError, match="unknown benchmark config fields"):
        BenchConfig.from_json({"parentz": 3})


def test_percentile() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert percentile([1.0, 2.0], 0.99) == pytest.approx(1.99)


def test_active_windows_are_the_union_of_calls() -> None:
    pytest.importorskip("matplotlib")  # the bench extra; CI installs only dev and pdf
    from bench.plots import active_windows

    assert active_windows([(3, 4), (0, 1), (0.5, 2), (2, 2.5)]) == [(0, 2.5), (3, 4)]
