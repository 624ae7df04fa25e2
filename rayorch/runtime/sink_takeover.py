"""A new run taking a file sink's directory over: what a job's ``--resume`` does to its sink.

A job's ``--resume`` (:mod:`rayorch.pipelines.job.output`) is a new run, so the earlier
run's failed sources run again: :func:`prune_parts` keeps the records the job accepts,
:func:`take_over` makes the new run the directory's owner with those parts listed as
``kept`` (delivered by an earlier run: ``rayorch audit`` of the new run counts them), and
:func:`remove_sink` clears it for ``--overwrite``. Formats and names are
:mod:`rayorch.runtime.sinks`' (read and written through :mod:`rayorch.runtime.sink_layout`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from rayorch.runtime.formats import RowSchema, part_format
from rayorch.runtime.id_spill import IdSpill
from rayorch.runtime.sink_layout import (
    CLAIM_PREFIX,
    HIDDEN_PREFIX,
    LEFTOVER_RE,
    SINK_MANIFEST,
    list_names,
    load_manifest,
    manifest_bytes,
    publish,
    read_part,
    sink_parts,
    write_part_file,
)
from rayorch.storage import Storage, StorageError, open_storage
from rayorch.store.records.sink import PartName, SinkError, SinkRecord


def _leftovers(storage: Storage) -> list[str]:
    return [n for n in list_names(storage, HIDDEN_PREFIX)
            if LEFTOVER_RE.match(n) or n.startswith(CLAIM_PREFIX)]


def prune_parts(out_dir: str | Path, keep: Callable[[SinkRecord], bool],
                kept: Callable[[SinkRecord], None], schema: RowSchema | None = None) -> int:
    """Keep only the records ``keep`` accepts, each handed to ``kept`` (never a source
    twice); how many.

    A part keeping all its records stays as it is; one keeping some is published again
    with just those (byte for byte) and removed; one keeping none is removed. The
    earlier run's temp files, claim markers and discarded parts go too. ``schema``: the
    declared columns of the sink's values (a job's rows), for a typed format. One part's
    records are held at a time, and the ids seen in a local spill.
    """
    storage, meta, names = sink_parts(out_dir)
    count = 0
    try:
        with IdSpill() as seen:
            for name in names:
                records = [rec for rec, _ in read_part(storage, name)]
                mine = [rec for rec in records if keep(rec) and seen.add(rec.index, b"")]
                for rec in mine:
                    kept(rec)
                count += len(mine)
                if len(mine) == len(records):
                    continue
                part = PartName.parse(name)
                if mine and part is not None:
                    fmt = meta["format"]
                    write_part_file(storage, fmt,
                                    PartName.new(part.shard, mine, part_format(fmt).suffix),
                                    mine, schema)
                storage.delete(name)
        live = set(names)
        for name in _leftovers(storage):  # a discarded part goes with its marker
            claimed = name[len(CLAIM_PREFIX):]
            if name.startswith(CLAIM_PREFIX) and claimed not in live \
                    and PartName.parse(claimed) is not None:
                storage.delete(claimed)
            storage.delete(name)
    except StorageError as exc:
        raise SinkError(f"cannot prune {storage.url}: {exc}") from None
    return count


def take_over(out_dir: str | Path, run_id: str, beside: Sequence[str] = ()) -> None:
    """Make ``run_id`` the owner of ``out_dir``'s sink (if another run has it): its parts
    become ``kept``, the earlier owners ``earlier``; ``beside`` adds names that may stand
    beside the parts. Nothing to do in a place without a sink. The manifest is replaced
    in one atomic write."""
    storage = open_storage(out_dir)
    meta = load_manifest(storage)
    if meta is None or meta["run"] == run_id:
        return
    _, _, names = sink_parts(storage)
    meta = {**meta, "run": run_id, "kept": names,
            "earlier": [meta["run"], *meta.get("earlier", ())],
            "beside": sorted({*meta.get("beside", ()), *beside})}
    publish(storage, SINK_MANIFEST, manifest_bytes(meta), replace=True)


def remove_sink(out_dir: str | Path) -> None:
    """Remove the manifest, part, temp and claim files of ``out_dir``; other files stay."""
    storage = open_storage(out_dir)
    try:
        for name in [*list_names(storage, "part-"), *_leftovers(storage)]:
            if PartName.parse(name) or LEFTOVER_RE.match(name) or name.startswith(CLAIM_PREFIX):
                storage.delete(name)
        storage.delete(SINK_MANIFEST)
    except StorageError as exc:
        raise SinkError(f"cannot remove the sink at {storage.url}: {exc}") from None


__all__ = ["prune_parts", "remove_sink", "take_over"]
