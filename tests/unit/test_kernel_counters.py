"""``Kernel.ready_count`` / ``Kernel.suppressed_count``: the O(1) counters behind the progress
table, checked against what the Grains actually did."""

from __future__ import annotations

from typing import Any

import pytest
from test_kernel_regressions import FilteredGroup
from test_kernel_support import Driver, Parse

import rayorch as ro
from rayorch.core.errors import KernelError
from rayorch.core.outcome import Outcome
from rayorch.core.state import Kernel, rebuild


def started(docs: list[int], **parse: Any) -> Driver:
    driver = Driver(Kernel(Parse(**parse).compile()))
    for index, count in enumerate(docs):
        driver.admit(index, count)
    driver.run_render()
    return driver


def test_ready_count_follows_readiness_dispatch_and_retry() -> None:
    driver = started([3, 2], batch=2, max_attempts=2)
    kernel = driver.kernel
    assert (kernel.ready_count("render"), kernel.ready_count("ocr")) == (0, 5)
    batch = driver.dispatch("ocr", 2)
    assert kernel.ready_count("ocr") == 3
    for fact in kernel.physical_failure(batch[:1], "crash"):  # back to the recovery queue
        driver.write(fact)
    assert kernel.ready_count("ocr") == 4
    kernel.validate()  # the invariants recount the ready Grains and compare


def test_group_failure_counts_the_barred_and_the_ready_siblings_and_the_parent() -> None:
    driver = started([4, 2], batch=1)
    kernel = driver.kernel
    (g0, _), = driver.dispatch("ocr", 1)
    driver.commit(g0, 0, 7)  # committed: not suppressed
    driver.dispatch("ocr", 1)  # in flight when the barrier comes: barred
    (g2, _), = driver.dispatch("ocr", 1)
    assert kernel.ready_count("ocr") == 3  # (0, 3), (1, 0), (1, 1)
    driver.group_failure(g2, 0, "corrupt document")  # failed itself, not suppressed
    assert kernel.suppressed_count("ocr") == 2  # (0, 1) barred and (0, 3) never dispatched
    assert kernel.ready_count("ocr") == 2  # only the other parent's pages
    assert kernel.suppressed_count("assemble") == 1  # document 0 is decided without running
    assert kernel.suppressed_count("render") == 0
    again = rebuild(kernel.plan, driver.log)  # the counters are part of the fold state
    assert again.snapshot() == kernel.snapshot()
    assert again.suppressed_count("ocr") == 2


def first(values: list[int]) -> list[int]:
    return values


def second(values: list[int]) -> list[int]:
    return [v + 1 for v in values]


class TwoSteps(ro.Pipeline):
    def __init__(self) -> None:
        super().__init__()
        self.first = ro.RayModule(first, batch_size=8)
        self.second = ro.RayModule(second, batch_size=8)

    def forward(self, values: Any) -> Any:
        return self.second(self.first(values))


def test_suppressed_count_equals_the_suppressed_outputs_of_a_call() -> None:
    driver = Driver(Kernel(TwoSteps().compile()))
    for index in range(10):
        driver.admit(index, index)
    for grain, gen in driver.dispatch("first"):
        if grain[1][0] % 3 == 0:
            driver.record_failure(grain, gen, "bad record")
        else:
            driver.commit(grain, gen, grain[1][0])
    for grain, gen in driver.dispatch("second"):
        driver.commit(grain, gen, 0)
    outcomes = [items[0].outcome for _, items in driver.kernel.pop_completed()]
    assert driver.kernel.suppressed_count("second") == outcomes.count(Outcome.SUPPRESSED) == 4
    assert driver.kernel.suppressed_count("first") == 0  # Failed is not Suppressed


def test_dropped_grains_are_not_counted_as_suppressed() -> None:
    driver = Driver(Kernel(FilteredGroup().compile()))
    driver.admit(0, 7)
    for grain, gen in driver.dispatch("fan"):
        driver.commit(grain, gen, [0, 1, 2, 3])
    for grain, gen in driver.dispatch("keep"):
        driver.commit(grain, gen, grain[1][-1] == 0)
    assert driver.kernel.ready_count("ocr") == 1  # three pages were Dropped by the filter
    assert driver.kernel.suppressed_count("ocr") == 0


def test_an_unknown_call_is_a_kernel_error_that_names_the_calls() -> None:
    kernel = Kernel(Parse().compile())
    for count in (kernel.ready_count, kernel.suppressed_count):
        with pytest.raises(KernelError, match=r"no Call 'nope'.*render"):
            count("nope")
