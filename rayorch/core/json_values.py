"""Outputs as JSON: the one rule by which file sinks write values and actors check them.

A file sink (rayorch/runtime/sinks.py) writes each output as JSON: tuples and numpy arrays
become lists, numpy scalars numbers, ``bytes`` the tagged form ``{"$bytes": "<base64>"}``.
JSON cannot hold a set, a custom object, an integer beyond 64 bits, a dict with non-str
keys, NaN or infinity. On a durable store any run can be resumed into a file sink, so the
actor checks every output by this same rule before it commits (rayorch/core/udf.py,
``reports_for``): a value JSON cannot hold fails its own record there, and the run goes on.

>>> json_bytes({"a": (1, 2.5)})
b'{"a":[1,2.5]}'
>>> json_problem(float("nan"))
'(type float) holds NaN or infinity, which JSON cannot hold; return None or a string instead'
"""

from __future__ import annotations

import base64
import math
from typing import Any

import orjson

JSON_OPTIONS = (orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_PASSTHROUGH_DATETIME
                | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS)


def _default(obj: Any) -> Any:
    if isinstance(obj, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(obj)).decode("ascii")}
    import numpy as np

    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"Type is not JSON serializable: {type(obj).__module__}."
                    f"{type(obj).__qualname__}")


def _non_finite(value: Any) -> bool:
    """Whether a NaN or infinity hides in ``value`` (orjson would write it as null)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_non_finite(v) for v in value)
    import numpy as np

    if isinstance(value, np.ndarray):
        if value.dtype.kind in "fc":
            return not bool(np.isfinite(value).all())
        return value.dtype.kind == "O" and _non_finite(value.tolist())
    if isinstance(value, np.floating | np.complexfloating):
        return not bool(np.isfinite(value))
    return False


def json_bytes(value: Any) -> bytes:
    """``value`` as the compact JSON a file sink writes; ``ValueError`` (one line, starting
    with the value's type) when JSON cannot hold it."""
    kind = type(value).__name__
    try:
        blob = orjson.dumps(value, default=_default, option=JSON_OPTIONS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise ValueError(
            f"(type {kind}) cannot be written as JSON: {exc}; file sinks take None, bool, "
            "64-bit int, finite float, str, bytes, lists, tuples, dicts with str keys and "
            "numpy arrays") from None
    if b"null" in blob and _non_finite(value):
        raise ValueError(f"(type {kind}) holds NaN or infinity, which JSON cannot hold; "
                         "return None or a string instead")
    return blob


def json_problem(value: Any) -> str | None:
    """Why a file sink cannot write ``value`` (see :func:`json_bytes`), or None."""
    try:
        json_bytes(value)
    except ValueError as exc:
        return str(exc)
    return None


__all__ = ["JSON_OPTIONS", "json_bytes", "json_problem"]
