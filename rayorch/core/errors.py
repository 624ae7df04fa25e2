"""The one error root of rayorch and the errors raised by the pure core.

Every error a user can see derives from :class:`RayorchError`. Errors that cross
Ray process boundaries must stay picklable: keep constructor arguments equal to
``args`` (plain ``Exception`` behaviour) or define ``__reduce__``.
"""

from __future__ import annotations


class RayorchError(Exception):
    """Root of every error raised by rayorch."""


class CompileError(RayorchError):
    """A pipeline program is invalid; raised before anything runs.

    The message names the file and line of ``forward`` and says how to fix it.
    """


class TraceError(CompileError):
    """A symbolic Port was used as a concrete value (``bool``, ``iter``, ``len``)."""


class KernelError(RayorchError):
    """The lineage kernel was asked to do something its rules forbid."""


class InvalidTransition(KernelError):
    """A fact does not fit the current state; carries the object's story."""

    def __init__(self, message: str, story: tuple[object, ...] = ()) -> None:
        super().__init__(message, story)
        self.message = message
        self.story = story

    def __str__(self) -> str:
        if not self.story:
            return self.message
        lines = "\n".join(f"  {fact!r}" for fact in self.story)
        return f"{self.message}\nstory:\n{lines}"


class NoProgressError(KernelError):
    """Nothing can progress although the run is not finished (a would-be hang)."""


class InvalidPathError(RayorchError, ValueError):
    """Text that should name an Entity path (``"12"``, ``"12.3"``) does not."""


class PlanLookupError(RayorchError, KeyError):
    """A Domain, module or Call id that the plan does not have."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "not in the plan"


class StoreError(RayorchError):
    """The lineage store failed; subclasses say why in plain words."""


class MissingExtraError(RayorchError):
    """A feature needs an optional dependency that is not installed; says which extra."""

    def __init__(self, feature: str, package: str, extra: str) -> None:
        super().__init__(feature, package, extra)
        self.feature, self.package, self.extra = feature, package, extra

    def __str__(self) -> str:
        return (f"{self.feature} needs {self.package}, which is not installed: "
                f"pip install 'rayorch[{self.extra}]'")
