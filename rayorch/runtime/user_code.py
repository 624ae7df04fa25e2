"""Shipping user code (pipeline and module classes) to Ray workers that cannot import it."""

from __future__ import annotations

import sys
from typing import Any


def ship_user_code(objects: list[Any]) -> None:
    """Let Ray workers unpickle user classes defined outside installed packages."""
    import ray.cloudpickle as cloudpickle

    for obj in objects:
        module = sys.modules.get(getattr(obj, "__module__", "") or "")
        if module is None or module.__name__ in ("__main__", "builtins"):
            continue
        if module.__name__.split(".")[0] == "rayorch":
            continue
        path = getattr(module, "__file__", None) or ""
        if "site-packages" in path or "dist-packages" in path:
            continue
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]


__all__ = ["ship_user_code"]
