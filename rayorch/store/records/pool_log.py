"""The pool log as stored: one record per size change of a pool that sizes itself (written by
:mod:`rayorch.runtime.pool_sizer`, shown by :mod:`rayorch.inspect.pool_log`). The store's
bytes are data: decoded defensively, a record that is not one is refused saying why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

POOL_RECORD_VERSION = 1
RECYCLED = "recycled actor "
"""How the reason of a recycling starts (actors/pool.py ``ActorPool._over_limit``)."""


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

    @property
    def recycle(self) -> bool:
        """An actor replaced past its ``max_rss``/``max_batches`` (the size stays; the
        pool's reason says ``recycled actor N: why``)."""
        return self.before == self.after and self.reason.startswith(RECYCLED)

    def line(self) -> str:
        if self.recycle:
            return f"pool {self.module!r}: {self.reason} at {self.at_s:.1f}s"
        return (f"pool {self.module!r}: {self.before} -> {self.after} actors at "
                f"{self.at_s:.1f}s: {self.reason}")

    def encode(self) -> bytes:
        """The store's record (msgpack with a version, never pickle)."""
        blob: bytes = msgpack.packb([POOL_RECORD_VERSION, self.at_s, self.ts, self.module,
                                     self.before, self.after, self.reason, self.driver])
        return blob

    @classmethod
    def decode(cls, raw: bytes) -> PoolChange:
        """A record of :meth:`encode`; :class:`ValueError` for anything else (saying why,
        without quoting the record: it is the store's data)."""
        try:
            fields = msgpack.unpackb(raw)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise ValueError(f"not msgpack ({type(exc).__name__})") from None
        if not isinstance(fields, list):
            raise ValueError(f"a {type(fields).__name__}, not a list of 8 fields")
        if len(fields) != 8:
            raise ValueError(f"{len(fields)} fields, not 8")
        version, at_s, ts, module, before, after, reason, driver = fields
        if version != POOL_RECORD_VERSION:
            raise ValueError("an unknown record version")
        if not all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)
                   and t >= 0 for t in (at_s, ts)):
            raise ValueError("its times are not finite numbers of seconds >= 0")
        if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**31
                   for n in (before, after)):
            raise ValueError("its sizes are not whole numbers >= 0")
        if not all(isinstance(s, str) for s in (module, reason, driver)) or not module:
            raise ValueError("its pool, reason or driver is not text")
        return cls(float(at_s), module, before, after, reason, float(ts), driver)


def pool_changes(records: Sequence[bytes]) -> list[PoolChange]:
    """The readable records of a run's pool log, in order (others are left out)."""
    return [change for change in map(decoded_pool_change, records)
            if isinstance(change, PoolChange)]


def decoded_pool_change(raw: bytes) -> PoolChange | str:
    """The record, or why it is not one."""
    try:
        return PoolChange.decode(raw)
    except ValueError as exc:
        return str(exc)


__all__ = ["POOL_RECORD_VERSION", "RECYCLED", "PoolChange", "decoded_pool_change",
           "pool_changes"]
