"""``ro.Pipeline``: a traced program that can also run itself on Ray."""

from __future__ import annotations

from typing import Any

from rayorch.core.program import PipelineBase


class Pipeline(PipelineBase):
    """Base class of user pipelines (see :class:`rayorch.core.program.PipelineBase`).

    ``run(*inputs, store="memory://", ordered=True, ...)`` executes the compiled
    plan on Ray and returns an iterator of ``(index, result)`` per source item.
    """

    def run(self, *inputs: Any, ui: bool = False, **options: Any) -> Any:
        """Run on Ray; see :func:`rayorch.driver.run_pipeline` for the options.

        ``ui=True`` also serves the web view of the run's store on 127.0.0.1 while the run
        lasts, and says its address on stderr (``rayorch[ui]``, :mod:`rayorch.ui`); the
        handle's ``ui`` is that :class:`~rayorch.ui.UiServer` (``handle.ui.url``).
        """
        return run(self, *inputs, ui=ui, **options)


def run(pipeline: PipelineBase, *inputs: Any, ui: bool = False, **options: Any) -> Any:
    """``ro.run(pipeline, inputs, ...)``: the same as ``pipeline.run(inputs, ...)``."""
    from rayorch.driver import run_pipeline

    if not ui:
        return run_pipeline(pipeline, inputs, **options)
    from rayorch.ui.server import require_ui_extra, serve_run

    require_ui_extra()  # before anything starts
    handle: Any = run_pipeline(pipeline, inputs, **options)
    handle.ui = serve_run(handle)
    return handle
