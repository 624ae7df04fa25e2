"""The pool sizing policy (core/pool_sizing.py), alone: bounds, free resources, the run's
budget, convergence and no oscillation under a steady load (Hypothesis), and named cases."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rayorch.core.pool_sizing import (
    SizingError,
    SizingSettings,
    StageLoad,
    _Plan,
    idle_limit_s,
    plan_sizes,
)

EPS = 1e-6
SETTINGS = SizingSettings()
NEEDS = ({"CPU": 1.0}, {"GPU": 1.0}, {"GPU": 0.5, "CPU": 1.0}, {"CPU": 0.5}, {"GPU": 2.0})


@st.composite
def stage_loads(draw: st.DrawFn, name: str) -> StageLoad:
    low = draw(st.integers(1, 3))
    high = draw(st.integers(low, low + 8))
    size = draw(st.integers(0, high + 2))
    return StageLoad(
        name=name, size=size, min_size=low, max_size=high,
        need=draw(st.sampled_from(NEEDS)),
        backlog=draw(st.integers(0, 5000)),
        in_flight=draw(st.integers(0, 200)),
        coming=draw(st.sampled_from([0.0, 0.0, 10.0, 2500.5])),
        item_cost_s=draw(st.none() | st.floats(0.001, 50.0)),
        batch_size=draw(st.integers(1, 64)),
        holds_model=draw(st.booleans()),
        idle_s=draw(st.floats(0.0, 1000.0)),
        spare=draw(st.integers(0, size)),
        draining=draw(st.integers(0, 3)),
        start_s=draw(st.none() | st.floats(0.0, 60.0)),
    )


@st.composite
def pools(draw: st.DrawFn) -> list[StageLoad]:
    count = draw(st.integers(1, 4))
    return [draw(stage_loads(f"s{i}")) for i in range(count)]


resources = st.fixed_dictionaries({"CPU": st.integers(0, 64).map(float),
                                   "GPU": st.integers(0, 32).map(lambda g: g / 2)})


def grown_use(stages: list[StageLoad], sizes: dict[str, int]) -> dict[str, float]:
    """Resources the growth above each stage's size (or its min) asks for."""
    use: dict[str, float] = {}
    for s in stages:
        extra = max(0, sizes[s.name] - max(s.size, s.min_size))
        for key, amount in s.need.items():
            use[key] = use.get(key, 0.0) + extra * amount
    return use


def test_an_unmeasured_stage_above_its_even_share_frees_nothing_for_another() -> None:
    """Found by Hypothesis: an unmeasured stage above its even share (3 of 4 GPUs, share 2)
    counted its excess as free room, and a second unmeasured stage grew into a GPU that no
    one had freed (nothing was free)."""
    unmeasured = dict(min_size=1, need={"GPU": 1.0}, backlog=1, in_flight=0, coming=0.0,
                      item_cost_s=None, batch_size=1, holds_model=False, idle_s=0.0, spare=0,
                      draining=0, start_s=None)
    stages = [StageLoad(name="s0", size=3, max_size=3, **unmeasured),
              StageLoad(name="s1", size=1, max_size=2, **unmeasured)]
    decision = plan_sizes(stages, {"CPU": 0.0, "GPU": 0.0}, SETTINGS)
    assert dict(decision.sizes) == {"s0": 3, "s1": 1}


def test_a_min_brought_up_by_a_drain_grows_no_further_on_what_the_drain_frees() -> None:
    """Found by Hypothesis: a stage below its min (0 of 1) took its actor from a stage that
    gives back two GPUs by draining, and grew again at once into the second one, which no
    one had freed yet (nothing was free)."""
    common = dict(min_size=1, max_size=2, in_flight=0, coming=0.0, item_cost_s=None,
                  batch_size=1, holds_model=False, idle_s=0.0, spare=0, draining=0,
                  start_s=None)
    stages = [StageLoad(name="s0", size=0, need={"GPU": 1.0}, backlog=1, **common),
              StageLoad(name="s1", size=2, need={"GPU": 2.0}, backlog=0, **common)]
    decision = plan_sizes(stages, {"CPU": 0.0, "GPU": 0.0}, SETTINGS)
    assert dict(decision.sizes) == {"s0": 1, "s1": 1}


