"""Reuse of an earlier run's Grains (docs/topics/REUSE.md, "Reuse").

* :class:`ReuseIndex`: ``reuse key -> the Grain that sealed with it`` in one earlier run,
  built from that run's view (:mod:`rayorch.core.run_view`, ``GrainView.reusable``).
* :class:`Reuse`: what a :class:`~rayorch.core.machine.ShardMachine` is given. It knows the
  plan's Call fingerprints (:mod:`rayorch.core.fingerprint`); it gives every dispatch its
  reuse key (so that this run can be reused later), and when a Grain becomes ready whose
  key the index holds, :meth:`Reuse.seal_ready` yields the ``GrainReused`` that seals it
  instead of a dispatch. Everything downstream of a changed Grain has new inputs, so new
  keys: it runs again.

No clock, and no I/O of its own: a source's part of its Grains' keys is the identity its
listing gave (``SourceAdmitted.identity``: size with version, ETag or mtime), folded by the
kernel; the driver passes ``load`` (payload reference -> outputs), which
:meth:`Reuse.seal_ready` calls for a hit whose outputs left its fact. Building a
:class:`Reuse` reads each module's source (:func:`~rayorch.core.fingerprint.plan_fingerprints`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.core.facts import GrainReused, holds_freed
from rayorch.core.fingerprint import grain_reuse_key, plan_fingerprints
from rayorch.core.ids import CallId, GrainKey, Path
from rayorch.core.plan import Plan
from rayorch.core.run_view import RunView
from rayorch.core.state import Kernel

UNKNOWN_IDENTITY = "?"
"""A source identity no listing gave (an object named without its version): its Grains get
no reuse key (``rayorch.storage.UNKNOWN_IDENTITY`` is this)."""


class ReuseError(RayorchError):
    """A reuse request that cannot be served (an unknown Call, no earlier run)."""


@dataclass(frozen=True, slots=True)
class ReuseHit:
    """The sealed Grain of the earlier run that a key names, and its outputs."""

    call: CallId
    path: Path
    outputs: tuple[Any, ...] | None
    payload_ref: str | None


class ReuseIndex:
    """``reuse key -> ReuseHit`` of one earlier run (``run_id``)."""

    def __init__(self, run_id: str, hits: dict[str, ReuseHit]) -> None:
        self.run_id = run_id
        self.hits = hits

    @classmethod
    def from_view(cls, view: RunView) -> ReuseIndex:
        hits: dict[str, ReuseHit] = {}
        for shard in view.shards.values():
            for grain in shard.grains.values():
                reusable = grain.reusable
                if reusable is not None:
                    key, fact = reusable
                    if fact.outputs is not None and holds_freed(fact.outputs):
                        continue  # freed once its source was delivered: it runs again
                    hits.setdefault(key, ReuseHit(grain.call, grain.path, fact.outputs,
                                                  fact.payload_ref))
        return cls(view.run_id, hits)

    def __len__(self) -> int:
        return len(self.hits)

    def get(self, key: str) -> ReuseHit | None:
        return self.hits.get(key)


class Reuse:
    """Reuse keys for dispatches, and ``GrainReused`` for ready Grains the index holds.

    ``no_reuse``: Calls that always run (``--no-reuse CALL``). ``load`` reads a payload
    reference's outputs; a hit whose payload cannot be read runs instead.
    """

    def __init__(self, plan: Plan, index: ReuseIndex | None = None, *,
                 no_reuse: Collection[CallId] = (),
                 load: Callable[[str], tuple[Any, ...]] | None = None) -> None:
        self.fingerprints = plan_fingerprints(plan)
        unknown = sorted(set(no_reuse) - set(self.fingerprints))
        if unknown:
            raise ReuseError(f"--no-reuse {', '.join(unknown)}: no such Call in the plan (its "
                             f"Calls: {', '.join(self.fingerprints)})")
        self.index = index
        self.no_reuse = frozenset(no_reuse)
        self.load = load
        self.reused: Counter[CallId] = Counter()
        self.unreadable: list[str] = []  # payload references that could not be read
        self._sources: dict[CallId, tuple[bool, ...]] = {}

    def attach(self, kernel: Kernel) -> None:
        """Have ``kernel`` collect the Grains that become ready (only when there is an index)."""
        if self.index is not None and len(self.index):
            kernel.newly_ready = []

    def notes(self) -> list[str]:
        """One line per Call that is never reused, saying why."""
        return [f"Call {fp.call} is not reused: {fp.reason}"
                for fp in self.fingerprints.values() if fp.key is None]

    def key_of(self, kernel: Kernel, grain: GrainKey,
               values: tuple[Any, ...] | None = None) -> str:
        """The Grain's reuse key from its current inputs ("" when it has none); ``values``:
        those inputs, when the caller has them already.

        A Call that takes a source input keys it by the source's identity too, so a
        changed file under the same name runs again; a source whose identity is unknown
        (``UNKNOWN_IDENTITY``: no listing named its version) gives no key.
        """
        fingerprint = self.fingerprints[grain[0]].key
        if fingerprint is None:
            return ""
        if values is None:
            values = kernel.inputs_of(grain)
        files: tuple[str | None, ...] = ()
        flags = self._source_flags(kernel, grain[0])
        if any(flags):
            identity = kernel.source_identity(grain[1])
            if identity == UNKNOWN_IDENTITY:
                return ""
            if identity is not None:
                files = (identity,)
        key = grain_reuse_key(fingerprint, values, files)
        return "" if key is None else key

    def _source_flags(self, kernel: Kernel, call: CallId) -> tuple[bool, ...]:
        flags = self._sources.get(call)
        if flags is None:
            tables = kernel.tables
            sources = {port for _, port in tables.inputs}
            flags = self._sources[call] = tuple(p in sources for p in tables.calls[call].inputs)
        return flags

    def seal_ready(self, kernel: Kernel) -> Iterator[tuple[GrainReused, GrainReused]]:
        """``(fact to fold, fact to write)`` for each newly ready Grain the index holds.

        The caller folds each fact before asking for the next: a Grain it makes ready is
        considered in the same call. The written fact holds the payload reference only.
        """
        pending = kernel.newly_ready
        if pending is None:
            return
        index = self.index
        while pending:
            batch = pending[:]
            pending.clear()
            if index is None or not len(index):
                continue
            for grain in batch:
                call = grain[0]
                if call in self.no_reuse or not kernel.fresh_ready(grain):
                    continue
                key = self.key_of(kernel, grain)
                hit = index.get(key) if key else None
                if hit is None:
                    continue
                written = GrainReused(call, grain[1], 0, key, index.run_id, hit.call, hit.path,
                                      hit.outputs, hit.payload_ref)
                folded = written
                if hit.outputs is None:
                    outputs = self._load(hit)
                    if outputs is None:
                        continue
                    folded = replace(written, outputs=outputs)
                self.reused[call] += 1
                yield folded, written

    def _load(self, hit: ReuseHit) -> tuple[Any, ...] | None:
        if self.load is None or hit.payload_ref is None:
            return None
        try:
            return self.load(hit.payload_ref)
        except RayorchError:
            self.unreadable.append(hit.payload_ref)
            return None


__all__ = ["UNKNOWN_IDENTITY", "Reuse", "ReuseError", "ReuseHit", "ReuseIndex"]
