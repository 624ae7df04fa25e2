"""A new run taking a file sink's directory over: what a job's ``--resume`` does to its sink.

A job's ``--resume`` (:mod:`rayorch.pipelines.job_output`) is a new run, so the earlier
run's failed sources run again: :func:`prune_parts` keeps the records the job accepts,
:func:`take_over` makes the new run the directory's owner with those parts listed as
``kept`` (delivered by an earlier run: ``rayorch audit`` of the new run counts them), and
:func:`remove_sink` clears it for ``--overwrite``. Formats and names are
:mod:`rayorch.runtime.sinks`'.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from rayorch.runtime.sinks import (
    LEFTOVER_RE,
    SINK_MANIFEST,
    PartName,
    SinkRecord,
    fsync_dir,
    load_manifest,
    manifest_bytes,
    publish,
    read_part,
    sink_parts,
    write_part_file,
)


def prune_parts(out_dir: str | Path, keep: Callable[[SinkRecord], bool]) -> list[SinkRecord]:
    """Keep only the records ``keep`` accepts; the kept records (never a source twice).

    A part keeping all its records stays as it is; one keeping some is published again
    with just those (byte for byte) and removed; one keeping none is removed. The
    earlier run's temp and claim files go too.
    """
    directory = Path(out_dir)
    meta, names = sink_parts(directory)
    for name in os.listdir(directory):
        if LEFTOVER_RE.match(name):
            (directory / name).unlink(missing_ok=True)
    kept: list[SinkRecord] = []
    seen: set[int] = set()
    for name in names:
        records = [rec for rec, _ in read_part(directory / name)]
        mine = [rec for rec in records if rec.index not in seen and keep(rec)]
        seen.update(rec.index for rec in mine)
        kept.extend(mine)
        if len(mine) == len(records):
            continue
        part = PartName.parse(name)
        if mine and part is not None:
            write_part_file(directory, meta["format"],
                            PartName.new(part.shard, mine, meta["format"]), mine)
        (directory / name).unlink()
    fsync_dir(directory)
    return kept


def take_over(out_dir: str | Path, run_id: str, beside: Sequence[str] = ()) -> None:
    """Make ``run_id`` the owner of ``out_dir``'s sink (if another run has it): its parts
    become ``kept``, the earlier owners ``earlier``; ``beside`` adds names that may stand
    beside the parts. Nothing to do in a directory without a sink."""
    directory = Path(out_dir)
    meta = load_manifest(directory)
    if meta is None or meta["run"] == run_id:
        return
    names = sorted(n for n in os.listdir(directory) if PartName.parse(n) is not None)
    meta = {**meta, "run": run_id, "kept": names,
            "earlier": [meta["run"], *meta.get("earlier", ())],
            "beside": sorted({*meta.get("beside", ()), *beside})}
    publish(directory, SINK_MANIFEST, manifest_bytes(meta), replace=True)


def remove_sink(out_dir: str | Path) -> None:
    """Remove the manifest, part, temp and claim files of ``out_dir``; other files stay."""
    directory = Path(out_dir)
    for name in os.listdir(directory):
        if name == SINK_MANIFEST or PartName.parse(name) or LEFTOVER_RE.match(name):
            (directory / name).unlink(missing_ok=True)


__all__ = ["prune_parts", "remove_sink", "take_over"]