def test_a_shortage_no_one_can_give_back_leaves_no_room_from_another_drain() -> None:
    """Found by Hypothesis: with CPUs short and no stage to give one back, the loop that
    frees resources stopped before it closed the room, and a GPU a drain would free later
    was grown into at once."""
    common = dict(min_size=1, in_flight=0, coming=0.0, item_cost_s=None, batch_size=1,
                  holds_model=False, idle_s=0.0, spare=0, draining=0, start_s=None)
    stages = [StageLoad(name="s0", size=0, max_size=1, need={"CPU": 1.0}, backlog=0, **common),
              StageLoad(name="s1", size=0, max_size=2, need={"GPU": 1.0}, backlog=1, **common),
              StageLoad(name="s2", size=2, max_size=2, need={"GPU": 2.0}, backlog=0, **common)]
    decision = plan_sizes(stages, {"CPU": 0.0, "GPU": 0.0}, SETTINGS)
    assert dict(decision.sizes) == {"s0": 1, "s1": 1, "s2": 1}


@settings(max_examples=80)
@given(pools(), resources, st.none() | resources)
def test_targets_stay_within_bounds_free_resources_and_budget(
        stages: list[StageLoad], free: dict[str, float], budget: dict[str, float] | None
) -> None:
    """Never below min nor above max; growth never takes more than is free, nor (with a
    budget) leaves the run above it while a stage using the resource could give back."""
    decision = plan_sizes(stages, free, SETTINGS, budget=budget)
    sizes = dict(decision.sizes)
    assert set(sizes) == {s.name for s in stages}
    for s in stages:
        assert s.min_size <= sizes[s.name] <= s.max_size
    for key, amount in grown_use(stages, sizes).items():
        assert amount <= free.get(key, 0.0) + EPS
    if budget is not None:
        for key, cap in budget.items():
            held = sum(s.need.get(key, 0.0) * (sizes[s.name] + s.draining) for s in stages)
            if held > cap + EPS:  # only when every stage using it is down to its min
                assert all(sizes[s.name] <= max(s.min_size, s.size) for s in stages
                           if s.need.get(key, 0.0) > 0)
                assert all(sizes[s.name] == s.min_size for s in stages
                           if s.need.get(key, 0.0) > 0 and s.size >= s.min_size)
    changed = {c.stage for c in decision.changes}
    assert changed == {s.name for s in stages if sizes[s.name] != s.size}
    assert all(c.reason for c in decision.changes)


@settings(max_examples=60)
@given(pools(), resources)
def test_decision_is_deterministic_and_independent_of_stage_order(
        stages: list[StageLoad], free: dict[str, float]) -> None:
    forward = plan_sizes(stages, free, SETTINGS)
    backward = plan_sizes(list(reversed(stages)), free, SETTINGS)
    assert forward.sizes == backward.sizes
    assert forward == plan_sizes(stages, free, SETTINGS)


@settings(max_examples=60)
@given(pools(), resources)
def test_a_stage_shrinks_only_for_a_reason(stages: list[StageLoad], free: dict[str, float]
                                           ) -> None:
    """Without a budget a stage loses actors only when it is above its max, its spare actors
    were idle past their limit, it gives way to a backed-up stage, or a stage below its min
    needs the room; it grows only when below its min, backed up (ready Grains wait), or
    not measured yet with work coming."""
    decision = plan_sizes(stages, free, SETTINGS)
    below_min = any(s.size < s.min_size for s in stages)
    for s in stages:
        after = decision.sizes[s.name]
        if after < s.size:
            idle = (s.backlog == 0 and s.spare > 0 and s.idle_s >= idle_limit_s(s, SETTINGS))
            assert s.size > s.max_size or idle or any(
                c.stage == s.name and (c.reason.startswith("gives way") or below_min)
                for c in decision.changes)
        if after > s.size:
            assert s.size < s.min_size or s.backlog > 0 or (
                s.item_cost_s is None and s.coming > 0)


