"""``replicas=N``, ``replicas=(min, max)`` and ``replicas="auto"`` on a module: what each
means, how a wrong one is refused, and where it shows (explain, the stored description)."""

from __future__ import annotations

from typing import Any

import pytest

import rayorch as ro
from rayorch.core.compile_errors import ModuleDefinitionError
from rayorch.core.plan import Plan
from rayorch.core.pool_sizing import AUTO_MAX_REPLICAS


def ident(xs: list[Any]) -> list[Any]:
    return xs


class Two(ro.Pipeline):
    def __init__(self, first: Any, second: Any) -> None:
        super().__init__()
        self.first = ro.RayModule(ident, replicas=first)
        self.second = ro.RayModule(ident, replicas=second, num_gpus=1)

    def forward(self, xs: Any) -> Any:
        return self.second(self.first(xs))


@pytest.mark.parametrize(("given", "start", "most", "text"), [
    (3, 3, None, "3"),
    ((1, 4), 1, 4, "(1, 4)"),
    ([2, 6], 2, 6, "(2, 6)"),
    ((2, 2), 2, None, "2"),  # a range of one size is a fixed size
    ("auto", 1, AUTO_MAX_REPLICAS, "auto"),
])
def test_replicas_forms(given: Any, start: int, most: int | None, text: str) -> None:
    options = ro.RayModule(ident, replicas=given).options
    assert (options.replicas, options.max_replicas, options.replicas_text) == (start, most, text)
    assert options.sizes_itself == (most is not None)


@pytest.mark.parametrize("given", [0, -1, True, 2.0, "many", (3, 1), (0, 2), (1, 2, 3), (1,)])
def test_a_wrong_replicas_is_refused_with_the_forms_it_may_take(given: Any) -> None:
    with pytest.raises(ModuleDefinitionError, match="invalid option replicas") as caught:
        ro.RayModule(ident, replicas=given)
    assert "(min, max)" in str(caught.value) and '"auto"' in str(caught.value)


def test_the_upstream_builder_takes_a_range_too() -> None:
    module = ro.RayModule(ident).ray_options(replicas=(2, 5))
    assert (module.options.replicas, module.options.max_replicas) == (2, 5)


def test_explain_shows_each_pool_and_the_description_keeps_the_range() -> None:
    plan = Two((1, 4), "auto").compile()
    text = plan.explain()
    assert "pools:" in text
    assert "first" in text and "replicas=(1, 4)" in text
    assert "replicas=auto" in text and "num_gpus=1" in text
    back = Plan.from_description(plan.describe())
    assert [m.options.replicas_text for m in back.modules] == ["(1, 4)", "auto"]


def test_a_fixed_size_keeps_the_plan_fingerprint_it_had() -> None:
    """Only a range adds to the stored description, so older runs still resume."""
    fixed = Two(2, 3).compile()
    assert all("max_replicas" not in m["options"] for m in fixed.describe()["modules"])
    assert Two(2, 3).compile().fingerprint() == fixed.fingerprint()
    assert Two((2, 4), 3).compile().fingerprint() != fixed.fingerprint()


@pytest.mark.parametrize(("text", "value"), [("4", 4), ("1-8", (1, 8)), ("auto", "auto")])
def test_the_job_commands_take_replicas_as_a_number_a_range_or_auto(text: str, value: Any
                                                                     ) -> None:
    from rayorch.pipelines.job.run_command import replicas_type
    from rayorch.pipelines.pdf import PdfPipeline

    assert replicas_type(text) == value
    plan = PdfPipeline("text", replicas=value, render_replicas=value).compile()
    ocr = next(m for m in plan.modules if m.name == "ocr")
    assert ocr.options.replicas_text == {"4": "4", "1-8": "(1, 8)", "auto": "auto"}[text]


@pytest.mark.parametrize("text", ["0", "3-1", "-2", "many", "1-"])
def test_a_wrong_replicas_option_names_the_forms(text: str) -> None:
    import argparse

    from rayorch.pipelines.job.run_command import replicas_type

    with pytest.raises(argparse.ArgumentTypeError, match="range min-max"):
        replicas_type(text)
