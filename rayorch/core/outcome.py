"""Terminal outcomes of Items and the failure signals a user function may give.

An Item (the value of one Port for one Entity) ends in exactly one of
``Present(value)``, ``Dropped``, ``Failed(cause)`` or ``Suppressed(cause)``.
A UDF signals a logical failure of one record by returning or raising
:class:`RecordFailure` (only that record) or :class:`GroupFailure` (that record
and its not-yet-committed siblings of the same Call and parent).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rayorch.core.vocabulary import Outcome as Outcome


@dataclass(frozen=True, slots=True)
class Item:
    """The terminal value of one Port for one Entity."""

    outcome: Outcome
    value: Any = None
    cause: str | None = None

    @property
    def present(self) -> bool:
        return self.outcome is Outcome.PRESENT


DROPPED = Item(Outcome.DROPPED)


def present(value: Any) -> Item:
    """An Item holding ``value``."""
    return Item(Outcome.PRESENT, value)


def failed(cause: str) -> Item:
    return Item(Outcome.FAILED, None, cause)


def suppressed(cause: str) -> Item:
    return Item(Outcome.SUPPRESSED, None, cause)


class RecordFailure(Exception):
    """This record failed logically: its outputs become ``Failed``; no retry.

    Return it in the record's output position from a batch UDF, or raise it from
    a per-record UDF. Only this record's parent is affected.
    """

    def __init__(self, cause: str = "record failure") -> None:
        super().__init__(cause)
        self.cause = cause

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.cause == self.cause

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.cause))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.cause!r})"


class GroupFailure(RecordFailure):
    """This record failed and so does its group: siblings of the same Call and parent.

    Ready siblings are suppressed before dispatch, in-flight siblings' reports are
    rejected, committed siblings stay. In the root Domain it acts on its own Grain.
    """


class ActorFailure(Exception):
    """Raised by a UDF to say its actor is broken (a lost GPU context, a corrupt model).

    Unlike any other exception (handled inside the living actor by the module's recovery
    policy), it makes rayorch replace the actor and retry the batch on a fresh one, like
    a crash: with a new generation, up to ``max_attempts``.
    """

    def __init__(self, cause: str = "actor failure") -> None:
        super().__init__(cause)
        self.cause = cause


@dataclass(frozen=True, slots=True)
class FailedResult:
    """What a run yields for a source item whose output is not ``Present``.

    Never silently dropped: ``outcome`` says what happened, ``cause`` why. With several
    outputs, ``port`` names the first output that is not Present and ``outputs`` holds
    every output of the row (a value, or a ``FailedResult`` of its own), so one failed
    output does not hide the others.

    Upstream RayOrch calls it ``OutputIssue`` (``ro.OutputIssue`` is this class).
    """

    index: int
    outcome: Outcome
    cause: str | None
    port: str = ""
    outputs: tuple[Any, ...] | None = None

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        """In words: ``suppressed: shout[2.0] failed: this page is unreadable``."""
        return f"{self.outcome.value}: {self.cause}" if self.cause else self.outcome.value


def source_result(index: int, items: Sequence[Item], names: Sequence[str]) -> Any:
    """A finished source item as the user sees it: the value(s) or a ``FailedResult``."""
    if len(items) == 1:
        item = items[0]
        if item.present:
            return item.value
        return FailedResult(index, item.outcome, item.cause, names[0])
    values = tuple(
        item.value if item.present else FailedResult(index, item.outcome, item.cause, name)
        for name, item in zip(names, items, strict=True)
    )
    for value in values:
        if isinstance(value, FailedResult):
            return FailedResult(index, value.outcome, value.cause, value.port, values)
    return values
