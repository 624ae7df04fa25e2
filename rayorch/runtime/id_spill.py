"""Records by source id in a local temporary SQLite file, read back in id order.

What a run writes when it ends is O(sources): the rows file in id order, ``_index.parquet``,
the row of each source that failed (its name and manifest columns, kept since its
delivery). Held in dicts, a run over a million sources held ~2 GB in the driver; spilled
here, the driver holds SQLite's page cache (a few MB) whatever the run's size, and the
sort is SQLite's (an integer primary key: the table is a B-tree in id order).

>>> with IdSpill() as rows:
...     rows.add(7, b"seven"), rows.add(2, b"two"), rows.add(7, b"again")
...     [index for index, _ in rows.items()], rows.get(7)
(True, True, False)
([2, 7], b'seven')

The file is SQLite's private temporary database (in ``$SQLITE_TMPDIR``, ``$TMPDIR`` or
``/var/tmp``), unlinked as soon as it is opened: nothing outlives the connection, not even
after a kill (a run that dies rebuilds what it needs from the part files).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any, Self

import orjson

FETCH = 2048
"""Rows read back per SQLite fetch."""


class _Scratch:
    """One private temporary SQLite database (see the module doc), one thread at a time."""

    def __init__(self, table: str) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect("", check_same_thread=False, isolation_level=None)
        # Scratch data: no journal, no fsync (a crash loses nothing the parts do not hold).
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute(table)
        self._db.execute("BEGIN")
        self._count = 0

    def _insert(self, sql: str, values: tuple[Any, ...]) -> bool:
        with self._lock:
            added = self._db.execute(sql, values).rowcount == 1
            self._count += added
            return added

    def _one(self, sql: str, values: tuple[Any, ...]) -> Any:
        with self._lock:
            return self._db.execute(sql, values).fetchone()

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class IdSpill(_Scratch):
    """``id -> bytes``, at most one body per id, on local disk; see the module doc."""

    def __init__(self) -> None:
        super().__init__("CREATE TABLE spill (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")

    def add(self, index: int, body: bytes) -> bool:
        """Keep ``body`` for ``index``; False (and nothing kept) when ``index`` has one."""
        return self._insert("INSERT OR IGNORE INTO spill VALUES (?, ?)", (index, body))

    def get(self, index: int) -> bytes | None:
        found = self._one("SELECT body FROM spill WHERE id = ?", (index,))
        return None if found is None else bytes(found[0])

    def has(self, index: int) -> bool:
        return self._one("SELECT 1 FROM spill WHERE id = ?", (index,)) is not None

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


class SpilledRows(Mapping[int, dict[str, Any]]):
    """JSON rows by id on an :class:`IdSpill`: a read-only mapping whose rows are parsed as
    they are read (an earlier run's rows that ``--resume`` keeps: a million of them)."""

    def __init__(self) -> None:
        self._spill = IdSpill()

    def add(self, index: int, row: dict[str, Any]) -> bool:
        return self._spill.add(index, orjson.dumps(row))

    def __getitem__(self, index: int) -> dict[str, Any]:
        body = self._spill.get(index)
        if body is None:
            raise KeyError(index)
        return orjson.loads(body)  # type: ignore[no-any-return]

    def __contains__(self, index: object) -> bool:
        return isinstance(index, int) and self._spill.has(index)

    def __iter__(self) -> Iterator[int]:
        return (index for index, _ in self._spill.items())

    def __len__(self) -> int:
        return len(self._spill)

    def items(self) -> Iterator[tuple[int, dict[str, Any]]]:  # type: ignore[override]
        """``(id, row)`` in id order."""
        return ((index, orjson.loads(body)) for index, body in self._spill.items())

    def close(self) -> None:
        self._spill.close()


class NameSet(_Scratch):
    """A set of names on local disk (the files an earlier run's kept rows name)."""

    def __init__(self) -> None:
        super().__init__("CREATE TABLE names (name TEXT PRIMARY KEY) WITHOUT ROWID")

    def add(self, name: str) -> bool:
        return self._insert("INSERT OR IGNORE INTO names VALUES (?)", (name,))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._one(
            "SELECT 1 FROM names WHERE name = ?", (name,)) is not None


__all__ = ["IdSpill", "NameSet", "SpilledRows"]
