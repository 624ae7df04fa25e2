"""The lineage kernel, driven fact by fact (no Ray, no store)."""

from __future__ import annotations

import pytest
from test_kernel_support import Driver, Parse

from rayorch.core.commit import CommitVerdict
from rayorch.core.errors import InvalidTransition, NoProgressError
from rayorch.core.facts import (
    REPORT_PRESENT,
    ExpansionClosed,
    GrainCommitted,
    GrainDispatched,
    RunCompleted,
    SourceAdmitted,
)
from rayorch.core.outcome import Outcome
from rayorch.core.state import Kernel, rebuild


def started(docs: list[int], **parse: object) -> Driver:
    """Sources admitted and rendered: the ocr Grains are ready."""
    driver = Driver(Kernel(Parse(**parse).compile()))  # type: ignore[arg-type]
    for index, count in enumerate(docs):
        driver.admit(index, count)
    driver.run_render()
    return driver


def finish(driver: Driver) -> None:
    while driver.kernel.ready_calls():
        for call in driver.kernel.ready_calls():
            for grain, gen in driver.dispatch(call):
                (value,) = driver.kernel.inputs_of(grain)
                result: object
                if call == "render":
                    result = list(range(value))
                else:
                    result = len(value) if call == "assemble" else value * 10
                driver.commit(grain, gen, result)


def test_pages_are_reassembled_in_ordinal_order_whatever_the_completion_order() -> None:
    driver = started([3, 2])
    batch = driver.dispatch("ocr", 10)
    assert [g for g, _ in batch] == [("ocr", (0, 0)), ("ocr", (0, 1)), ("ocr", (0, 2)),
                                     ("ocr", (1, 0)), ("ocr", (1, 1))]  # elastic: mixed parents
    for grain, gen in reversed(batch):
        driver.commit(grain, gen, f"page {grain[1][-1]}")
    assert driver.kernel.inputs_of(("assemble", (0,))) == (["page 0", "page 1", "page 2"],)
    assert driver.kernel.inputs_of(("assemble", (1,))) == (["page 0", "page 1"],)


def test_a_parent_completes_without_waiting_for_unrelated_parents() -> None:
    driver = started([1, 3])
    [(grain, gen)] = driver.dispatch("ocr", 1)
    driver.commit(grain, gen, 5)
    assert driver.kernel.ready_calls() == ["ocr", "assemble"]
    [(grain, gen)] = driver.dispatch("assemble")
    driver.commit(grain, gen, "doc0")
    assert [i for i, _ in driver.kernel.pop_completed()] == [0]


def test_zero_children_reduce_to_an_empty_list_at_once() -> None:
    driver = started([0])
    closed = [f for f in driver.log if isinstance(f, ExpansionClosed)]
    assert closed == [ExpansionClosed("root/0", (0,), "succeeded", 0)]
    assert driver.kernel.inputs_of(("assemble", (0,))) == ([],)


def test_parent_bound_takes_siblings_of_the_head_parent_only() -> None:
    driver = started([2, 3], policy="parent_bound")
    first = driver.dispatch("ocr", 10)
    assert [g[1] for g, _ in first] == [(0, 0), (0, 1)]
    second = driver.dispatch("ocr", 2)
    assert [g[1] for g, _ in second] == [(1, 0), (1, 1)]


def test_record_failure_affects_only_its_parent() -> None:
    driver = started([2, 2])
    batch = driver.dispatch("ocr", 10)
    driver.record_failure(batch[0][0], 0, "unreadable page")
    for grain, gen in batch[1:]:
        driver.commit(grain, gen, 1)
    finish(driver)
    done = dict(driver.kernel.pop_completed())
    assert done[0][0].outcome is Outcome.SUPPRESSED
    assert "unreadable page" in (done[0][0].cause or "")
    assert done[1][0].value == 2


