"""The one fold of a shard's facts (``rayorch.core.run_view``) that audit, status, show,
timeline, barrier effects and a driver's rebuild read."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rayorch.core.facts import (
    BarrierInstalled,
    ExpansionClosed,
    GrainCommitted,
    GrainDispatched,
    GrainFailed,
    GrainRetried,
    LeaseAcquired,
    OutputEmitted,
    RunCompleted,
    SourceAdmitted,
)
from rayorch.core.run_view import RunView, first_before, fold_shard, numbered
from rayorch.store import open_store
from rayorch.store.scripted_run import write_scripted_run

FACTS = [
    LeaseAcquired(0, "a", 1, ts=5.0),                                 # 1
    SourceAdmitted(0, ("doc",), ts=6.0),                              # 2
    GrainDispatched("render", (0,), 0),                               # 3 (no ts)
    GrainCommitted("render", (0,), 0, "present", (["p", "q"],)),      # 4
    ExpansionClosed("root/0", (0,), "succeeded", 2),                  # 5
    GrainDispatched("ocr", (0, 0), 0),                                # 6
    GrainDispatched("ocr", (0, 1), 0),                                # 7
    GrainRetried("ocr", (0, 0), 1, "crash"),                          # 8
    GrainDispatched("ocr", (0, 0), 1),                                # 9
    GrainCommitted("ocr", (0, 1), 0, "group_failure", None, "bad"),   # 10
    BarrierInstalled("ocr", (0,), "bad"),                             # 11
    GrainRetried("ocr", (0, 0), 2, "crash", ts=9.0),                  # 12
    GrainFailed("ocr", (0, 0), 2, "gave up"),                         # 13
    OutputEmitted(0, "suppressed"),                                   # 14
    SourceAdmitted(0, ("again",)),                                    # 15
    RunCompleted(1, ts=7.0),                                          # 16
]


def test_each_fact_is_filed_under_its_object_with_its_seq() -> None:
    view = fold_shard(3, numbered(FACTS))
    assert (view.shard, view.facts, view.last_seq) == (3, 16, 16)
    assert (view.first_ts, view.last_ts) == (5.0, 9.0)
    assert view.tags["grain_dispatched"] == 4 and view.tags["source_admitted"] == 2
    assert list(view.grains) == [("render", (0,)), ("ocr", (0, 0)), ("ocr", (0, 1))]
    assert [s for s, _ in view.admitted[0]] == [2, 15]
    assert [s for s, _ in view.emitted[0]] == [14]
    assert [(s, b.parent) for s, b in view.barriers] == [(11, (0,))]
    assert [s for s, _ in view.leases] == [1] and [s for s, _ in view.completed] == [16]
    assert view.closed_before("root/0", (0,), 5) is None
    assert view.closed_before("root/0", (0,), 6) == FACTS[4]
    assert not view.barrier_before("ocr", (0,), 11) and view.barrier_before("ocr", (0,), 12)


def test_a_grain_view_tells_its_story() -> None:
    view = fold_shard(0, numbered(FACTS))
    render, retried, failing = (view.grains[k] for k in
                                [("render", (0,)), ("ocr", (0, 0)), ("ocr", (0, 1))])
    assert render.commit == FACTS[3] and render.sealed_at == 4 and render.in_flight is None
    assert [s for s, _ in retried.history()] == [6, 8, 9, 12, 13]
    assert (retried.first_dispatch, retried.last_dispatch, retried.sealed_at) == (6, 9, 13)
    assert retried.in_flight is None and not retried.attempt_open  # failed after its retry
    assert failing.commit is not None and failing.commit.outcome == "group_failure"
    assert failing.seen_before(8) and not failing.seen_before(7)
    assert first_before(failing.committed, 10) is None
    assert first_before(failing.committed, 11) == FACTS[9]


def test_in_flight_and_open_attempts_differ_after_a_retry() -> None:
    facts = [GrainDispatched("ocr", (0, 0), 0), GrainRetried("ocr", (0, 0), 1, "crash"),
             GrainDispatched("ocr", (1, 0), 0)]
    view = fold_shard(0, numbered(facts))
    waiting, sent = view.grains[("ocr", (0, 0))], view.grains[("ocr", (1, 0))]
    assert waiting.in_flight is None and waiting.attempt_open  # dispatched, never settled
    assert sent.in_flight == 0 and sent.attempt_open


def test_a_store_reads_a_run_as_its_view() -> None:
    store = open_store("memory://")
    try:
        write_scripted_run(store, "v", pages=(2, 1), shards=2, micro_batch=1)
        view = store.read_view("v")
        assert sorted(view.shards) == [0, 1] and view.call_order == ["render", "ocr", "assemble"]
        assert view.call_domain == {"render": "root", "ocr": "root/0", "assemble": "root"}
        for k, shard in view.shards.items():
            assert shard.facts == len(list(store.iter_facts("v", k)))
        assert set(view.shards[0].admitted) == {0} and set(view.shards[1].admitted) == {1}
    finally:
        store.close()


@settings(max_examples=25)
@given(pages=st.lists(st.integers(0, 4), min_size=1, max_size=5),
       cuts=st.lists(st.integers(0, 200), max_size=4))
def test_extending_a_view_equals_folding_all_its_facts(pages: list[int], cuts: list[int]
                                                       ) -> None:
    """A live page extends its view with each poll's new facts (``ShardView.extend``)
    instead of refolding: any split of the log into polls gives the same view."""
    store = open_store("memory://")
    try:
        write_scripted_run(store, "x", pages=pages, shards=1, micro_batch=2,
                           record_failure=(0, 0), group_failure=None, retry=(0, 1))
        facts = [(s.seq, s.fact) for s in store.iter_facts("x", 0)]
    finally:
        store.close()
    whole = fold_shard(0, facts)
    live = fold_shard(0, [])
    bounds = [*sorted({min(c, len(facts)) for c in cuts}), len(facts)]
    start = 0
    for end in bounds:
        live.extend(facts[start:end])
        start = end
    assert live == whole
    run = RunView("x", {}, {}).extend({0: facts[:3]}).extend({0: facts[3:]})
    assert run.shards[0] == whole and run.facts == len(facts)
