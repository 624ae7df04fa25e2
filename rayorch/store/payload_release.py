"""Freeing payload segments once nothing needs them (docs/topics/PAYLOADS.md, "Freeing values").

A value in a segment is needed until its source is delivered: by then every Grain of the
source's tree is sealed in the store (a source's ``OutputEmitted`` is written after its
output, which is the last value its tree computes), so no driver, after any take-over,
dispatches a Grain that reads it. Each shard counts, per segment, the undelivered sources
with a value in it (``track``, its own round trip before the commit that names it, so a
source is never released before its values are counted: a pipeline would not keep that
order when a script must be reloaded or a cluster call rerouted); a fenced append of
``OutputEmitted`` releases its sources, and a segment no source holds is deleted, after the
append is on disk (WAITAOF).

Kept, never counted: what the run's ``keep`` keeps (:func:`~rayorch.store.layout.kept_calls`:
with ``outputs``, the default, the values of the Calls a run delivers, which a resume after a
store rollback may deliver again; with ``all`` every value, a run to be reused whole,
docs/topics/REUSE.md "Reuse"). The memory store frees its values by the same rule
(:mod:`rayorch.store.memory_log`).
A fact whose segment was freed reads as its ``outline``: the fold of the lineage needs
only the structure of the values of delivered sources.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from rayorch.core.errors import StoreError
from rayorch.core.facts import Fact, GrainCommitted, OutputEmitted, pack_value
from rayorch.core.ids import CallId
from rayorch.core.vocabulary import CommitVerdict
from rayorch.store.errors import PayloadError
from rayorch.store.keys import ShardKeys
from rayorch.store.layout import KEEP_MODES as KEEP_MODES
from rayorch.store.layout import RunLayout, kept_calls
from rayorch.store.payload import PayloadStore, deletable_refs, object_of, run_of_ref
from rayorch.store.scripts import RELEASE_PAYLOADS, TRACK_PAYLOADS, LuaScript

Eval = Callable[[LuaScript, Sequence[str], Sequence[Any]], Any]


class SegmentRelease:
    """Counts which segments undelivered sources hold, and deletes those none holds."""

    def __init__(self, payloads_of: Callable[[str], PayloadStore], keep: str, run_eval: Eval,
                 sync_to_disk: Callable[[str], None]) -> None:
        self.payloads_of = payloads_of  # run id -> where its values are (RunInfo.payloads)
        self.keep = keep  # what a run this store opens records (RunInfo.keep)
        self._eval = run_eval
        self._sync = sync_to_disk
        self._kept: dict[str, frozenset[CallId] | None] = {}  # run -> the Calls it keeps

    def _kept_calls(self, layout: RunLayout) -> frozenset[CallId] | None:
        run_id = layout.info.run_id
        if run_id not in self._kept:
            self._kept[run_id] = kept_calls(layout.info.keep, layout.info.plan)
        return self._kept[run_id]

    def externalize(self, layout: RunLayout, shard: int, reports: Sequence[GrainCommitted]
                    ) -> dict[int, GrainCommitted]:
        """Write the reports' outputs over the threshold to one segment, counted as held by
        their sources; return those reports (by position) holding their references."""
        payloads = self.payloads_of(layout.info.run_id)
        threshold = payloads.threshold
        large: dict[int, bytes] = {}  # position -> packed outputs
        for at, report in enumerate(reports):
            if report.outputs is not None:
                packed = pack_value(report.outputs)
                if len(packed) > threshold:
                    large[at] = packed
        if not large:
            return {}
        batch = [reports[at] for at in large]
        written, refs = payloads.write_segment(layout.info.run_id, batch,
                                                    list(large.values()))
        self.track(layout, shard, batch, refs[0])
        return dict(zip(large, written))

    def track(self, layout: RunLayout, shard: int, reports: Sequence[GrainCommitted],
              ref: str) -> None:
        """Count the segment of ``ref`` as held by the sources of ``reports`` (its values),
        unless one of them is kept: a segment with a kept value is never freed."""
        kept = self._kept_calls(layout)
        if kept is None or any(r.call in kept for r in reports):
            return
        keys = ShardKeys(layout.info.run_id, shard)
        segment = object_of(ref).partition("/")[2]  # below the run's folder
        sources = sorted({r.path[0] for r in reports})
        self._eval(TRACK_PAYLOADS, [keys.payload_live, keys.payload_sources],
                   [segment, *sources])

    def delete_rejected(self, reports: Sequence[GrainCommitted], verdicts: list[CommitVerdict],
                        refs: dict[int, str],
                        sealed_generations: Callable[[list[int]], list[int | None]]) -> None:
        """Delete the segments of a commit call that :func:`deletable_refs` allows; the
        rest is left to ``rayorch gc`` (a failure here leaves only garbage)."""
        with contextlib.suppress(StoreError, PayloadError):
            for ref in deletable_refs(refs, verdicts, reports, sealed_generations):
                self.payloads_of(run_of_ref(ref)).delete(ref)

    def release(self, layout: RunLayout, shard: int, facts: Sequence[Fact]) -> None:
        """After an accepted append: the delivered sources' segments go when none holds
        them. A failure here leaves garbage (objects facts name), never a needed value."""
        if layout.info.keep == "all":
            return
        run_id = layout.info.run_id
        delivered = [f.index for f in facts if isinstance(f, OutputEmitted)]
        if not delivered:
            return
        keys = ShardKeys(run_id, shard)
        with contextlib.suppress(StoreError, PayloadError):
            dead = self._eval(RELEASE_PAYLOADS, [keys.payload_live, keys.payload_sources],
                              delivered)
            if not dead:
                return
            self._sync(keys.seq)  # the OutputEmitted that frees them survives a restart
            for segment in dead:
                name = segment.decode() if isinstance(segment, bytes) else str(segment)
                self.payloads_of(run_id).delete(f"{run_id}/{name}")


__all__ = ["KEEP_MODES", "SegmentRelease"]