def test_group_failure_suppresses_ready_and_in_flight_siblings_keeps_committed() -> None:
    driver = started([4, 2], batch=1)
    kernel = driver.kernel
    (g0, _), = driver.dispatch("ocr", 1)
    driver.commit(g0, 0, 7)  # committed sibling: kept
    (g1, _), = driver.dispatch("ocr", 1)  # in flight when the barrier comes
    (g2, _), = driver.dispatch("ocr", 1)
    driver.group_failure(g2, 0, "corrupt document")
    late = GrainCommitted("ocr", g1[1], 0, REPORT_PRESENT, (1,))
    assert kernel.verdict(late) is CommitVerdict.BARRED
    with pytest.raises(InvalidTransition):
        kernel.apply(late)
    # the ready sibling (0, 3) is never dispatched; the other parent is untouched
    assert [g for g, _ in driver.dispatch("ocr", 10)] == [("ocr", (1, 0)), ("ocr", (1, 1))]
    story = [type(f).__name__ for f in kernel.story(("ocr", (0, 0)))]
    assert story == ["GrainDispatched", "GrainCommitted", "BarrierInstalled"]
    assert kernel.verdict(GrainCommitted("ocr", (0, 0), 0, REPORT_PRESENT, (7,))) is (
        CommitVerdict.SEALED)  # committed sibling stays committed
    kernel.validate()


def test_group_failure_in_the_root_domain_acts_on_its_own_grain_only() -> None:
    driver = Driver(Kernel(Parse().compile()))
    driver.admit(0, 1)
    driver.admit(1, 1)
    batch = driver.dispatch("render")
    driver.group_failure(batch[0][0], 0, "bad pdf")
    driver.commit(batch[1][0], 0, [0])
    finish(driver)
    done = dict(driver.kernel.pop_completed())
    assert done[0][0].outcome is Outcome.SUPPRESSED and done[1][0].present


def test_physical_failure_retries_through_the_recovery_queue_alone_then_fails() -> None:
    driver = started([3], max_attempts=2)
    kernel = driver.kernel
    batch = driver.dispatch("ocr", 2)
    for fact in kernel.physical_failure(batch, "ValueError: boom"):
        driver.write(fact)
    assert kernel.take_batch("ocr", 10) == [(("ocr", (0, 0)), 1)]  # recovery first, alone
    driver.write(GrainDispatched("ocr", (0, 0), 1))
    facts = kernel.physical_failure([(("ocr", (0, 0)), 1)], "ValueError: boom")
    assert [type(f).__name__ for f in facts] == ["GrainFailed"]
    for fact in facts:
        driver.write(fact)
    kernel.validate()


def test_stale_duplicate_late_and_suppressed_reports_are_rejected_and_change_nothing() -> None:
    driver = started([4, 1], batch=1)
    kernel = driver.kernel
    (g0, _), = driver.dispatch("ocr", 1)
    driver.commit(g0, 0, 1)
    (g1, _), = driver.dispatch("ocr", 1)
    (g2, _), = driver.dispatch("ocr", 1)
    (g3, _), = driver.dispatch("ocr", 1)
    for fact in kernel.physical_failure([(g1, 0)], "TimeoutError"):
        driver.write(fact)  # g1 is ready again as generation 1
    driver.group_failure(g2, 0, "bad")  # g1 (ready) and g3 (in flight) are suppressed
    (h, _), = driver.dispatch("ocr", 1)
    assert h == ("ocr", (1, 0))  # the other parent is untouched
    reports = {
        "duplicate": (g0, 0, CommitVerdict.SEALED),
        "late (old generation, then suppressed)": (g1, 0, CommitVerdict.NOT_DISPATCHED),
        "suppressed while in flight": (g3, 0, CommitVerdict.BARRED),
        "stale (other generation)": (h, 5, CommitVerdict.STALE),
        "unknown grain": (("ocr", (9, 9)), 0, CommitVerdict.NOT_DISPATCHED),
    }
    before = kernel.snapshot()
    for name, (grain, gen, expected) in reports.items():
        report = GrainCommitted(grain[0], grain[1], gen, REPORT_PRESENT, (2,))
        assert kernel.verdict(report) is expected, name
        with pytest.raises(InvalidTransition) as err:
            kernel.apply(report)
        assert "commit gate" in str(err.value)
        assert kernel.snapshot() == before, f"a {name} report changed the state"
    kernel.validate()


