"""The commit rule (docs/ARCHITECTURE.md, "Semantics" 4): one pure function for every store.

A report for Grain ``G`` is accepted iff ``phase(G) = in_flight``, its generation
is ``generation(G)`` and no suppression barrier covers ``G``. The Redis store's
Lua function ``commit_batch`` implements the same rule and the same verdict codes;
a differential test keeps them equal.
"""

from __future__ import annotations

from enum import IntEnum


class GrainPhase(IntEnum):
    """Phases of a Grain: ``waiting -> ready -> in_flight -> sealed``."""

    WAITING = 0
    READY = 1
    IN_FLIGHT = 2
    SEALED = 3


class CommitVerdict(IntEnum):
    """Why a report was accepted or rejected (same codes as the Lua function)."""

    ACCEPTED = 1
    NOT_DISPATCHED = -1  # unknown Grain, or waiting/ready: nothing in flight
    STALE = -2  # in flight, but with another generation
    SEALED = -3  # already committed, failed or suppressed (a duplicate or late report)
    BARRED = -4  # a GroupFailure barrier covers the Grain

    @property
    def accepted(self) -> bool:
        return self is CommitVerdict.ACCEPTED


def commit_verdict(
    phase: GrainPhase | None, generation: int, report_generation: int, barred: bool
) -> CommitVerdict:
    """Decide one report. Checks run in the same order as in the Lua function."""
    if phase is GrainPhase.SEALED:
        return CommitVerdict.SEALED
    if phase is not GrainPhase.IN_FLIGHT:
        return CommitVerdict.NOT_DISPATCHED
    if barred:
        return CommitVerdict.BARRED
    if report_generation != generation:
        return CommitVerdict.STALE
    return CommitVerdict.ACCEPTED
