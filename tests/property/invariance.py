"""Comparing a kernel run with the reference interpreter (docs/ARCHITECTURE.md, "Semantics" 7)."""

from __future__ import annotations

import os
import reprlib
from collections.abc import Iterable
from typing import Any

from hypothesis import Phase

from rayorch.core.facts import BarrierInstalled, ExpansionClosed, GrainCommitted, GrainFailed
from rayorch.core.outcome import Item, Outcome
from rayorch.core.reference import ReferenceResult, evaluate
from rayorch.core.state import rebuild
from rayorch.runtime.in_process import ExecutionResult, ExecutorOptions, execute

# One failing example of a property that runs whole programs costs up to a second: shrinking
# it takes Hypothesis minutes (past pytest's timeout), explaining it more. Such properties
# report the first failing example at once (saved in the example database, so the next run
# replays it first); RAYORCH_SHRINK=1 shrinks it, for a smaller one to read.
REPORT_AT_ONCE: dict[str, Any] = {} if os.environ.get("RAYORCH_SHRINK") else {
    "phases": (Phase.explicit, Phase.reuse, Phase.generate), "report_multiple_bugs": False}

_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxdict, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxset = 4, 6, 6, 6, 6
_SHORT.maxstring = _SHORT.maxother = 60


def short(value: Any) -> str:
    """``repr(value)`` cut to a few lines, however large the value: a failure's message."""
    return _SHORT.repr(value)


def differences(got: dict[Any, Any], want: dict[Any, Any]) -> str:
    """The keys whose values differ, each with both values, shortened (at most 5 keys)."""
    keys = sorted((k for k in got.keys() | want.keys() if got.get(k) != want.get(k)), key=repr)
    lines = [f" {k!r}: got {short(got.get(k))}, want {short(want.get(k))}" for k in keys[:5]]
    more = [f" ... and {len(keys) - 5} more"] if len(keys) > 5 else []
    return "\n".join([*lines, *more])


def set_differences(got: Iterable[Any], want: Iterable[Any]) -> str:
    """What only ``got`` and only ``want`` hold, shortened."""
    got, want = set(got), set(want)
    return (f"only got: {short(sorted(got - want, key=repr))}; "
            f"only want: {short(sorted(want - got, key=repr))}")


def comparable(item: Item) -> tuple[Any, ...]:
    """Outcome and value; the cause only where it is schedule-invariant (Failed)."""
    if item.outcome is Outcome.PRESENT:
        return ("present", item.value)
    if item.outcome is Outcome.FAILED:
        return ("failed", item.cause)
    return (item.outcome.value,)


def _tainted(path: tuple[int, ...], parents: set[tuple[int, ...]]) -> bool:
    """Below a GroupFailure barrier's parent: which siblings ran is up to the schedule."""
    return any(len(p) < len(path) and path[: len(p)] == p for p in parents)


def assert_same_as_reference(run: ExecutionResult, ref: ReferenceResult) -> None:
    """Final outputs and lineage (expansions, ordinals) equal; one terminal fact per Grain."""
    got = {i: tuple(comparable(x) for x in items) for i, items in run.outputs.items()}
    want = {i: tuple(comparable(x) for x in items) for i, items in ref.outputs.items()}
    assert got == want, f"outputs differ (kernel vs reference):\n{differences(got, want)}"
    barrier_parents = {f.parent for f in run.log if isinstance(f, BarrierInstalled)}
    barrier_parents |= {p for _, p in ref.barriers}
    kernel_x = {
        (f.domain, f.parent): (f.outcome, f.count)
        for f in run.log
        if isinstance(f, ExpansionClosed) and not _tainted(f.parent, barrier_parents)
    }
    ref_x = {k: v for k, v in ref.expansions.items() if not _tainted(k[1], barrier_parents)}
    assert kernel_x == ref_x, "lineage (expansions and their child counts) differs"
    closed = [(f.domain, f.parent) for f in run.log if isinstance(f, ExpansionClosed)]
    assert len(closed) == len(set(closed)), "an Expansion was closed twice"
    sealed = [(f.call, f.path) for f in run.log if isinstance(f, (GrainCommitted, GrainFailed))]
    assert len(sealed) == len(set(sealed)), "a Grain got two terminal facts"
    # The executor writes a GroupFailure's barrier with its commit, as the stores do; the
    # kernel logs it after what the commit derived. Same facts; the log rebuilds the state.
    assert sorted(map(repr, run.log)) == sorted(map(repr, run.kernel.log)), (
        "the executor's fact log and the kernel's log differ")
    rebuilt = rebuild(run.kernel.plan, run.log, max_active_sources=run.kernel.max_active_sources,
                      total_sources=len(ref.outputs))
    assert rebuilt.snapshot() == run.kernel.snapshot(), "the fact log does not rebuild the state"
    assert sorted(run.completion_order) == sorted(ref.outputs), "a source was emitted twice"


def run_like_the_reference(spec: Any, schedule: ExecutorOptions, values: list[int]
                           ) -> ExecutionResult:
    """Run the random program ``spec`` over ``values`` with ``schedule`` and check it
    against the reference interpreter; the run, for more checks."""
    from programs import RandomPipeline

    pipeline = RandomPipeline(spec)
    plan = pipeline.compile()
    rows = [(v,) for v in values]
    pipeline.registry.clear()
    reference = evaluate(plan, rows)
    pipeline.registry.clear()
    run = execute(plan, rows, schedule)
    assert_same_as_reference(run, reference)
    return run
