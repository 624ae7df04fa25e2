"""A writer's local spool: the records of one lease shard waiting to fill a part of the
target size (``--shard-size``).

Records are appended to a local file as their canonical lines (nothing is visible in the
sink yet); :meth:`ShardSpool.take` cuts the next part: the records that encode to at most
``1.1 x target`` bytes (fewer when the encoding comes out bigger than estimated), leaving
the rest spooled. A spool dies with its writer: its sources were never delivered, so the
shard's next holder (or ``--resume``) delivers them again. Sizes are estimated from the
spooled bytes and the ratio of encoded to spooled bytes of the last encoding.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path

from rayorch.store.records.sink import SinkRecord, record_of_line

SLACK = 1.1
"""A part may exceed its target by this factor (a record is never split)."""
FULL_ENOUGH = 0.9
"""A part this close to its target is cut even if the estimate was high."""


class ShardSpool:
    """Per lease shard, the records spooled under ``directory`` (a new temp dir if None)."""

    def __init__(self, target: int, directory: str | Path | None = None) -> None:
        if target < 1:
            raise ValueError("a shard size is at least one byte")
        self.target = target
        self.dir = Path(directory) if directory is not None else Path(
            tempfile.mkdtemp(prefix="rayorch-spool-"))
        # removed with the spool (or at exit); a killed writer's is in the temp directory
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.dir, ignore_errors=True)
        self._raw: dict[int, int] = {}
        self._count: dict[int, int] = {}
        self.ratio = 1.0
        """Encoded bytes per spooled byte, from the last encoding."""

    def _path(self, shard: int) -> Path:
        return self.dir / f"s{shard:05d}.jsonl"

    def add(self, shard: int, records: Sequence[SinkRecord]) -> None:
        if not records:
            return
        data = b"".join(r.line + b"\n" for r in records)
        with open(self._path(shard), "ab") as f:
            f.write(data)
        self._raw[shard] = self._raw.get(shard, 0) + len(data)
        self._count[shard] = self._count.get(shard, 0) + len(records)

    def pending(self, shard: int) -> int:
        """How many records of ``shard`` are spooled."""
        return self._count.get(shard, 0)

    def full(self, shard: int) -> bool:
        return self._raw.get(shard, 0) * self.ratio >= self.target

    def records(self, shard: int) -> list[SinkRecord]:
        path = self._path(shard)
        if not path.exists():
            return []
        where = f"the spool {path}"
        return [record_of_line(line, where) for line in path.read_bytes().splitlines() if line]

    def take(self, shard: int, encode: Callable[[Sequence[SinkRecord]], bytes], *,
             final: bool) -> tuple[list[SinkRecord], bytes] | None:
        """The next part of ``shard``: its records and bytes, or None when the spool does not
        fill one yet (``final``: whatever is spooled makes the writer's last part)."""
        records = self.records(shard)
        if not records:
            return None
        raw = self._raw.get(shard, 0) or 1
        data = encode(records)
        self.ratio = max(len(data) / raw, 1e-6)
        n = len(records)
        while len(data) > SLACK * self.target and n > 1:
            n = max(1, min(n - 1, int(n * self.target / len(data) * 0.95)))
            data = encode(records[:n])
        if n == len(records) and not final and len(data) < FULL_ENOUGH * self.target:
            return None  # compressed better than estimated: wait for more records
        self._keep(shard, records[n:])
        return records[:n], data

    def _keep(self, shard: int, rest: Sequence[SinkRecord]) -> None:
        path = self._path(shard)
        self._raw.pop(shard, None)
        self._count.pop(shard, None)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(b"".join(r.line + b"\n" for r in rest))
        os.replace(tmp, path)
        if rest:
            self._raw[shard] = path.stat().st_size
            self._count[shard] = len(rest)

    def drop(self, shard: int) -> None:
        """Forget ``shard``'s spooled records (its sources are offered again)."""
        self._raw.pop(shard, None)
        self._count.pop(shard, None)
        self._path(shard).unlink(missing_ok=True)

    def close(self) -> None:
        self._cleanup()


__all__ = ["FULL_ENOUGH", "SLACK", "ShardSpool"]
