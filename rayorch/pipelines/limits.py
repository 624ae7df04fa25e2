"""The shipped jobs' limits on native memory: the resident size past which an actor of a
stage that loads native libraries (PyMuPDF, ONNX Runtime, PyAV) is recycled (``max_rss``,
docs/topics/ACTORS.md "Actors that recycle themselves"). Model engines (vLLM) are not
recycled by default: reloading one costs minutes."""

from __future__ import annotations

from rayorch.core.errors import RayorchError
from rayorch.core.sizes import parse_byte_size

NATIVE_MAX_RSS = "3GB"
"""Default ``max_rss`` of the render, OCR, layout, recognition, probe and decode actors:
above what a page or a clip needs (a few hundred MB), below what a leak that runs for days
reaches."""
OFF = ("off", "none", "0")


def max_rss_bytes(value: int | str | None) -> int | None:
    """``value`` (bytes, a size like ``"3GB"``, or ``"off"``/``None``: no limit) in bytes;
    a ``RayorchError`` naming the value otherwise."""
    if value is None or (isinstance(value, str) and value.strip().lower() in OFF):
        return None
    try:
        return parse_byte_size(value)
    except ValueError as exc:
        raise RayorchError(f"actor max RSS {str(value)[:40]!r}: {exc}, or 'off'") from None


__all__ = ["NATIVE_MAX_RSS", "max_rss_bytes"]
