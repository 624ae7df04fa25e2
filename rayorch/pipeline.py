"""``ro.Pipeline``: a traced program that can also run itself on Ray."""

from __future__ import annotations

from typing import Any

from rayorch.core.program import PipelineBase


class Pipeline(PipelineBase):
    """Base class of user pipelines (see :class:`rayorch.core.program.PipelineBase`).

    ``run(*inputs, store="memory://", ordered=True, ...)`` executes the compiled
    plan on Ray and returns an iterator of ``(index, result)`` per source item.
    """

    def run(self, *inputs: Any, **options: Any) -> Any:
        """Run on Ray; see :func:`rayorch.driver.run_pipeline` for the options."""
        from rayorch.driver import run_pipeline

        return run_pipeline(self, inputs, **options)


def run(pipeline: PipelineBase, *inputs: Any, **options: Any) -> Any:
    """``ro.run(pipeline, inputs, ...)``: the same as ``pipeline.run(inputs, ...)``."""
    from rayorch.driver import run_pipeline

    return run_pipeline(pipeline, inputs, **options)
