"""Schedule invariance (docs/ARCHITECTURE.md, "Semantics" 7).

Every physical schedule gives the reference's result.

Random programs (3 levels of expand/reduce, filters, broadcasts, side outputs), random
long-tailed fan-out (including 0 children), random per-record UDF behaviours
(RecordFailure, GroupFailure, transient and permanent exceptions) and random physical
schedules (batch sizes, policies, actors, completion order, injected faults, stale and
duplicate reports, driver restarts with and without fencing).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from invariance import run_like_the_reference
from programs import ProgramSpec, programs

from rayorch.core.plan import Policy
from rayorch.runtime.in_process import ExecutorOptions

schedules = st.builds(
    ExecutorOptions,
    batch_size=st.sampled_from([None, 1, 2, 3, 7, 64]),
    policy=st.sampled_from([None, Policy.ELASTIC, Policy.PARENT_BOUND]),
    actors=st.integers(1, 3),
    seed=st.integers(0, 2**16),
    random_order=st.booleans(),
    fault_rate=st.sampled_from([0.0, 0.0, 0.2]),
    bogus_report_rate=st.sampled_from([0.0, 0.3]),
    restart_rate=st.sampled_from([0.0, 0.0, 0.05]),
    fence_on_restart=st.booleans(),
    max_active_sources=st.sampled_from([None, 1, 2]),
    check_rebuild=st.just(True),
    validate=st.booleans(),
)
sources = st.lists(st.integers(0, 10_000), min_size=1, max_size=4, unique=True)


@given(spec=programs, schedule=schedules, values=sources)
def test_any_schedule_gives_the_reference_result(
    spec: ProgramSpec, schedule: ExecutorOptions, values: list[int]
) -> None:
    run = run_like_the_reference(spec, schedule, values)
    run.kernel.validate()
    assert run.kernel.run_completed and run.kernel.in_flight == 0
