"""The web view (``rayorch ui``): runs, live progress, failures by cause, lineage per document.

A read-only Starlette app (:mod:`rayorch.ui.app`) over one lineage store, rendered on the
server from :mod:`rayorch.inspect` (the same data as ``rayorch status``/``show``/``audit``),
charts drawn as SVG, one static script that re-fetches live pages. Extra: ``rayorch[ui]``.
"""

from rayorch.ui.server import UiServer, serve_run

__all__ = ["UiServer", "serve_run"]