def steady_run(stages: list[StageLoad], capacity: dict[str, float], *, lag: bool,
               steps: int) -> list[tuple[int, ...]]:
    """Apply the policy again and again under the same load (the shell does what it says:
    actors start at once; with ``lag`` a drained actor holds its resources one decision
    longer). The sizes after each decision."""
    history = []
    current = list(stages)
    for _ in range(steps):
        held = {key: sum(s.need.get(key, 0.0) * (s.size + s.draining) for s in current)
                for key in capacity}
        free = {key: capacity[key] - held[key] for key in capacity}
        decision = plan_sizes(current, free, SETTINGS)
        current = [dataclasses.replace(
            s, size=decision.sizes[s.name],
            draining=max(0, s.size - decision.sizes[s.name]) if lag else 0,
            spare=min(s.spare, decision.sizes[s.name])) for s in current]
        history.append(tuple(s.size for s in current) + tuple(s.draining for s in current))
    return history


@st.composite
def steady_pools(draw: st.DrawFn) -> tuple[list[StageLoad], dict[str, float]]:
    """Stages that fit in a cluster: their current sizes hold at most its capacity."""
    stages = [dataclasses.replace(s, draining=0, size=max(s.size, s.min_size))
              for s in draw(pools())]
    stages = [dataclasses.replace(s, size=min(s.size, s.max_size)) for s in stages]
    held = {key: sum(s.need.get(key, 0.0) * s.size for s in stages) for key in ("CPU", "GPU")}
    extra = draw(resources)
    return stages, {key: held[key] + extra[key] for key in held}


@settings(max_examples=80)
@given(steady_pools(), st.booleans())
def test_sizes_converge_and_never_oscillate_under_a_steady_load(
        case: tuple[list[StageLoad], dict[str, float]], lag: bool) -> None:
    """Under a load that does not change, the sizes reach a fixed point and no earlier
    state comes back on the way (hysteresis: a move is never undone)."""
    stages, capacity = case
    bound = 4 * sum(s.max_size for s in stages) + 8
    history = steady_run(stages, capacity, lag=lag, steps=bound)
    last = history[-1]
    assert history[-2] == last, "no fixed point"
    first = history.index(last)
    path = history[: first + 1]
    assert len(set(path)) == len(path), f"a state came back: {path}"


# Found by the default suite after the merge: an unmeasured stage with work keeps its even
# share reserved, so a measured stage may not take the actor the property thought fitted.
_RESERVED_SHARE = ([
    StageLoad(name="s0", size=1, min_size=1, max_size=1, need={"GPU": 1.0}, backlog=0,
              in_flight=0, coming=0.0, item_cost_s=1.0, batch_size=1, holds_model=False,
              idle_s=0.0, spare=0, draining=0, start_s=None),
    StageLoad(name="s1", size=1, min_size=1, max_size=2, need={"GPU": 1.0}, backlog=1,
              in_flight=0, coming=0.0, item_cost_s=None, batch_size=1, holds_model=False,
              idle_s=0.0, spare=0, draining=0, start_s=None),
    StageLoad(name="s2", size=3, min_size=3, max_size=4, need={"GPU": 0.5, "CPU": 1.0},
              backlog=1, in_flight=3, coming=0.0, item_cost_s=8.0, batch_size=1,
              holds_model=False, idle_s=0.0, spare=0, draining=0, start_s=None),
], {"CPU": 4.0, "GPU": 4.0})


@settings(max_examples=80)
@given(steady_pools())
@example(_RESERVED_SHARE)
def test_at_the_fixed_point_no_stage_is_much_more_pressed_than_one_that_could_give(
        case: tuple[list[StageLoad], dict[str, float]]) -> None:
    """Convergence to a balanced split: once settled, a backed-up stage that cannot grow is
    at most ``hysteresis`` times as pressed (per unit of resource) as any stage above its
    min, one actor smaller, whose one actor would free what it lacks."""
    stages, capacity = case
    history = steady_run(stages, capacity, lag=False, steps=4 * sum(s.max_size
                                                                    for s in stages) + 8)
    sizes = dict(zip([s.name for s in stages], history[-1], strict=False))
    held = {key: sum(s.need.get(key, 0.0) * sizes[s.name] for s in stages) for key in capacity}
    free = {key: capacity[key] - held[key] for key in capacity}
    # An unmeasured stage with work keeps its even share reserved (``grow_unmeasured``):
    # what it does not hold yet is not free for the others.
    plan = _Plan(stages, SETTINGS, capacity)
    for t in stages:
        if t.item_cost_s is None and (t.backlog or t.coming) and not t.draining:
            missing = max(0, plan.fair_share(t.name) - sizes[t.name])
            for key, amount in t.need.items():
                free[key] = free.get(key, 0.0) - amount * missing

    def unit(s: StageLoad) -> float:
        return max((a / capacity[k] for k, a in s.need.items() if a and capacity[k] > 0),
                   default=0.0) or 1.0

    def pressure(s: StageLoad, n: int) -> float:
        return 0.0 if s.load_s <= 0 else s.load_s / n / unit(s)

    for r in stages:
        n = sizes[r.name]
        horizon = max(SETTINGS.backlog_s, r.batch_s)
        wants = (r.backlog > 0 and r.item_cost_s is not None and r.load_s > 0
                 and n < min(r.max_size, math.ceil(r.load_s / horizon - 1e-9)))
        fits = all(a <= free.get(k, 0.0) + EPS for k, a in r.need.items() if a)
        assert not (wants and fits), f"{r.name} is backed up and an actor fits"
        if not wants:
            continue
        short = {k: a - free.get(k, 0.0) for k, a in r.need.items() if a > free.get(k, 0.0)}
        for d in stages:
            if (d is r or sizes[d.name] <= d.min_size or d.item_cost_s is None
                    or any(d.need.get(k, 0.0) < a - EPS for k, a in short.items())):
                continue  # (one actor of d would not free what r lacks)
            assert pressure(d, sizes[d.name] - 1) * SETTINGS.hysteresis >= \
                pressure(r, n) - EPS


