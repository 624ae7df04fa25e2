"""A job's data-quality options and what it writes of its drops: ``dropped.jsonl``.

``--dedup exact|near``, ``--near-threshold``, ``--lang en,de``, ``--quality default|off``
and ``--dedup-against RUN|latest`` become the pipeline's stage options
(:func:`rayorch.pipelines.quality.stage_modules`). When the run ends, the job reads why
each dropped document was dropped from the run's facts (:mod:`rayorch.inspect.drops`)
and writes one line per dropped document to ``dropped.jsonl`` in ``--output``, in id
order: ``{"id", "source", "stage", "reason", "kept_id", "kept", ...}`` (``kept``: the
copy a duplicate was dropped for; the rest of the verdict: a score, a language, a rule's
bound), so nothing leaves the run unaccounted for.
"""

from __future__ import annotations

import argparse
import contextlib
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.inspect.drops import Drop, read_drops
from rayorch.pipelines.job.output import DROPPED_NAME, UsageError


def add_quality_options(group: Any) -> None:
    """The data-quality options of a document job."""
    from rayorch.pipelines.quality import DEDUP_MODES, QUALITY_MODES

    group.add_argument("--dedup", choices=DEDUP_MODES, default=None,
                       help="drop duplicates: exact (same input bytes, or the same text once "
                       "normalised) or near (also MinHash near-copies); the first copy "
                       "claimed in the store's dedup index is kept")
    group.add_argument("--near-threshold", type=float, default=None, metavar="J",
                       help="--dedup near: the 5-gram Jaccard similarity from which a "
                       "document is a near-copy (default 0.8)")
    group.add_argument("--lang", default=None, metavar="CODES",
                       help="keep only documents in these languages (ISO 639-1 codes, "
                       "comma-separated, e.g. en,de)")
    group.add_argument("--quality", choices=QUALITY_MODES, default="off",
                       help="heuristic quality filters (Gopher/C4/FineWeb rules): default or "
                       "off (the default)")
    group.add_argument("--dedup-against", default=None, metavar="RUN",
                       help="--dedup: also drop documents an earlier job's run in --store "
                       "delivered (a run id, or 'latest')")


def quality_options(args: argparse.Namespace) -> dict[str, Any]:
    """The pipeline options the data-quality flags give (checked: a ``UsageError``)."""
    from rayorch.pipelines.quality.dedup import DEFAULT_THRESHOLD

    languages = [c.strip() for c in (args.lang or "").split(",") if c.strip()]
    if args.lang is not None and not languages:
        raise UsageError("--lang names no language: give ISO 639-1 codes, e.g. en,de")
    if args.near_threshold is not None and args.dedup != "near":
        raise UsageError("--near-threshold goes with --dedup near")
    if args.dedup_against is not None and args.dedup is None:
        raise UsageError("--dedup-against RUN goes with --dedup exact|near")
    threshold = DEFAULT_THRESHOLD if args.near_threshold is None else args.near_threshold
    return {"dedup": args.dedup, "languages": languages, "quality": args.quality,
            "near_threshold": threshold}


def check_dedup_store(args: argparse.Namespace) -> None:
    """A dedup index that must outlive this process needs a shared store."""
    from rayorch.store.registry import is_shared_store

    if getattr(args, "dedup", None) is None or is_shared_store(args.store):
        return
    if args.resume:
        raise UsageError("--resume with --dedup needs the earlier run's dedup index: pass "
                         "--store redis://... (a memory:// index ends with its process)")
    if args.dedup_against is not None:
        raise UsageError("--dedup-against needs the store of the earlier run: pass --store "
                         "redis://...")


def dedup_against(args: argparse.Namespace) -> str | None:
    """The dedup scope ``--dedup-against`` names (None: not given), checked before anything
    is touched: a shared store, an earlier run with one, not this output's own run."""
    if args.dedup_against is None:
        return None
    check_dedup_store(args)
    against = against_scope(args.store, args.dedup_against)
    if args.resume:
        try:
            own = output_scope(args.output)
        except (OSError, ValueError, RayorchError):
            own = None
        if own == against:
            raise UsageError(f"--dedup-against {args.dedup_against} is this output's own "
                             "run: --resume continues it")
    return against


def against_scope(store_url: str, run: str) -> str:
    """The dedup scope of an earlier job run (``latest``: the newest run with one), from
    the store's record of where it delivered (its sink) and that output's marker."""
    from rayorch.store import open_store
    from rayorch.store.errors import StoreError

    store = open_store(store_url)
    try:
        runs = store.list_runs()
    finally:
        store.close()
    if run != "latest":
        runs = [info for info in runs if info.run_id == run]
        if not runs:
            raise UsageError(f"--dedup-against {run}: no such run in the store")
    for info in reversed(runs):
        if info.sink is None:
            continue
        try:
            scope = output_scope(info.sink[0])
        except (StoreError, OSError, ValueError):
            continue
        if scope is not None:
            return scope
    raise UsageError(f"--dedup-against {run}: no job run with --dedup in the store")


def output_scope(out_dir: str) -> str | None:
    """The dedup scope a job's output directory records in its marker, if any."""
    import json

    from rayorch.pipelines.job.output import MARKER
    from rayorch.storage import open_storage

    marker = json.loads(open_storage(out_dir).read(MARKER).decode("utf-8"))
    scope = marker.get("dedup_scope") if isinstance(marker, dict) else None
    return scope if isinstance(scope, str) else None


@contextlib.contextmanager
def readable_store(url: str) -> Iterator[tuple[str, Any]]:
    """``(url, store)`` a run can use and the job can still read once the run ended: a
    ``memory://`` store gets a name the job keeps open meanwhile."""
    from rayorch.store import open_store

    if url == "memory://":
        url = f"memory://job-{uuid.uuid4().hex[:12]}"
    store = open_store(url)
    try:
        yield url, store
    finally:
        store.close()


def drop_rows(store: Any, run_id: str, names: Callable[[int], str | None],
              ids_of: Callable[[set[str]], Mapping[str, int]]) -> list[dict[str, Any]]:
    """The ``dropped.jsonl`` rows of run ``run_id``'s drops, in id order; ``names(id)``: a
    source's name, ``ids_of(sources)``: the id of each of these delivered sources (the
    ``kept_id`` of the drops that name them: only those are looked up)."""
    drops = read_drops(store, run_id)
    wanted = {str(kept) for drop in drops.values()
              if (kept := drop.details().get("kept")) is not None}
    ids = ids_of(wanted) if wanted else {}
    return [drop_row(drop, names, ids) for drop in drops.values()]


def drop_row(drop: Drop, names: Callable[[int], str | None], ids: Mapping[str, int]
             ) -> dict[str, Any]:
    row: dict[str, Any] = {"id": drop.index, "source": names(drop.index), "stage": drop.stage,
                           "reason": drop.reason}
    details = drop.details()
    if "kept" in details:
        row["kept_id"] = ids.get(str(details["kept"]))
    return {**row, **details}


__all__ = ["DROPPED_NAME", "add_quality_options", "against_scope", "check_dedup_store",
           "dedup_against",
           "drop_row", "drop_rows", "output_scope", "quality_options", "readable_store"]
