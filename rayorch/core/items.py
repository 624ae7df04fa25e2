"""How the kernel represents a terminal Item, and the rules every primitive shares.

A Present value is stored as is; any other outcome as an :class:`Absent`. These are
the pieces the kernel's layers (:mod:`rayorch.core.propagation`) and the primitives'
propagation (:mod:`rayorch.core.primitives`) both use; this module imports no other
part of the kernel.
"""

from __future__ import annotations

from typing import Any

from rayorch.core.outcome import Item, Outcome
from rayorch.core.vocabulary import EXPANSION_DROPPED, EXPANSION_FAILED, EXPANSION_SUCCEEDED

DROPPED_X = -1  # expansion states besides a child count
FAILED_X = -2


class Absent:
    """A terminal Item that is not Present (Dropped, Failed or Suppressed)."""

    __slots__ = ("cause", "origin", "outcome")

    def __init__(self, outcome: Outcome, cause: str | None, origin: str = "") -> None:
        self.outcome = outcome
        self.cause = cause
        self.origin = origin  # the Grain whose failure this is (Failed only)

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is Absent and other.outcome is self.outcome and other.cause == self.cause
        )

    def __hash__(self) -> int:
        return hash((self.outcome, self.cause))

    def __repr__(self) -> str:
        return f"Absent({self.outcome.value}, {self.cause!r})"


PENDING: Any = object()
"""What ``items.get(key, PENDING)`` gives for an Item that is not terminal yet."""
DROPPED_ITEM = Absent(Outcome.DROPPED, None)


def suppressed_by(cause: Absent) -> Absent:
    """The Suppressed Item that a Failed or Suppressed input causes downstream."""
    if cause.outcome is Outcome.SUPPRESSED:
        return cause
    return Absent(Outcome.SUPPRESSED, f"{cause.origin or 'an input'} failed: {cause.cause}")


def as_item(value: Any) -> Item:
    """The public :class:`Item` of an internal value."""
    if type(value) is Absent:
        return Item(value.outcome, None, value.cause)
    return Item(Outcome.PRESENT, value)


def expansion_outcome(state: int) -> tuple[str, int]:
    if state == DROPPED_X:
        return EXPANSION_DROPPED, 0
    if state == FAILED_X:
        return EXPANSION_FAILED, 0
    return EXPANSION_SUCCEEDED, state


__all__ = ["DROPPED_ITEM", "DROPPED_X", "FAILED_X", "PENDING", "Absent", "as_item",
           "expansion_outcome", "suppressed_by"]
