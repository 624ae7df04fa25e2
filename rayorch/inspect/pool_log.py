"""A run's pool log: each size change of a pool that sizes itself, as stored and as
``rayorch status`` shows it. Written by :mod:`rayorch.runtime.pool_sizer`; the store's bytes
are data (decoded defensively, printed sanitised)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from rayorch.core.sanitize import sanitize

POOL_RECORD_VERSION = 1


@dataclass(frozen=True, slots=True)
class PoolChange:
    """One pool's size changed: when (seconds into the driver's run, and the clock's time),
    from what, to what, why, by which driver."""

    at_s: float
    module: str
    before: int
    after: int
    reason: str
    ts: float = 0.0
    driver: str = ""

    def line(self) -> str:
        return (f"pool {self.module!r}: {self.before} -> {self.after} actors at "
                f"{self.at_s:.1f}s: {self.reason}")

    def encode(self) -> bytes:
        """The store's record (msgpack with a version, never pickle)."""
        blob: bytes = msgpack.packb([POOL_RECORD_VERSION, self.at_s, self.ts, self.module,
                                     self.before, self.after, self.reason, self.driver])
        return blob

    @classmethod
    def decode(cls, raw: bytes) -> PoolChange:
        """A record of :meth:`encode`; :class:`ValueError` for anything else."""
        try:
            fields = msgpack.unpackb(raw)
            version, at_s, ts, module, before, after, reason, driver = fields
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise ValueError(f"not a pool size record: {exc}") from None
        if version != POOL_RECORD_VERSION:
            raise ValueError(f"pool size record version {version!r}")
        return cls(float(at_s), str(module), int(before), int(after), str(reason), float(ts),
                   str(driver))


def pool_changes(records: Sequence[bytes]) -> list[PoolChange]:
    """The readable records of a run's pool log, in order (others are left out)."""
    out = []
    for raw in records:
        with contextlib.suppress(ValueError):
            out.append(PoolChange.decode(raw))
    return out


def pool_lines(records: Sequence[bytes]) -> list[str]:
    """``rayorch status``'s lines for a run's pool log: each pool's sizes over time (seconds
    into its driver's run) and the latest reason, sanitised (the store's text is data)."""
    by_pool: dict[str, list[PoolChange]] = {}
    changes = pool_changes(records)
    for change in changes:
        by_pool.setdefault(change.module, []).append(change)
    out = []
    for module, mine in sorted(by_pool.items()):
        steps = " -> ".join(f"{c.after} ({c.at_s:.0f}s)" for c in mine)
        out.append(sanitize(f"  pool {module}: {mine[0].before} -> {steps}; last: "
                                 f"{mine[-1].reason}"))
    if len(changes) < len(records):
        out.append(f"  ({len(records) - len(changes)} pool records could not be read)")
    return out


__all__ = ["POOL_RECORD_VERSION", "PoolChange", "pool_changes", "pool_lines"]
