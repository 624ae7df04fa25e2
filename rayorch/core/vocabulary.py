"""The one table of rayorch's words: Grain phases, driver fact kinds, commit verdicts, outcomes.

Everything in Python refers to these names; the Lua scripts of the Redis store declare
the same numbers in ``rayorch/store/lua/includes/vocabulary.lua``, which
``tests/unit/test_vocabulary.py`` checks against this table line by line.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class GrainPhase(IntEnum):
    """Phases of a Grain: ``waiting -> ready -> in_flight -> sealed``.

    ``BARRED`` is the kernel's own: in flight when a GroupFailure barrier covered it (its
    report will be rejected). The store's Grain table keeps such a Grain ``IN_FLIGHT``.
    A store's Grain entry reads ``"<phase>:<generation>[:token]"`` (one digit per phase).
    """

    WAITING = 0
    READY = 1
    IN_FLIGHT = 2
    SEALED = 3
    BARRED = 4

    @property
    def label(self) -> str:
        """The phase's name in reports and JSON: ``waiting``, ``ready``, ``in_flight``, ..."""
        return self.name.lower()


# The kernel's hot tables hold the members' plain int values.
READY, IN_FLIGHT = int(GrainPhase.READY), int(GrainPhase.IN_FLIGHT)
SEALED, BARRED = int(GrainPhase.SEALED), int(GrainPhase.BARRED)

_PHASE_TEXT = {None: "waiting or decided without running", READY: "ready",
               IN_FLIGHT: "in flight", SEALED: "sealed", BARRED: "barred (in flight, suppressed)"}


def phase_text(phase: int | None) -> str:
    """A phase in words, for error messages (``None``: no entry in the kernel's table)."""
    return _PHASE_TEXT.get(phase, f"phase {phase}")


class FactKind(IntEnum):
    """How a driver fact changes the store's Grain table (the fenced append checks it)."""

    OTHER = 0  # changes no Grain entry
    DISPATCHED = 1
    RETRIED = 2
    FAILED = 3
    REUSED = 4  # GrainReused: sealed with an earlier run's outputs, never dispatched


# The Grain phase a driver fact of each kind leaves behind.
PHASE_AFTER: dict[FactKind, GrainPhase] = {
    FactKind.DISPATCHED: GrainPhase.IN_FLIGHT,
    FactKind.RETRIED: GrainPhase.READY,
    FactKind.FAILED: GrainPhase.SEALED,
    FactKind.REUSED: GrainPhase.SEALED,
}


class CommitVerdict(IntEnum):
    """Why a report was accepted or rejected by the commit gate."""

    ACCEPTED = 1
    NOT_DISPATCHED = -1  # unknown Grain, or waiting/ready: nothing in flight
    STALE = -2  # in flight, but with another generation
    SEALED = -3  # already committed, failed or suppressed (a duplicate or late report)
    BARRED = -4  # a GroupFailure barrier covers the Grain

    @property
    def accepted(self) -> bool:
        return self is CommitVerdict.ACCEPTED


# Outcomes a worker may report for one Grain (``GrainCommitted.outcome``).
REPORT_PRESENT = "present"
REPORT_RECORD_FAILURE = "record_failure"
REPORT_GROUP_FAILURE = "group_failure"
REPORT_OUTCOMES = frozenset({REPORT_PRESENT, REPORT_RECORD_FAILURE, REPORT_GROUP_FAILURE})


class Outcome(StrEnum):
    """The closed set of terminal outcomes of an Item (also ``OutputEmitted.outcome``)."""

    PRESENT = "present"
    DROPPED = "dropped"
    FAILED = "failed"
    SUPPRESSED = "suppressed"


# The cause of a retry that a driver's take-over of a shard made (its in-flight Grains).
FAILOVER_CAUSE = "driver failover"

# Terminal outcomes of an Expansion (``ExpansionClosed.outcome``).
EXPANSION_SUCCEEDED = "succeeded"
EXPANSION_DROPPED = "dropped"
EXPANSION_FAILED = "failed"


__all__ = ["BARRED", "EXPANSION_DROPPED", "EXPANSION_FAILED", "EXPANSION_SUCCEEDED",
           "FAILOVER_CAUSE", "IN_FLIGHT", "PHASE_AFTER", "READY", "REPORT_GROUP_FAILURE",
           "REPORT_OUTCOMES", "REPORT_PRESENT", "REPORT_RECORD_FAILURE", "SEALED",
           "CommitVerdict", "FactKind", "GrainPhase", "Outcome", "phase_text"]
