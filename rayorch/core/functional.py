"""Structural primitives, used as ``F.expand`` etc. inside ``forward``.

Each is defined, with its whole meaning, in its module of :mod:`rayorch.core.primitives`;
this module re-exports the functions that registry lists.
"""

from __future__ import annotations

from rayorch.core.primitives import *  # noqa: F403
from rayorch.core.primitives import __all__ as __all__
