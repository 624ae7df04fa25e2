"""The commit rule (docs/ARCHITECTURE.md, "Semantics" 4): one pure function for every store.

A report for Grain ``G`` is accepted iff ``phase(G) = in_flight``, its generation
is ``generation(G)`` and no suppression barrier covers ``G``. The Redis store's
Lua function ``commit_batch`` implements the same rule with the same verdict codes
(:mod:`rayorch.core.vocabulary`); a differential test keeps them equal.
"""

from __future__ import annotations

from rayorch.core.vocabulary import CommitVerdict, GrainPhase


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


__all__ = ["CommitVerdict", "GrainPhase", "commit_verdict"]
