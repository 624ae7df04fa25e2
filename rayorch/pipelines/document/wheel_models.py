"""Model files that ship inside installed wheels, found by path (nothing is downloaded).

Shared by the layout model (:mod:`rayorch.pipelines.document.layout`) and the table
structure model (:mod:`rayorch.pipelines.document.table_structure`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from rayorch import RayorchError


class LayoutModelError(RayorchError):
    """A layout, OCR or table model cannot be found or loaded; the message says what to do."""


def wheel_file(package: str, relative: str, extra: str = "layout") -> Path:
    """A model file shipped inside an installed wheel (found by path, never downloaded)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise LayoutModelError(f"{package} is not installed: pip install 'rayorch[{extra}]'")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise LayoutModelError(f"{package}'s wheel has no {relative}: reinstall "
                               f"'rayorch[{extra}]' (the pinned version ships it)")
    return path


__all__ = ["LayoutModelError", "wheel_file"]
