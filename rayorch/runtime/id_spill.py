"""Records by source id in a local temporary SQLite file, read back in id order.

What a run writes when it ends is O(sources): the rows file in id order, ``_index.parquet``,
the row of each source that failed (its name and manifest columns, kept since its
delivery). Held in dicts, a run over a million sources held ~2 GB in the driver; spilled
here, the driver holds SQLite's page cache (a few MB) whatever the run's size, and the
sort is SQLite's (an integer primary key: the table is a B-tree in id order).

>>> with IdSpill("rows") as rows:
...     rows.add(7, b"seven"), rows.add(2, b"two"), rows.add(7, b"again")
...     [index for index, _ in rows.items()], rows.get(7)
(True, True, False)
([2, 7], b'seven')

The file lives in the system's temporary directory (``$TMPDIR``) and is removed on
:meth:`close`; nothing in it outlives the process that made it (a run that dies rebuilds
what it needs from the part files).
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

FETCH = 2048
"""Rows read back per SQLite fetch."""


class IdSpill:
    """``id -> bytes``, at most one body per id, on local disk; see the module doc."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._dir = Path(tempfile.mkdtemp(prefix=f"rayorch-{what}-"))
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self._dir / "spill.sqlite", check_same_thread=False,
                                   isolation_level=None)
        # Scratch data: no journal, no fsync (a crash loses nothing the parts do not hold).
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("CREATE TABLE spill (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        self._db.execute("BEGIN")
        self._count = 0

    def add(self, index: int, body: bytes) -> bool:
        """Keep ``body`` for ``index``; False (and nothing kept) when ``index`` has one."""
        with self._lock:
            cursor = self._db.execute("INSERT OR IGNORE INTO spill VALUES (?, ?)",
                                      (index, body))
            added = cursor.rowcount == 1
            self._count += added
            return added

    def get(self, index: int) -> bytes | None:
        with self._lock:
            found = self._db.execute("SELECT body FROM spill WHERE id = ?",
                                     (index,)).fetchone()
        return None if found is None else bytes(found[0])

    def __len__(self) -> int:
        return self._count

    def items(self) -> Iterator[tuple[int, bytes]]:
        """Every ``(id, body)`` in id order, a fetch at a time."""
        with self._lock:
            cursor = self._db.execute("SELECT id, body FROM spill ORDER BY id")
        while True:
            with self._lock:
                batch = cursor.fetchmany(FETCH)
            if not batch:
                return
            for index, body in batch:
                yield int(index), bytes(body)

    def close(self) -> None:
        with self._lock:
            self._db.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> IdSpill:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


__all__ = ["IdSpill"]
