"""Counted nouns for the messages users read: ``1 run``, ``2 runs``, ``3 children``."""

from __future__ import annotations


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``count`` and ``noun``, in the plural (``nouns``, else ``noun + "s"``) unless 1.

    >>> plural(1, "document"), plural(0, "page"), plural(2, "child", "children")
    ('1 document', '0 pages', '2 children')
    """
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def format_age(seconds: float) -> str:
    """``42s``, ``7m``, ``3h``, ``2d``: how long ago, to the largest whole unit."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


__all__ = ["format_age", "plural"]