# -- named cases ---------------------------------------------------------------------------------
def gpu_stage(name: str, size: int, backlog: int, cost: float, **kw: object) -> StageLoad:
    fields: dict[str, object] = {"min_size": 1, "max_size": 8, "need": {"GPU": 1.0},
                                 "batch_size": 16, "holds_model": True, "item_cost_s": cost}
    fields.update(kw)
    return StageLoad(name, size, backlog=backlog, **fields)  # type: ignore[arg-type]


def test_a_backed_up_stage_grows_into_free_resources_only() -> None:
    stage = gpu_stage("ocr", 1, backlog=1000, cost=1.0, in_flight=16)
    assert plan_sizes([stage], {"GPU": 3.0}, SETTINGS).sizes["ocr"] == 4
    assert plan_sizes([stage], {"GPU": 0.5}, SETTINGS).sizes["ocr"] == 1


def test_free_resources_go_to_the_stage_whose_backlog_takes_longest() -> None:
    layout = gpu_stage("layout", 2, backlog=320, cost=0.3, in_flight=32)  # 52.8 s
    recognize = gpu_stage("recognize", 2, backlog=320, cost=1.0, in_flight=32)  # 176 s
    decision = plan_sizes([layout, recognize], {"GPU": 1.0}, SETTINGS)
    assert decision.sizes == {"layout": 2, "recognize": 3}
    assert decision.binding == "recognize"


def test_a_stage_much_less_pressed_gives_way_and_a_close_one_does_not() -> None:
    idle_ish = gpu_stage("layout", 4, backlog=0, cost=0.1, in_flight=16)
    pressed = gpu_stage("recognize", 4, backlog=4000, cost=1.0, in_flight=64)
    decision = plan_sizes([idle_ish, pressed], {"GPU": 0.0}, SETTINGS)
    assert decision.sizes == {"layout": 1, "recognize": 4}  # it grows once they drained
    assert decision.changes[0].reason.startswith("gives way to recognize")
    close = gpu_stage("layout", 4, backlog=3000, cost=1.0, in_flight=64)
    assert plan_sizes([close, pressed], {"GPU": 0.0}, SETTINGS).changes == ()


def test_while_an_actor_drains_no_second_one_is_taken_for_the_same_need() -> None:
    layout = gpu_stage("layout", 3, backlog=0, cost=0.1, in_flight=16, draining=1)
    one_more = gpu_stage("recognize", 4, backlog=8, cost=1.0, in_flight=64)  # wants 5
    assert plan_sizes([layout, one_more], {"GPU": 0.0}, SETTINGS).changes == ()
    assert plan_sizes([dataclasses.replace(layout, draining=0), one_more], {"GPU": 0.0},
                      SETTINGS).sizes == {"layout": 2, "recognize": 4}


