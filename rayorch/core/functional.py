"""Structural primitives, used as ``F.expand`` etc. inside ``forward``."""

from __future__ import annotations

from typing import Any

from rayorch.core.tracer import Port, active_trace


def expand(port: Any) -> Port:
    """Each Item (a sequence) becomes the ordered children of its Entity in a new child Domain."""
    return active_trace("F.expand").add_expand(port)


def reduce(port: Any) -> Port:
    """Children -> parent: the list of child values in ordinal order (Dropped ones left out)."""
    return active_trace("F.reduce").add_reduce(port)


def filter(port: Any, mask: Any) -> Port:
    """Same Domain; where the boolean ``mask`` Item is False the Item becomes Dropped."""
    return active_trace("F.filter").add_filter(port, mask)


def broadcast(port: Any, like: Any) -> Port:
    """An ancestor's value made available to every descendant Entity in ``like``'s Domain."""
    return active_trace("F.broadcast").add_broadcast(port, like)


__all__ = ["broadcast", "expand", "filter", "reduce"]
