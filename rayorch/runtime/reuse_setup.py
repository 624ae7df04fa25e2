"""What a driver needs to reuse an earlier run: find it, index it, read its payloads.

``Pipeline.run(..., reuse=RUN | "latest")`` and ``rayorch run ... --reuse RUN`` call
:func:`open_reuse`; the :class:`~rayorch.core.reuse.Reuse` it returns goes to every shard's
machine. Without ``reuse`` the run still records reuse keys, so a later run can reuse it.
A source's part of its keys is the identity its listing gave (``SourceAdmitted.identity``):
the driver reads no input to key it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from rayorch.core.plan import Plan
from rayorch.core.reuse import Reuse, ReuseError, ReuseIndex
from rayorch.store.base import LineageStore, RunInfo
from rayorch.store.errors import RunNotFoundError
from rayorch.store.progress import run_complete
from rayorch.store.retention import payload_store

LATEST = "latest"


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
    result = Reuse(plan, index, no_reuse=no_reuse, load=load)
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


__all__ = ["LATEST", "latest_run", "open_reuse", "reuse_config", "reuse_of_run"]