def test_a_much_more_pressed_stage_takes_several_actors_in_one_decision() -> None:
    layout = gpu_stage("layout", 6, backlog=0, cost=0.1, in_flight=16)
    pressed = gpu_stage("recognize", 2, backlog=4000, cost=1.0, in_flight=32)
    decision = plan_sizes([layout, pressed], {"GPU": 0.0}, SETTINGS)
    assert decision.sizes == {"layout": 1, "recognize": 2}  # five drain, then go to it


def test_idle_model_actors_stay_longer_than_idle_cpu_actors() -> None:
    cpu = StageLoad("render", 6, 1, 8, {"CPU": 1.0}, item_cost_s=0.2, idle_s=60.0, spare=4)
    gpu = gpu_stage("ocr", 6, backlog=0, cost=1.0, idle_s=60.0, spare=4)
    decision = plan_sizes([cpu, gpu], {"CPU": 0.0, "GPU": 0.0}, SETTINGS)
    assert decision.sizes == {"render": 2, "ocr": 6}
    later = dataclasses.replace(gpu, idle_s=SETTINGS.model_idle_limit_s)
    assert plan_sizes([later], {}, SETTINGS).sizes == {"ocr": 2}
    slow_start = dataclasses.replace(cpu, start_s=20.0)  # kept 10x its start-up time
    assert plan_sizes([slow_start], {}, SETTINGS).sizes == {"render": 6}


def test_a_fixed_size_never_changes() -> None:
    fixed = gpu_stage("ocr", 4, backlog=10_000, cost=2.0, min_size=4, max_size=4,
                      idle_s=1e6, spare=4)
    assert plan_sizes([fixed], {"GPU": 16.0}, SETTINGS).sizes == {"ocr": 4}


def test_a_stage_not_measured_yet_gets_an_even_share_kept_from_a_measured_one() -> None:
    layout = gpu_stage("layout", 1, backlog=10_000, cost=0.3)
    unknown = gpu_stage("recognize", 1, backlog=0, cost=1.0, item_cost_s=None, coming=50.0)
    decision = plan_sizes([layout, unknown], {"GPU": 6.0}, SETTINGS)
    assert decision.sizes == {"layout": 4, "recognize": 4}  # 8 GPUs: half each
    assert "not measured yet" in decision.changes[1].reason
    idle_unknown = dataclasses.replace(unknown, coming=0.0)
    assert plan_sizes([layout, idle_unknown], {"GPU": 6.0}, SETTINGS).sizes == {
        "layout": 7, "recognize": 1}


def test_over_budget_the_least_pressed_stage_gives_back_first() -> None:
    a = gpu_stage("a", 4, backlog=100, cost=1.0)
    b = gpu_stage("b", 4, backlog=10, cost=1.0)
    decision = plan_sizes([a, b], {"GPU": 0.0}, SETTINGS, budget={"GPU": 6.0})
    assert decision.sizes == {"a": 4, "b": 1}  # two go back to the cluster, one to a
    only_budget = plan_sizes([a, dataclasses.replace(b, backlog=60)], {"GPU": 0.0}, SETTINGS,
                             budget={"GPU": 6.0})
    assert only_budget.sizes == {"a": 4, "b": 2}
    assert only_budget.changes[0].reason.startswith("the run holds more than its share")


def test_bad_loads_are_refused_in_plain_words() -> None:
    with pytest.raises(SizingError, match="1 <= min"):
        plan_sizes([StageLoad("x", 1, 0, 2, {})], {}, SETTINGS)
    with pytest.raises(SizingError, match="repeat"):
        plan_sizes([StageLoad("x", 1, 1, 2, {}), StageLoad("x", 1, 1, 2, {})], {}, SETTINGS)
    with pytest.raises(SizingError, match="hysteresis"):
        SizingSettings(hysteresis=0.5)


def test_a_stage_waiting_for_its_first_work_is_not_grown_and_shed_in_turn() -> None:
    """Found on real Ray: an unmeasured stage with work coming got its even share, idled
    (its feeder was slow), lost it to the idle rule, got it again... Kept until measured."""
    waiting = StageLoad("work", 1, 1, 4, {"CPU": 0.5}, coming=10.0, idle_s=1e4, spare=4)
    feeder = StageLoad("split", 1, 1, 1, {"CPU": 0.5}, backlog=10, item_cost_s=2.5)
    history = steady_run([waiting, feeder], {"CPU": 4.0}, lag=False, steps=6)
    assert history[0][0] == 4 and len(set(history)) == 1
