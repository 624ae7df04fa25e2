"""Holes the randomized tests miss (issue 11, item 6), pinned as deterministic tests.

Each test names the bug it catches; both the kernel (through the in-process executor or
a hand driver) and the reference interpreter must hold the rule.
"""

from __future__ import annotations

from typing import Any

import numpy
import pytest
from test_kernel_support import Driver

import rayorch as ro
from rayorch import F
from rayorch.core.outcome import Outcome
from rayorch.core.reference import evaluate
from rayorch.core.state import Kernel
from rayorch.runtime.in_process import ExecutorOptions, execute

# -- F.filter keeps an Item exactly when bool(mask) is True ----------------------------
# Caught bug: a filter that drops only on `mask is False` (0, "", [] or numpy.False_ pass).
MASKS: list[Any] = [False, 0, 0.0, "", [], {}, numpy.False_, numpy.int64(0),
                    True, 1, -2, 0.5, "no", [0], {"k": 0}, numpy.True_, numpy.int64(3)]


def mask_of(indexes: list[int]) -> list[Any]:
    return [MASKS[i] for i in indexes]


def same(values: list[Any]) -> list[Any]:
    return values


class Masked(ro.Pipeline):
    """index -> (index, MASKS[index]) -> filter -> one more Call."""

    def __init__(self) -> None:
        super().__init__()
        self.mask = ro.RayModule(mask_of, batch_size=4)
        self.after = ro.RayModule(same, batch_size=4)

    def forward(self, index: Any) -> Any:
        return self.after(F.filter(index, self.mask(index)))


class MaskedChildren(ro.Pipeline):
    """The same filter on the children of one expand."""

    def __init__(self) -> None:
        super().__init__()
        self.fan = ro.RayModule(lambda counts: [list(range(c)) for c in counts])
        self.mask = ro.RayModule(mask_of, batch_size=5)
        self.after = ro.RayModule(same, batch_size=5)

    def forward(self, count: Any) -> Any:
        kids = F.expand(self.fan(count))
        return F.reduce(self.after(F.filter(kids, self.mask(kids))))


def test_filter_keeps_an_item_exactly_when_its_mask_is_truthy() -> None:
    plan = Masked().compile()
    rows = [(i,) for i in range(len(MASKS))]
    want = {i: bool(MASKS[i]) for i in range(len(MASKS))}
    kernel = execute(plan, rows, ExecutorOptions(seed=1, random_order=True)).outputs
    reference = evaluate(plan, rows).outputs
    for name, outputs in (("kernel", kernel), ("reference", reference)):
        got = {i: items[0].outcome is Outcome.PRESENT for i, items in outputs.items()}
        assert got == want, name
        assert all(items[0].outcome is Outcome.DROPPED
                   for i, items in outputs.items() if not want[i]), name


def test_filter_on_children_keeps_exactly_the_truthy_ones_in_order() -> None:
    plan = MaskedChildren().compile()
    want = [i for i, m in enumerate(MASKS) if m]
    for name, outputs in (("kernel", execute(plan, [(len(MASKS),)]).outputs),
                          ("reference", evaluate(plan, [(len(MASKS),)]).outputs)):
        [item] = outputs[0]
        assert item.present and item.value == want, name


# -- a GroupFailure in the root Domain acts on its own Grain only ----------------------
# Caught bug: a root GroupFailure installs a (call, ()) barrier that suppresses the same
# Call for every LATER source (the sources already past that Call are unharmed).
def render_or_fail(docs: list[int]) -> list[Any]:
    return [ro.GroupFailure(f"bad document {d}") if d < 0 else list(range(d)) for d in docs]


def ocr(pages: list[int]) -> list[int]:
    return [p * 10 for p in pages]


def assemble(texts: list[list[int]]) -> list[int]:
    return [sum(t) for t in texts]


class Documents(ro.Pipeline):
    def __init__(self) -> None:
        super().__init__()
        self.render = ro.RayModule(render_or_fail, batch_size=1)
        self.ocr = ro.RayModule(ocr, batch_size=4)
        self.assemble = ro.RayModule(assemble)

    def forward(self, docs: Any) -> Any:
        return self.assemble(F.reduce(self.ocr(F.expand(self.render(docs)))))


@pytest.mark.parametrize("active", [1, 2, None])
def test_a_root_group_failure_does_not_touch_later_sources(active: int | None) -> None:
    plan = Documents().compile()
    rows = [(-1,), (2,), (3,), (-1,), (1,)]
    options = ExecutorOptions(max_active_sources=active, seed=3)
    for name, outputs in (("kernel", execute(plan, rows, options).outputs),
                          ("reference", evaluate(plan, rows).outputs)):
        got = {i: (items[0].outcome, items[0].value if items[0].present else None)
               for i, items in outputs.items()}
        assert got == {0: (Outcome.SUPPRESSED, None), 1: (Outcome.PRESENT, 10),
                       2: (Outcome.PRESENT, 30), 3: (Outcome.SUPPRESSED, None),
                       4: (Outcome.PRESENT, 0)}, name


def test_a_source_admitted_after_a_root_group_failure_is_rendered() -> None:
    driver = Driver(Kernel(Documents().compile()))
    driver.admit(0, -1)
    [(grain, gen)] = driver.dispatch("render")
    driver.group_failure(grain, gen, "bad document")
    driver.admit(1, 2)  # after the failure: same Call, another source
    assert driver.dispatch("render") == [(("render", (1,)), 0)]
    driver.commit(("render", (1,)), 0, [0, 1])
    assert driver.kernel.inputs_of(("ocr", (1, 1))) == (1,)
    driver.kernel.validate()
