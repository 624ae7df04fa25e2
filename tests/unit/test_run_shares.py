"""Fair shares between runs, one load per shared pool (rayorch/core/run_shares.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayorch.core.pool_sizing import SizingError, StageLoad
from rayorch.core.run_shares import fair_shares, leader, merge_loads, tighter

amounts = st.floats(min_value=0, max_value=64, allow_nan=False)
claims = st.dictionaries(st.sampled_from(["a", "b", "c", "d", "e"]),
                         st.fixed_dictionaries({"CPU": amounts}, optional={"GPU": amounts}),
                         min_size=1, max_size=5)
capacities = st.fixed_dictionaries({"CPU": amounts, "GPU": amounts})


@settings(max_examples=400, deadline=None)
@given(capacity=capacities, wants=claims)
def test_shares_add_up_to_the_cluster_and_each_run_gets_an_even_share_or_what_it_wants(
        capacity: dict[str, float], wants: dict[str, dict[str, float]]) -> None:
    shares = fair_shares(capacity, wants)
    assert set(shares) == set(wants)
    for key, total in capacity.items():
        given_out = [shares[who][key] for who in wants]
        assert math.isclose(sum(given_out), total, abs_tol=1e-6)  # nothing kept back
        even = total / len(wants)
        for who in wants:
            asked = min(total, wants[who].get(key, 0.0))
            # never starved: at least an even share, or all it asks
            assert shares[who][key] >= min(asked, even) - 1e-6
        # max-min fair: a run that gets less than it asks gets no less than any other
        for who in wants:
            if shares[who][key] < min(total, wants[who].get(key, 0.0)) - 1e-6:
                assert all(shares[other][key] <= shares[who][key] + 1e-6 for other in wants)


@settings(max_examples=200, deadline=None)
@given(capacity=capacities, wants=claims)
def test_shares_do_not_depend_on_the_order_runs_are_listed(
        capacity: dict[str, float], wants: dict[str, dict[str, float]]) -> None:
    backwards = dict(reversed(list(wants.items())))
    forward, reverse = fair_shares(capacity, wants), fair_shares(capacity, backwards)
    for who in wants:
        for key in capacity:
            assert math.isclose(forward[who][key], reverse[who][key], abs_tol=1e-9)


def test_a_run_that_arrives_late_gets_half_of_a_cluster_the_first_one_wants_whole() -> None:
    alone = fair_shares({"CPU": 8.0}, {"first": {"CPU": 8.0}})
    assert alone["first"]["CPU"] == 8.0
    both = fair_shares({"CPU": 8.0}, {"first": {"CPU": 8.0}, "late": {"CPU": 6.0}})
    assert both == {"first": {"CPU": 4.0}, "late": {"CPU": 4.0}}
    small = fair_shares({"CPU": 8.0}, {"first": {"CPU": 8.0}, "small": {"CPU": 1.0}})
    assert small == {"first": {"CPU": 7.0}, "small": {"CPU": 1.0}}


def test_a_run_without_gpu_work_leaves_every_gpu_to_the_one_that_has_some() -> None:
    shares = fair_shares({"CPU": 8.0, "GPU": 4.0},
                         {"cpu-only": {"CPU": 8.0}, "gpu": {"CPU": 2.0, "GPU": 4.0}})
    assert shares["gpu"]["GPU"] == 4.0
    assert shares["cpu-only"]["CPU"] == 6.0 and shares["gpu"]["CPU"] == 2.0


def test_a_negative_or_nan_claim_is_refused_in_plain_words() -> None:
    with pytest.raises(SizingError, match="claim of 'x'"):
        fair_shares({"CPU": 4.0}, {"x": {"CPU": float("nan")}})
    with pytest.raises(SizingError, match="negative"):
        fair_shares({"CPU": 4.0}, {"x": {"CPU": -1.0}})


def load(**kw: object) -> StageLoad:
    base: dict[str, object] = dict(name="ocr", size=2, min_size=1, max_size=8,
                                   need={"CPU": 1.0})
    base.update(kw)
    return StageLoad(**base)  # type: ignore[arg-type]


def test_merged_load_adds_the_drivers_work_and_keeps_the_pools_actors() -> None:
    mine = load(backlog=3, in_flight=2, coming=1.5, item_cost_s=0.2, idle_s=0.0, size=3)
    theirs = load(backlog=10, in_flight=1, coming=0.5, item_cost_s=0.4, idle_s=9.0, spare=2,
                  size=1)
    merged = merge_loads([mine, theirs])
    assert (merged.backlog, merged.in_flight, merged.coming) == (13, 3, 2.0)
    assert merged.size == 3  # the sizing driver's view of the shared actors
    assert merged.item_cost_s == 0.4  # measured on the most work
    assert merged.idle_s == 0.0 and merged.spare == 0  # busy for one driver: not idle
    idle = merge_loads([load(idle_s=5.0, spare=2), load(idle_s=8.0, spare=1)])
    assert (idle.idle_s, idle.spare) == (5.0, 1)
    with pytest.raises(SizingError):
        merge_loads([mine, load(name="render")])
    with pytest.raises(SizingError):
        merge_loads([])


def test_tighter_budget_and_leader() -> None:
    assert tighter(None, None) is None
    assert tighter({"GPU": 2.0}, None) == {"GPU": 2.0}
    assert tighter({"GPU": 2.0}, {"GPU": 3.0, "CPU": 4.0}) == {"GPU": 2.0, "CPU": 4.0}
    assert leader(["host-b", "host-a"]) == "host-a"
    assert leader(["host-b", "host-a"], current="host-b") == "host-b"  # no hand-over
    assert leader(["host-a"], current="host-b") == "host-a"  # the leader is gone
    assert leader([]) is None
