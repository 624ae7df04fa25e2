"""``barrier_effects``: siblings of a GroupFailure barrier, by their state at the barrier."""

from __future__ import annotations

from rayorch.core.facts import (
    BarrierInstalled,
    ExpansionClosed,
    GrainCommitted,
    GrainDispatched,
)
from rayorch.inspect.barriers import barrier_effects


def test_siblings_are_classified_by_what_happened_before_the_barrier() -> None:
    call = "ocr"
    facts = [
        ExpansionClosed("root/0", (0,), "succeeded", 5),
        GrainDispatched(call, (0, 0), 0),
        GrainDispatched(call, (0, 1), 0),
        GrainDispatched(call, (0, 2), 0),
        GrainCommitted(call, (0, 1), 0, "present", ("ok",)),  # committed before: kept
        GrainCommitted(call, (0, 0), 0, "group_failure", None, "bad page"),  # the trigger
        BarrierInstalled(call, (0,), "bad page"),
        # (0, 2) was in flight; (0, 3) and (0, 4) never dispatched: suppressed
    ]
    [effect] = barrier_effects(facts, {call: "root/0"})
    assert (effect.siblings, effect.committed_before, effect.in_flight_at_barrier) == (4, 1, 1)
    assert effect.undispatched_at_barrier == 2
    assert effect.dispatched_after_barrier == 0
    assert effect.suppressed_before_dispatch == 2


def test_a_dispatch_after_the_barrier_is_counted_against_it() -> None:
    call = "ocr"
    facts = [
        ExpansionClosed("root/0", (3,), "succeeded", 2),
        GrainDispatched(call, (3, 0), 0),
        GrainCommitted(call, (3, 0), 0, "group_failure", None, "x"),
        BarrierInstalled(call, (3,), "x"),
        GrainDispatched(call, (3, 1), 0),
    ]
    [effect] = barrier_effects(facts, {call: "root/0"})
    assert effect.undispatched_at_barrier == 1
    assert effect.dispatched_after_barrier == 1
    assert effect.suppressed_before_dispatch == 0
