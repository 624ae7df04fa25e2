"""The compile errors: each names the file and line of ``forward`` and the fix."""

from __future__ import annotations

from rayorch.core.errors import CompileError, TraceError
from rayorch.core.plan import SourceLocation


def _format(problem: str, location: SourceLocation | None, fix: str) -> str:
    where = "in forward" if location is None else f"{location.file}:{location.line}: in forward"
    code = f"\n    {location.code}" if location is not None and location.code else ""
    return f"{where}: {problem}{code}\nfix: {fix}"


class LocatedCompileError(CompileError):
    """A compile error located at one line of ``forward``."""

    def __init__(self, problem: str, location: SourceLocation | None, fix: str) -> None:
        super().__init__(_format(problem, location, fix))
        self.problem = problem
        self.location = location
        self.fix = fix

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.problem, self.location, self.fix))


class SymbolicValueError(LocatedCompileError, TraceError):
    """A Port was used as a concrete value (``if port:``, ``for x in port``, ``len(port)``)."""


class DomainMismatchError(LocatedCompileError):
    """The Port inputs of one Call (or filter) live in different Domains."""


class BroadcastError(LocatedCompileError):
    """``F.broadcast`` from a Domain that is not a strict ancestor of ``like``'s Domain."""


class ReduceError(LocatedCompileError):
    """``F.reduce`` of a Port that is not in a child Domain."""


class ExpandError(LocatedCompileError):
    """``F.expand`` of something that is not the output of a Call."""


class NoOutputError(LocatedCompileError):
    """``forward`` returned no Port."""


class OutputDomainError(LocatedCompileError):
    """An output of ``forward`` is not in the root Domain (one result per source item)."""


class UnusedInputError(LocatedCompileError):
    """An argument of ``forward`` is never used."""


class DuplicateNameError(LocatedCompileError):
    """Two things share one name (a module under two attributes, two outputs of one name)."""


class CycleError(LocatedCompileError):
    """The plan's graph has a cycle."""


class CallArgumentError(LocatedCompileError):
    """A Call got an argument it cannot take (a non-Port positional, no Port at all, ...)."""


class ModuleDefinitionError(LocatedCompileError):
    """A module or pipeline is defined wrongly (bad option, not registered, no forward)."""
