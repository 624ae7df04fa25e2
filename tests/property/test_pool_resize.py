"""Pools that change size during a run (docs/topics/POOL-SIZING.md, "Pools that size themselves").

A resize only changes which actor runs a batch: every schedule with pools growing and
draining mid-run still gives the reference's result, each output delivered once; and the
real ``ActorPool`` never kills a draining actor while a batch of it is out.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from inline_driver import InlinePool
from invariance import run_like_the_reference
from programs import ProgramSpec, programs

import rayorch as ro
from rayorch.actors.worker import BatchTask
from rayorch.core.plan import CallSpec
from rayorch.runtime.in_process import ExecutorOptions

resizing = st.builds(
    ExecutorOptions,
    batch_size=st.sampled_from([None, 1, 3]),
    actors=st.integers(1, 3),
    seed=st.integers(0, 2**16),
    random_order=st.just(True),
    fault_rate=st.sampled_from([0.0, 0.2]),
    restart_rate=st.sampled_from([0.0, 0.05]),
    fence_on_restart=st.booleans(),
    max_active_sources=st.sampled_from([None, 2]),
    check_rebuild=st.just(True),
    resize_rate=st.sampled_from([0.1, 0.4]),
)


@settings(max_examples=30)
@given(spec=programs, schedule=resizing,
       values=st.lists(st.integers(0, 10_000), min_size=1, max_size=4, unique=True))
def test_pools_resized_mid_run_give_the_reference_result_once(
        spec: ProgramSpec, schedule: ExecutorOptions, values: list[int]) -> None:
    run = run_like_the_reference(spec, schedule, values)  # each output delivered once
    assert run.kernel.run_completed and run.kernel.in_flight == 0


def double(xs: list[int]) -> list[int]:
    return [2 * x for x in xs]


def task(n: int) -> BatchTask:
    return BatchTask(CallSpec("double", "double"), (((n,), 0),), ((n,),), n, "run")


def test_a_draining_actor_keeps_its_batches_and_leaves_only_when_they_are_back() -> None:
    pool = InlinePool(ro.RayModule(double, replicas=(1, 4)).spec("double"), None)
    pool.resize(3)
    busy = pool.reserve()
    assert busy is not None and len(pool.live_slots()) == 3
    first = pool.submit(busy, task(1))
    pool.resize(1)  # the idle actors go at once, before the busy one
    assert pool.slots == [busy] and busy.handle.alive
    pool.resize(2)
    newcomer = pool.slots[-1]
    assert newcomer.index == 3  # slot indexes (actor names) are never reused
    assert pool.reserve() is newcomer
    second = pool.submit(newcomer, task(2))
    pool.resize(1)  # both busy: one drains, keeps its batch, takes no new one
    assert newcomer.draining and newcomer in pool.slots and newcomer.handle.alive
    assert pool.reserve() is busy
    pool.unreserve(busy)
    outcome = pool.finish(second)  # its batch is back: a result, then the actor leaves
    assert outcome.physical_failure is None and outcome.result is not None
    assert len(outcome.result.reports) == 1
    assert newcomer not in pool.slots and not newcomer.handle.alive
    assert pool.finish(first).physical_failure is None and pool.slots == [busy]
