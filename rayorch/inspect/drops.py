"""Why documents were dropped, read from the run's facts: the verdicts of data-quality
stages (``rayorch.pipelines.quality``) that their ``GrainCommitted`` facts record.

A verdict is an output value of the shape ``{"stage": str, "keep": bool, "reason": str |
None, ...}``; a committed one with ``keep`` False is a drop. The first drop of a source
(in its shard's fact order) is why it is gone: a later stage never sees a dropped document.
Reads the one run view (:mod:`rayorch.core.run_view`), like status, show and audit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.core.run_view import GrainView, RunView, ShardView, kept_value_calls
from rayorch.core.vocabulary import REPORT_PRESENT


@dataclass(frozen=True)
class Drop:
    """One dropped source: which Call dropped it, its stage, reason and the rest of the
    verdict (the kept copy, the score)."""

    index: int
    call: str
    seq: int
    verdict: dict[str, Any]

    @property
    def stage(self) -> str:
        return str(self.verdict.get("stage"))

    @property
    def reason(self) -> str:
        return str(self.verdict.get("reason"))

    @property
    def label(self) -> str:
        """``stage: reason`` (what the summaries count)."""
        return f"{self.stage}: {self.reason}"

    def details(self) -> dict[str, Any]:
        """The verdict without ``stage``, ``keep`` and ``reason``."""
        return {k: v for k, v in self.verdict.items() if k not in ("stage", "keep", "reason")}

    def text(self) -> str:
        """In words, for people: ``dropped by dedup_text: duplicate (kept: a.pdf, ...)``
        (the stage named apart when its Call has another name)."""
        details = ", ".join(f"{k}: {v}" for k, v in sorted(self.details().items()))
        stage = "" if self.stage == self.call else f" (stage {self.stage})"
        return (f"dropped by {self.call}{stage}: {self.reason}"
                + (f" ({details})" if details else ""))


def is_verdict(value: Any) -> bool:
    """Whether ``value`` is a data-quality verdict (see the module doc)."""
    return (isinstance(value, dict) and isinstance(value.get("stage"), str)
            and isinstance(value.get("keep"), bool) and "reason" in value)


class VerdictReader:
    """Reads verdicts that left their facts: a view read without payloads holds, for a
    large verdict, its outline (``(False, FREED)``) and a payload reference; this resolves
    those (``store.resolve_payload``), once each. Stages declare ``keep_values``, so their
    verdicts are never freed."""

    def __init__(self, resolve: Callable[[Any], Any] | None = None,
                 plan: Mapping[str, Any] | None = None) -> None:
        self.resolve = resolve
        self.calls = None if plan is None else kept_value_calls(plan)
        """The Calls whose values may be verdicts (None: any)."""
        self._seen: dict[tuple[str, tuple[int, ...], int], tuple[Any, ...] | None] = {}

    def outputs(self, fact: Any) -> tuple[Any, ...] | None:
        outputs: tuple[Any, ...] | None = fact.outputs
        if not fact.payload_ref or self.resolve is None or (
                self.calls is not None and fact.call not in self.calls) or (
                outputs and not any(v is False for v in outputs)):  # a kept document
            return outputs
        key = (fact.call, tuple(fact.path), fact.generation)
        if key not in self._seen:
            try:
                self._seen[key] = self.resolve(fact).outputs
            except RayorchError:  # freed or unreadable: the outline is all there is
                self._seen[key] = outputs
        return self._seen[key]


def grain_drop(grain: GrainView, reader: VerdictReader | None = None) -> Drop | None:
    """The drop a source's Grain committed, if its outputs hold one."""
    if len(grain.path) != 1 or not grain.committed:
        return None
    seq, fact = grain.committed[0]
    if fact.outcome != REPORT_PRESENT:
        return None
    outputs = fact.outputs if reader is None else reader.outputs(fact)
    for value in outputs or ():
        if is_verdict(value) and value["keep"] is False:
            return Drop(grain.path[0], grain.call, seq, dict(value))
    return None


def grains_drop(index: int, grains: Iterable[GrainView], reader: VerdictReader | None = None
                ) -> Drop | None:
    """The first drop (in fact order) among one source's Grains."""
    drops = [d for d in (grain_drop(g, reader) for g in grains)
             if d is not None and d.index == index]
    return min(drops, key=lambda d: d.seq, default=None)


def shard_drops(shard: ShardView, reader: VerdictReader | None = None) -> dict[int, Drop]:
    """The drops of one shard's sources, by source index."""
    found: dict[int, Drop] = {}
    for grain in shard.grains.values():
        drop = grain_drop(grain, reader)
        if drop is not None:
            earlier = found.get(drop.index)
            if earlier is None or drop.seq < earlier.seq:
                found[drop.index] = drop
    return found


def run_drops(view: RunView, reader: VerdictReader | None = None) -> dict[int, Drop]:
    """Every dropped source of the run, by index (sorted)."""
    drops: dict[int, Drop] = {}
    for shard in view.shards.values():
        drops.update(shard_drops(shard, reader))
    return dict(sorted(drops.items()))


def check_claims(store: Any, run_id: str, views: dict[int, ShardView]
                 ) -> list[tuple[int, int, str, str]]:
    """Audit findings ``(shard, seq, object, message)``: each exact-dedup verdict against
    the store's dedup index. A dropped copy's key must be held by the copy it names, a
    kept document's key must be claimed. A ``memory://`` run's index lived in its actors:
    nothing to check here."""
    from rayorch.store.registry import is_shared_store

    if not is_shared_store(getattr(store, "url", "memory://")):
        return []
    reader = VerdictReader(store.resolve_payload, store.run_info(run_id).plan)
    findings = []
    for shard, view in views.items():
        for grain in view.grains.values():
            if len(grain.path) != 1 or not grain.committed:
                continue
            seq, fact = grain.committed[0]
            for value in reader.outputs(fact) or ():
                if not (is_verdict(value) and isinstance(value.get("key"), str)
                        and isinstance(value.get("scope"), str)):
                    continue
                [holder] = store.holders(value["scope"], [value["key"]])
                name = f"{grain.call}[{grain.path[0]}]"
                exact = value.get("reason") == "duplicate"
                if value["keep"] is False and exact and holder != value.get("kept"):
                    findings.append((shard, seq, name, f"dropped as a copy of "
                                     f"{value.get('kept')!r}, but the dedup index holds "
                                     f"{value['key']} for {holder!r}"))
                elif value["keep"] is True and holder is None:
                    findings.append((shard, seq, name, f"kept, but its claim of "
                                     f"{value['key']} is not in the dedup index"))
    return findings


def read_drops(store: Any, run_id: str) -> dict[int, Drop]:
    """Every dropped source of a stored run, by index: its view, verdicts read back."""
    view = store.read_view(run_id)
    return run_drops(view, VerdictReader(store.resolve_payload, view.plan))


def drops_by_reason(drops: dict[int, Drop]) -> dict[str, int]:
    """``{"stage: reason": count}``, most first."""
    return dict(Counter(d.label for d in drops.values()).most_common())


__all__ = ["Drop", "VerdictReader", "check_claims", "drops_by_reason", "grain_drop",
           "grains_drop", "is_verdict", "read_drops", "run_drops", "shard_drops"]
