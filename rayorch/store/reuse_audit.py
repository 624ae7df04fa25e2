"""What the tools check and keep for reuse: each ``GrainReused`` names a real seal of an
earlier run, and payload files that a later run references are not deleted.

Both read run views (:mod:`rayorch.core.run_view`): the audit the views of the runs a run
reused from, ``gc``/``delete`` the views of every other run of the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rayorch.core.facts import GrainReused
from rayorch.core.ids import format_grain
from rayorch.core.run_view import RunView, ShardView
from rayorch.store.base import LineageStore
from rayorch.store.errors import RunNotFoundError

Finding = tuple[int, int, str, str]  # (shard, seq, object, message)


def reused_facts(views: Iterable[ShardView]) -> Iterable[tuple[int, int, GrainReused]]:
    """``(shard, seq, fact)`` of every ``GrainReused`` in the views."""
    for view in views:
        for grain in view.grains.values():
            for seq, fact in grain.reused:
                yield view.shard, seq, fact


def check_reuse(store: LineageStore, views: Mapping[int, ShardView]) -> list[Finding]:
    """Each ``GrainReused`` names a Grain of its origin run sealed with the same reuse key
    and the same outputs (the same payload file, or equal inline values)."""
    origins: dict[str, RunView | None] = {}
    findings: list[Finding] = []
    for shard, seq, fact in reused_facts(views.values()):
        name = format_grain((fact.call, fact.path))
        origin = fact.origin_run
        if origin not in origins:
            try:
                origins[origin] = store.read_view(origin)
            except RunNotFoundError:
                origins[origin] = None
        view = origins[origin]
        named = f"{format_grain((fact.origin_call, fact.origin_path))} of run {origin}"
        if view is None:
            findings.append((shard, seq, name, f"reused from run {origin}, which is not in "
                                               "the store (deleted?)"))
            continue
        home = next((v for v in view.shards.values()
                     if (fact.origin_call, fact.origin_path) in v.grains), None)
        grain = None if home is None else home.grains[(fact.origin_call, fact.origin_path)]
        reusable = None if grain is None else grain.reusable
        if reusable is None:
            findings.append((shard, seq, name, f"reuses {named}, which was not sealed there "
                                               "with outputs a run may reuse"))
        elif reusable[0] != fact.reuse_key:
            findings.append((shard, seq, name, f"reuses {named}, whose reuse key differs "
                                               "(other code, arguments or inputs)"))
        elif (reusable[1].payload_ref != fact.payload_ref if fact.payload_ref
              else reusable[1].outputs != fact.outputs):
            findings.append((shard, seq, name, f"its outputs are not those of {named}"))
    return findings


def refs_held_elsewhere(store: LineageStore, run_id: str) -> set[str]:
    """Payload references of ``run_id``'s files that other runs' ``GrainReused`` hold."""
    prefix = f"{run_id}/"
    held: set[str] = set()
    for info in store.list_runs():
        if info.run_id == run_id:
            continue
        try:
            view = store.read_view(info.run_id)
        except RunNotFoundError:
            continue
        held.update(fact.payload_ref for _, _, fact in reused_facts(view.shards.values())
                    if fact.payload_ref and fact.payload_ref.startswith(prefix))
    return held


__all__ = ["Finding", "check_reuse", "refs_held_elsewhere", "reused_facts"]
