"""What ``rayorch audit`` checks of a file sink: every delivery proven by its part file.

The sink's format and names are :mod:`rayorch.runtime.sinks`; this module only reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from rayorch.core.facts import OutputEmitted
from rayorch.runtime.formats import part_format
from rayorch.runtime.sink_layout import read_part, sink_parts
from rayorch.runtime.sinks import FILELESS_SINKS
from rayorch.storage import StorageError, open_storage
from rayorch.store.records.sink import PartName, SinkError


def check_delivery(out_dir: str | Path | None, emitted: Iterable[OutputEmitted], *,
                   complete: bool, held: Mapping[int, int] | None = None) -> list[str]:
    """Problems with the delivery evidence of file sinks, one line each (none: all proven).

    Every ``OutputEmitted`` naming a part must find that part in ``out_dir`` with the
    source's record and the same digest. A part that no fact names, or holding sources no
    fact records, written when the store had acknowledged more facts of its shard than
    it holds now (``held``: shard -> last seq) is the trace of a rollback. When the run is
    ``complete``, any part that no fact names is a problem too, by its likely cause, unless
    the manifest lists it as ``kept`` (delivered by an earlier run of a job's directory
    that this run resumed).
    """
    emitted = list(emitted)
    by_part: dict[str, dict[int, str]] = {}
    for fact in emitted:
        if fact.sink in FILELESS_SINKS:
            continue
        by_part.setdefault(fact.sink, {})[fact.index] = fact.digest
    if not by_part and (held is None or out_dir is None):
        return []
    if out_dir is None:
        example = next(iter(by_part))
        return [f"{sum(map(len, by_part.values()))} outputs were delivered to file sink parts "
                f"(e.g. {example!r}) but the run records no output directory: pass --out-dir "
                "DIR to check them"]
    try:
        storage = open_storage(out_dir)
        if not by_part and not storage.exists_dir():
            return []  # nothing delivered to files, nothing written
        _, meta, names = sink_parts(storage)
    except (SinkError, StorageError) as exc:
        return [f"the output directory cannot be checked: {exc}"]
    directory = storage.url
    lookup = set(names)
    problems: list[str] = []
    for sink, digests in sorted(by_part.items()):
        fmt, _, name = sink.partition(":")
        part = PartName.parse(name)
        sources = ", ".join(map(str, sorted(digests)[:8])) + (", ..." if len(digests) > 8 else "")
        if part is None or fmt != meta["format"] or \
                part.suffix != part_format(fmt).suffix:
            problems.append(f"sources {sources}: delivered to {sink!r}, which is not a "
                            f"{meta['format']} part of {directory}")
            continue
        if name not in lookup:
            problems.append(f"part {name} is missing from {directory}: sources {sources} were "
                            "delivered to it")
            continue
        try:
            stored = {rec.index: digest for rec, digest in read_part(storage, name)}
        except (SinkError, FileNotFoundError) as exc:
            problems.append(f"part {name} (sources {sources}): {exc}")
            continue
        for index, digest in sorted(digests.items()):
            if index not in stored:
                problems.append(f"source {index}: part {name} holds no record of it")
            elif digest and stored[index] != digest:
                problems.append(f"source {index}: its record in part {name} was altered "
                                f"(sha256 {stored[index][:12]}..., delivered "
                                f"{digest[:12]}...)")
    recorded = {fact.index for fact in emitted}
    referenced = {sink.partition(":")[2] for sink in by_part} | set(meta.get("kept", ()))
    for name in names:
        part = PartName.parse(name)
        assert part is not None  # sink_parts lists parts only
        known = None if held is None else held.get(part.shard)
        rolled_back = known is not None and part.acked > known
        if name in referenced or not (complete or rolled_back):
            continue
        try:
            unrecorded = sorted(rec.index for rec, _ in read_part(storage, name)
                                if rec.index not in recorded)
        except (SinkError, FileNotFoundError) as exc:
            problems.append(f"part {name}: {exc}")
            continue
        if rolled_back:
            problems.append(
                f"part {name} in {directory} was written when the lineage store had "
                f"acknowledged {part.acked} facts of shard {part.shard}; it holds {known}: the "
                "store lost facts it had acknowledged (rolled back: restarted from an AOF cut "
                "short by a crash or from an older snapshot, or a replica promoted)"
                + (f", among them the delivery of sources {_some(unrecorded)}; `rayorch "
                   "resume RUN` records them from this part" if unrecorded else
                   "; its sources were delivered again elsewhere: delete it"))
        elif unrecorded:
            problems.append(
                f"part {name} in {directory} holds sources {_some(unrecorded)} that no fact "
                "records: its driver died before recording them (or the store lost those "
                "facts); `rayorch resume RUN` adopts it (do not delete it)")
        else:
            problems.append(f"part {name} in {directory} is named by no OutputEmitted fact "
                            "(left by a driver that died while deposed): delete it")
    return problems


def _some(indexes: list[int]) -> str:
    return ", ".join(map(str, indexes[:8])) + (", ..." if len(indexes) > 8 else "")


__all__ = ["check_delivery"]