def test_identical_announcements_are_no_ops_and_conflicting_ones_raise() -> None:
    driver = started([2])
    kernel = driver.kernel
    before = kernel.snapshot()
    assert kernel.apply(ExpansionClosed("root/0", (0,), "succeeded", 2)) == []
    assert kernel.snapshot() == before
    with pytest.raises(InvalidTransition, match="disagrees"):
        kernel.apply(ExpansionClosed("root/0", (0,), "succeeded", 3))
    with pytest.raises(InvalidTransition, match="already admitted"):
        kernel.apply(SourceAdmitted(0, (5,)))
    with pytest.raises(InvalidTransition):
        kernel.apply(GrainDispatched("ocr", (0, 0), 3))
    assert kernel.snapshot() == before


def test_an_identical_primary_fact_again_is_a_no_op_that_is_not_logged_twice() -> None:
    driver = started([2])
    kernel = driver.kernel
    (grain, gen), = driver.dispatch("ocr", 1)
    driver.commit(grain, gen, 3)
    before = kernel.snapshot()
    for fact in (SourceAdmitted(0, (2,)), GrainDispatched(grain[0], grain[1], gen),
                 GrainCommitted(grain[0], grain[1], gen, REPORT_PRESENT, (3,))):
        assert kernel.apply(fact) == []
    assert kernel.snapshot() == before
    with pytest.raises(InvalidTransition, match="commit gate"):  # same grain, other value
        kernel.apply(GrainCommitted(grain[0], grain[1], gen, REPORT_PRESENT, (4,)))


def test_rebuild_from_the_log_reaches_the_identical_state() -> None:
    driver = started([3, 0, 2], batch=2)
    batch = driver.dispatch("ocr", 2)
    driver.commit(batch[1][0], 0, 9)
    for fact in driver.kernel.physical_failure(batch[:1], "crash"):
        driver.write(fact)
    again = rebuild(driver.kernel.plan, driver.log)
    assert again.snapshot() == driver.kernel.snapshot()
    finish(driver)
    again = rebuild(driver.kernel.plan, driver.log)
    assert again.snapshot() == driver.kernel.snapshot()


def test_admission_is_bounded_and_the_run_completes_once() -> None:
    kernel = Kernel(Parse().compile(), max_active_sources=2, total_sources=3)
    driver = Driver(kernel)
    assert kernel.admissible() == 2
    driver.admit(0, 1)
    driver.admit(1, 0)
    assert kernel.admissible() == 0
    finish(driver)
    assert kernel.admissible() == 1
    driver.admit(2, 0)
    finish(driver)
    assert kernel.run_completed and driver.log[-1] == RunCompleted(3)
    assert [i for i, _ in kernel.pop_completed()] == [1, 0, 2]


def test_check_progress_names_the_pending_items_instead_of_hanging() -> None:
    driver = started([2])
    kernel = driver.kernel
    kernel.check_progress()  # ready grains: fine
    kernel.take_batch("ocr", 10)  # taken but never dispatched: nothing can progress
    kernel._ready["ocr"] = 0  # simulate lost work (only for this test)
    with pytest.raises(NoProgressError, match=r"ocr\[0\.0\]"):
        kernel.check_progress()


def test_story_lists_the_facts_of_one_grain_entity_and_expansion() -> None:
    driver = started([2])
    finish(driver)
    kernel = driver.kernel
    assert [type(f).__name__ for f in kernel.story(("ocr", (0, 1)))] == [
        "GrainDispatched", "GrainCommitted"]
    assert any(isinstance(f, SourceAdmitted) for f in kernel.story(0))
    assert kernel.story(("root/0", (0,)))[0] == ExpansionClosed("root/0", (0,), "succeeded", 2)
