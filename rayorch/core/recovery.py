"""What a pool actor does when the user code raises: the recovery policies.

A Python exception from a UDF is a *record* problem, handled inside the living actor
(docs/ARCHITECTURE.md, "Exceptions vs crashes"): the actor and the state its UDF built
stay; only a crash, a hang past ``timeout_s`` or an explicit :class:`ActorFailure`
replaces the actor. The policies keep upstream RayOrch's names:

* ``isolate_tail`` (the default): the batch is split into one-record batches at once;
  a record that raises alone is run again alone until it has had ``max_attempts``
  runs, then it is ``Failed`` with its cause. Its batch-mates succeed alone.
* ``retry_batch(max_retries=n)``: the whole batch is run again, in place, up to ``n``
  times; if it still raises it is isolated (each record once, alone).
* ``retry_tail(max_retries=n)``: the same retries, deferred behind the batch's
  isolation: the batch is isolated first, then only the records that raised (the
  tail) are retried, together, up to ``n`` times, then alone once.
* ``abort()``: no retry: the batch is isolated once so that only the records that
  raise alone are Failed (rayorch never aborts a run for one record).

Innocent batch-mates are never Failed for another record's exception, whatever the
policy and also with ``max_attempts=1``: every policy ends with an isolation pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from rayorch.core.errors import RayorchError


class RecoveryMode(StrEnum):
    ISOLATE_TAIL = "isolate_tail"
    RETRY_BATCH = "retry_batch"
    RETRY_TAIL = "retry_tail"
    ABORT = "abort"


@dataclass(frozen=True, slots=True)
class RecoveryPolicy:
    """How a pool actor recovers from an exception raised by its UDF.

    ``max_retries`` is ``None`` for ``isolate_tail`` (it follows the module's
    ``max_attempts``). ``infra_retries`` (upstream's retries after a crash) is kept so
    upstream programs run; when a module sets no ``max_attempts`` it becomes
    ``max_attempts = infra_retries + 1``.
    """

    mode: RecoveryMode = RecoveryMode.ISOLATE_TAIL
    max_retries: int | None = None
    infra_retries: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", RecoveryMode(self.mode))
        if self.max_retries is not None and (
            not isinstance(self.max_retries, int) or self.max_retries < 0
        ):
            raise RecoveryError(f"max_retries={self.max_retries!r}: give an int >= 0")
        if self.infra_retries is not None and (
            not isinstance(self.infra_retries, int) or self.infra_retries < 0
        ):
            raise RecoveryError(f"infra_retries={self.infra_retries!r}: give an int >= 0")

    @classmethod
    def isolate_tail(cls, *, infra_retries: int | None = None) -> RecoveryPolicy:
        """Split a failing batch into one-record batches (rayorch's default)."""
        return cls(RecoveryMode.ISOLATE_TAIL, None, infra_retries)

    @classmethod
    def retry_batch(cls, *, max_retries: int = 1,
                    infra_retries: int | None = None) -> RecoveryPolicy:
        """Run a failing batch again in place, up to ``max_retries`` times, then isolate."""
        return cls(RecoveryMode.RETRY_BATCH, max_retries, infra_retries)

    @classmethod
    def retry_tail(cls, *, max_retries: int = 1,
                   infra_retries: int | None = None) -> RecoveryPolicy:
        """Isolate first, then retry the records that raised, up to ``max_retries`` times."""
        return cls(RecoveryMode.RETRY_TAIL, max_retries, infra_retries)

    @classmethod
    def abort(cls, *, infra_retries: int | None = None) -> RecoveryPolicy:
        """No retry; only records that raise alone are Failed (the run goes on)."""
        return cls(RecoveryMode.ABORT, 0, infra_retries)

    def describe(self) -> str:
        if self.max_retries is None or self.mode is RecoveryMode.ABORT:
            return self.mode.value
        return f"{self.mode.value}(max_retries={self.max_retries})"


class RecoveryError(RayorchError, ValueError):
    """A recovery policy was given values it cannot take."""


def as_policy(value: object) -> RecoveryPolicy:
    """A :class:`RecoveryPolicy` from a policy, its name, or an upstream RecoveryPolicy."""
    if isinstance(value, RecoveryPolicy):
        return value
    if isinstance(value, str):
        try:
            mode = RecoveryMode(value)
        except ValueError:
            raise RecoveryError(
                f"unknown recovery {value!r}; use one of "
                f"{', '.join(m.value for m in RecoveryMode)}"
            ) from None
        return RecoveryPolicy(mode, None if mode is RecoveryMode.ISOLATE_TAIL else
                              (0 if mode is RecoveryMode.ABORT else 1))
    # upstream's RecoveryPolicy(udf_mode=UdfRecoveryMode.X, max_udf_retries=n, infra_retries=k)
    mode_obj = getattr(value, "udf_mode", None)
    name = getattr(mode_obj, "name", None)
    if isinstance(name, str):
        mode = RecoveryMode(name.lower())
        retries = getattr(value, "max_udf_retries", None)
        infra = getattr(value, "infra_retries", None)
        if mode is RecoveryMode.ISOLATE_TAIL:
            retries = None
        return RecoveryPolicy(mode, retries, infra)
    raise RecoveryError(
        f"recovery={value!r:.60} is not a recovery policy; use ro.RecoveryPolicy.retry_batch(), "
        "retry_tail(), isolate_tail(), abort(), or one of those names"
    )


DEFAULT_RECOVERY = RecoveryPolicy()

__all__ = ["DEFAULT_RECOVERY", "RecoveryError", "RecoveryMode", "RecoveryPolicy", "as_policy"]
