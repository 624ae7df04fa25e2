"""Structural primitives, used as ``F.expand`` etc. inside ``forward``."""

from __future__ import annotations

from typing import Any

from rayorch.core.tracer import Port, active_trace


def expand(port: Any) -> Port:
    """Each Item (a sequence) becomes the ordered children of its Entity in a new child Domain."""
    return active_trace("F.expand").add_expand(port)[0]


def expand_aligned(*ports: Any) -> tuple[Port, ...]:
    """Several outputs of one Call, expanded together into *one* child Domain.

    For each parent the lists must have the same length; child ``j`` sees element ``j``
    of each (one Port per expanded output). Lists of different lengths, or a value that
    is not a list, fail that parent's Expansion (its reduces give Suppressed).
    """
    return tuple(active_trace("F.expand_aligned").add_expand(*ports))


def reduce(port: Any, *, members: Any = None) -> Port:
    """Children -> parent: the list of child values in ordinal order.

    Without ``members`` the Dropped children are left out. With ``members=m`` (a Port
    of the same child Domain) the list holds the value of every child whose ``m`` Item
    is Present; a child whose ``m`` is Dropped is left out; a Failed/Suppressed ``m``,
    or a member whose value is not Present, makes the parent's Item Suppressed.
    """
    return active_trace("F.reduce").add_reduce(port, members)


def reduce_aligned(*ports: Any, members: Any = None) -> tuple[Port, ...]:
    """Reduce several Ports of one child Domain over one member set (default: the first).

    The lists have the same length and order for every parent: ``F.reduce(p,
    members=m)`` for each ``p``.
    """
    trace = active_trace("F.reduce_aligned")
    if not ports:
        return ()
    member_port = ports[0] if members is None else members
    return tuple(trace.add_reduce(p, member_port) for p in ports)


def filter(port: Any, mask: Any) -> Port:
    """Same Domain; where the boolean ``mask`` Item is False the Item becomes Dropped."""
    return active_trace("F.filter").add_filter(port, mask)


def broadcast(port: Any, like: Any) -> Port:
    """An ancestor's value made available to every descendant Entity in ``like``'s Domain.

    Within one Domain it is the Port itself (as upstream RayOrch).
    """
    return active_trace("F.broadcast").add_broadcast(port, like)


__all__ = ["broadcast", "expand", "expand_aligned", "filter", "reduce", "reduce_aligned"]
