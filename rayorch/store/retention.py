"""Retention: delete a run, collect orphaned payload files, expire old runs (``rayorch gc``).

A run's keys and payload files go together (``LineageStore.delete_run``). A payload file
is *orphaned* when no committed fact of its run refers to it: an actor died between
writing it and committing, or the commit was rejected. Only files older than
``min_orphan_age_s`` are collected, so a file written for a commit that is still in
flight is never taken (docs/ARCHITECTURE.md, "Trust model, hostile input and retention").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.core.facts import GrainCommitted, GrainReused
from rayorch.core.names import valid_run_id
from rayorch.store.base import LineageStore
from rayorch.store.payload import PayloadRoots, PayloadStore, object_of
from rayorch.store.reuse_audit import refs_held_elsewhere

MIN_ORPHAN_AGE_S = 3600.0
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


class RetentionError(RayorchError):
    """A retention request cannot be carried out."""


def parse_duration(text: str) -> float:
    """``"90s"``, ``"15m"``, ``"2h"``, ``"7d"``, ``"1w"`` or plain seconds -> seconds."""
    raw = text.strip().lower()
    unit = _UNITS.get(raw[-1:])
    number = raw[:-1] if unit is not None else raw
    try:
        value = float(number) * (unit or 1.0)
    except ValueError:
        raise RetentionError(f"{text!r} is not a duration; use e.g. 90s, 15m, 2h or 7d") from None
    if value < 0 or value != value:
        raise RetentionError(f"{text!r} is not a duration; use e.g. 90s, 15m, 2h or 7d")
    return value


def payload_store(store: LineageStore) -> PayloadStore | None:
    """The store's payload directory (None for a store that keeps none, e.g. memory://)."""
    payloads = getattr(store, "payloads", None)
    return payloads if isinstance(payloads, PayloadStore) else None


def payload_bytes_written(store: LineageStore) -> int:
    """Bytes this client of ``store`` wrote to payload segments, through every root (0 for
    a store that keeps none)."""
    roots = getattr(store, "roots", None)
    return roots.written() if isinstance(roots, PayloadRoots) else 0


def referenced_payloads(store: LineageStore, run_id: str) -> set[str]:
    """The payload references of the run's committed and reused facts, and those of its
    files that later runs reuse (:func:`~rayorch.store.reuse_audit.refs_held_elsewhere`)."""
    refs: set[str] = set()
    for shard in range(store.run_info(run_id).shards):
        cursor = 0
        while batch := store.read(run_id, shard, cursor, payloads=False):
            for stored in batch:
                fact = stored.fact
                if isinstance(fact, GrainCommitted | GrainReused) and fact.payload_ref:
                    refs.add(fact.payload_ref)
            cursor = batch[-1].seq
    return refs | refs_held_elsewhere(store, run_id)


@dataclass
class GcPlan:
    """What ``rayorch gc`` removes (or, with ``--dry-run``, would remove)."""

    runs: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)  # payload objects, relative to payload_dir
    unknown_dirs: list[str] = field(default_factory=list)  # not runs of this store: untouched
    kept_running: list[str] = field(default_factory=list)
    payload_dir: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"delete_runs": self.runs, "orphaned_payloads": self.orphans,
                "kept_running": self.kept_running, "unknown_payload_dirs": self.unknown_dirs,
                "payload_dir": self.payload_dir}


def is_running(store: LineageStore, run_id: str) -> bool:
    """A driver of the run is registered or holds a shard lease."""
    if store.live_drivers(run_id):
        return True
    shards = store.run_info(run_id).shards
    return any(store.lease_holder(run_id, k) is not None for k in range(shards))


def plan_gc(store: LineageStore, *, older_than_s: float | None = None,
            min_orphan_age_s: float = MIN_ORPHAN_AGE_S, now: float | None = None) -> GcPlan:
    """Runs created more than ``older_than_s`` ago (not running), and orphaned payloads."""
    now = time.time() if now is None else now
    plan = GcPlan()
    infos = store.list_runs()
    for info in infos:
        if older_than_s is None or now - info.created_ts < older_than_s:
            continue
        if is_running(store, info.run_id):
            plan.kept_running.append(info.run_id)
        else:
            plan.runs.append(info.run_id)
    payloads = payload_store(store)
    if payloads is None:
        return plan
    plan.payload_dir = str(payloads.root)
    known = {info.run_id for info in infos}
    for info in infos:
        if info.run_id in plan.runs:
            continue  # deleting the run removes all its files
        on_disk = payloads.ref_times(info.run_id)
        if not on_disk:
            continue
        named = {object_of(ref) for ref in referenced_payloads(store, info.run_id)}
        for ref in sorted(set(on_disk) - named):
            mtime = on_disk[ref]
            if mtime is not None and now - mtime >= min_orphan_age_s:
                plan.orphans.append(ref)
    for name, holds_payloads in sorted(payloads.run_dirs().items()):
        # Only this store's folders: a shared root also holds other stores' runs.
        if name not in known and holds_payloads and payloads.owner_of(name) == payloads.owner:
            plan.unknown_dirs.append(name)
    return plan


def apply_gc(store: LineageStore, plan: GcPlan) -> None:
    """Carry ``plan`` out: delete its runs (keys and files) and its orphaned payload files."""
    for run_id in plan.runs:
        delete_run(store, run_id)
    payloads = payload_store(store)
    if payloads is not None:
        for ref in plan.orphans:
            payloads.delete(ref)


def delete_run(store: LineageStore, run_id: str) -> None:
    """Remove a run's keys and its payload files (a no-op for a run that does not exist)."""
    if not valid_run_id(run_id):
        from rayorch.store.errors import InvalidRunIdError

        raise InvalidRunIdError(run_id)
    payloads = payload_store(store)
    held = refs_held_elsewhere(store, run_id) if payloads is not None else set()
    store.delete_run(run_id)
    if payloads is not None:
        # also files of a run whose keys were already gone; never files later runs reuse
        payloads.delete_run(run_id, keep=held)


__all__ = ["GcPlan", "MIN_ORPHAN_AGE_S", "RetentionError", "apply_gc", "delete_run", "is_running",
           "parse_duration", "payload_store", "plan_gc", "referenced_payloads"]
