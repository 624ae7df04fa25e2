"""Counterexamples Hypothesis found in the kernel, kept as named regression tests."""

from __future__ import annotations

from typing import Any

import pytest
from test_kernel_support import Driver

import rayorch as ro
from rayorch import F
from rayorch.core.errors import InvalidTransition
from rayorch.core.facts import GrainCommitted, GrainFailed
from rayorch.core.outcome import Outcome
from rayorch.core.state import Kernel


def fan(values: list[int]) -> list[list[int]]:
    return [[0, 1, 2, 3] for _ in values]


def keep_first(values: list[int]) -> list[bool]:
    return [v == 0 for v in values]


def ident(values: list[Any]) -> list[Any]:
    return values


class FilteredGroup(ro.Pipeline):
    """expand -> filter (keeps only child 0) -> ocr -> reduce -> assemble."""

    def __init__(self) -> None:
        super().__init__()
        self.fan = ro.RayModule(fan)
        self.keep = ro.RayModule(keep_first, batch_size=8)
        self.ocr = ro.RayModule(ident, batch_size=8)
        self.assemble = ro.RayModule(ident)

    def forward(self, docs: Any) -> Any:
        pages = F.expand(self.fan(docs))
        kept = F.filter(pages, self.keep(pages))
        return self.assemble(F.reduce(self.ocr(kept)))


def test_group_failure_that_completes_its_source_before_the_barrier_loop_ends() -> None:
    """Found by test_kernel_invariance: a GroupFailure on the last open sibling finished the
    source (reduce suppressed at once, siblings already Dropped by a filter), the source's
    Items were released, and the barrier loop then saw the Dropped siblings as pending and
    resolved them again (KeyError on the released source). Fix: loops that resolve several
    Items stop once the source is complete."""
    kernel = Kernel(FilteredGroup().compile())
    driver = Driver(kernel)
    driver.admit(0, 7)
    for grain, gen in driver.dispatch("fan"):
        driver.commit(grain, gen, [0, 1, 2, 3])
    for grain, gen in driver.dispatch("keep"):
        driver.commit(grain, gen, grain[1][-1] == 0)
    [(grain, gen)] = driver.dispatch("ocr")  # only child 0 passed the filter
    driver.group_failure(grain, gen, "bad page")
    kernel.validate()
    assert kernel.finished
    [(index, (item,))] = kernel.pop_completed()
    assert index == 0 and item.outcome is Outcome.SUPPRESSED


def test_an_identical_commit_again_after_its_source_completed_is_a_no_op() -> None:
    """Found by test_kernel_machine: once a source completes, the facts that sealed its
    Grains are released, so an identical re-applied GrainCommitted / GrainFailed was taken
    for a conflicting one and rejected. Fix: it is then looked up in the log."""
    kernel = Kernel(FilteredGroup().compile())
    driver = Driver(kernel)
    driver.admit(0, 7)
    [(fan, gen)] = driver.dispatch("fan")
    driver.write(GrainFailed(fan[0], fan[1], gen, "crash"))
    assert kernel.finished  # the source is complete: its sealing facts were released
    for fact in list(driver.log):
        if isinstance(fact, GrainFailed):
            assert kernel.apply(fact) == []
    assert kernel.log == driver.log
    other = GrainCommitted(fan[0], fan[1], gen, "present", ([0],))
    with pytest.raises(InvalidTransition, match="commit gate"):
        kernel.apply(other)
