"""What a driver needs to reuse an earlier run: find it, index it, read its payloads.

``Pipeline.run(..., reuse=RUN | "latest")`` and ``rayorch run ... --reuse RUN`` call
:func:`open_reuse`; the :class:`~rayorch.core.reuse.Reuse` it returns goes to every shard's
machine. Without ``reuse`` the run still records reuse keys, so a later run can reuse it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rayorch.core.fingerprint import file_digest
from rayorch.core.plan import Plan
from rayorch.core.reuse import Reuse, ReuseError, ReuseIndex
from rayorch.storage import Location, StorageError, open_storage, parse_location
from rayorch.store.base import LineageStore, RunInfo
from rayorch.store.errors import RunNotFoundError
from rayorch.store.progress import run_complete
from rayorch.store.retention import payload_store

LATEST = "latest"


class FileDigests:
    """The digest of the file a source value names (a str or path of a regular file).

    Cached per ``(path, size, mtime)`` (an object: ``(URL, size, version or ETag)``): a
    driver asks once when the Grain becomes ready and once when it is dispatched. An
    object's digest is of its bytes, so the same input in another bucket reuses too.
    """

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int, str], str] = {}

    def __call__(self, value: Any) -> str | None:
        if not isinstance(value, str | os.PathLike) or not value:
            return None
        try:
            location = parse_location(os.fspath(value))
        except (StorageError, TypeError):
            return None
        if not location.is_local:
            return self._object(location)
        try:
            path = Path(value)
            stat = path.stat()
        except (OSError, ValueError):
            return None
        if not path.is_file():
            return None
        return self._cached((str(path), stat.st_size, str(stat.st_mtime_ns)), path.read_bytes)

    def _object(self, location: Location) -> str | None:
        """An object's digest, from its bytes; cached per (URL, size, version or ETag)."""
        try:
            storage = open_storage(location.parent())
            info = storage.head(location.name())
        except StorageError:
            return None
        if info is None:
            return None
        return self._cached((location.url, info.size, str(info.version)),
                            lambda: storage.read(location.name()))

    def _cached(self, key: tuple[str, int, str], read: Callable[[], bytes]) -> str | None:
        digest = self._cache.get(key)
        if digest is None:
            try:
                digest = file_digest(read())
            except (OSError, StorageError):
                return None
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[key] = digest
        return digest


def latest_run(store: LineageStore, plan_name: str, *, exclude: str | None = None) -> str | None:
    """The newest complete run of a plan named ``plan_name`` (None: there is none)."""
    for info in reversed(store.list_runs()):
        if info.run_id == exclude or info.plan.get("name") != plan_name:
            continue
        if run_complete(store, info.run_id):
            return info.run_id
    return None


def open_reuse(store: LineageStore, plan: Plan, reuse: str | None,
               no_reuse: Sequence[str] = (), *, run_id: str | None = None,
               quiet: bool = False) -> Reuse:
    """The :class:`Reuse` of a run: an index of ``reuse`` (a run id or ``"latest"``), if any."""
    index: ReuseIndex | None = None
    if reuse:
        origin = latest_run(store, plan.name, exclude=run_id) if reuse == LATEST else reuse
        if origin is None:
            if not quiet:
                print(f"rayorch: no complete run of {plan.name!r} to reuse: everything runs",
                      file=sys.stderr)
        else:
            if origin == run_id:
                raise ReuseError(f"run {origin!r} cannot reuse itself: name an earlier run")
            try:
                view = store.read_view(origin)
            except RunNotFoundError as exc:
                raise ReuseError(f"--reuse {origin}: no such run in the store ({exc})") from exc
            index = ReuseIndex.from_view(view)
    load = getattr(store, "load_payload", None) if payload_store(store) else None
    result = Reuse(plan, index, no_reuse=no_reuse, source_digest=FileDigests(), load=load)
    if index is not None and not quiet:
        print(f"rayorch: reusing run {index.run_id} ({len(index)} Grains it sealed)",
              file=sys.stderr)
        for note in result.notes():
            print(f"rayorch: {note}", file=sys.stderr)
    return result


def reuse_config(reuse: Reuse, no_reuse: Sequence[str]) -> dict[str, Any]:
    """What a run records of its reuse (``RunInfo.config``), so that its other drivers
    (``rayorch driver``/``resume``) reuse the same run."""
    if reuse.index is None:
        return {}
    return {"reuse": reuse.index.run_id, "no_reuse": list(no_reuse)}


def reuse_of_run(store: LineageStore, plan: Plan, info: RunInfo) -> Reuse:
    """The :class:`Reuse` a joining driver of the run ``info`` gets (what its creator used)."""
    origin = info.config.get("reuse")
    no_reuse = info.config.get("no_reuse") or ()
    return open_reuse(store, plan, origin if isinstance(origin, str) else None,
                      [str(c) for c in no_reuse], run_id=info.run_id, quiet=True)


__all__ = ["LATEST", "FileDigests", "latest_run", "open_reuse", "reuse_config", "reuse_of_run"]
