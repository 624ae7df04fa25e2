"""How far a run is, as its store records it: the sources it declares and whether it is
complete. The one rule of completeness is :func:`rayorch.core.run_view.is_complete`;
``rayorch status`` (:mod:`rayorch.inspect.status`) adds the counts around it.
"""

from __future__ import annotations

import contextlib

from rayorch.core.run_view import is_complete
from rayorch.store.base import LineageStore, RunInfo
from rayorch.store.records.manifest import RunManifest


def declared_sources(store: LineageStore, info: RunInfo) -> int | None:
    """How many sources the run declares (its manifest, else its config); None: unknown."""
    blob = store.load_manifest(info.run_id)
    if blob is not None:
        with contextlib.suppress(Exception):  # a damaged manifest is the audit's finding
            return len(RunManifest.decode(blob).sources)
    if isinstance(info.config.get("sources"), int):
        return int(info.config["sources"])
    return None


def run_complete(store: LineageStore, run_id: str) -> bool:
    """Every shard of the run is done or completed and every declared source delivered."""
    info = store.run_info(run_id)
    view = store.read_view(run_id)
    done = store.done_shards(run_id)
    emitted = sum(sum(sv.outputs.values()) for sv in view.shards.values())
    return is_complete([k in done or bool(sv.completed) for k, sv in view.shards.items()],
                       emitted, declared_sources(store, info))


__all__ = ["declared_sources", "run_complete"]
