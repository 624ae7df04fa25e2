"""Reuse keeps schedule invariance (docs/topics/REUSE.md, "Reuse").

A random nested program (the generators of the invariance tests) runs on random sources;
then a random edit: a source changed, added or removed, and maybe one Call's config
changed. The edited run, reusing the first one, must give the reference interpreter's
outputs, and the Grains it executes must be exactly those downstream of an edit: the ones
no Grain of the first run (same Call, same config) committed with the same input values.
That oracle is computed from a fresh run's kernel, without fingerprints or digests.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from invariance import REPORT_AT_ONCE, assert_same_as_reference, set_differences
from programs import MAX_ATTEMPTS, Behaviour, ProgramSpec, RandomPipeline, Step, mix, programs

import rayorch as ro
from rayorch.core.facts import GrainCommitted, GrainDispatched
from rayorch.core.plan import Plan, Policy
from rayorch.core.reference import evaluate
from rayorch.core.reuse import Reuse, ReuseIndex
from rayorch.core.run_view import RunView, fold_shard, numbered
from rayorch.core.state import Kernel
from rayorch.core.vocabulary import REPORT_PRESENT
from rayorch.runtime.in_process import ExecutionResult, ExecutorOptions, execute


class PureStep(Step):
    """A :class:`Step` without shared counters (they are state: never reused); ``salt`` is
    its config: a different salt gives different values."""

    def __init__(self, name: str, kind: str, behaviour: Behaviour, batched: bool,
                 fan_cap: int = 9, salt: int = 0) -> None:
        super().__init__(name, kind, behaviour, None, batched, fan_cap)  # type: ignore[arg-type]
        self.salt = salt

    def value(self, row: tuple[Any, ...]) -> Any:
        value = super().value(row)
        if not self.salt or self.kind == "fanout":
            return value if not self.salt else [v + self.salt for v in value]
        return value if self.kind == "pred" else mix(value, self.salt)

    def one(self, row: tuple[Any, ...]) -> Any:
        fate = self.fate(row)
        if fate == "permanent":
            raise RuntimeError(f"permanent failure of {self.name} on {row!r:.40}")
        if fate == "record":
            return ro.RecordFailure(f"{self.name} rejects {row!r:.40}")
        return self.value(row)


class PurePipeline(RandomPipeline):
    """The program of a spec with :class:`PureStep` modules; ``salted`` gets ``salt=1``."""

    def __init__(self, spec: ProgramSpec, salted: int | None = None) -> None:
        self.salted = salted
        super().__init__(spec)

    def _make(self, name: str, kind: str, behaviour: Behaviour, batched: bool,
              fan_cap: int) -> ro.RayModule:
        salt = int(self.salted is not None and self.salted % 32 == len(self.kinds))
        return ro.RayModule(PureStep, name, kind, behaviour, batched, fan_cap=fan_cap,
                            salt=salt, batched=batched, max_attempts=MAX_ATTEMPTS)


def no_group_failures(spec: ProgramSpec) -> ProgramSpec:
    """Which siblings a GroupFailure barrier stops is up to the schedule (and so which
    Grains run at all): keep the behaviours whose fates are per record."""
    return replace(spec, behaviours=tuple(replace(b, group_failure=0, transient=0)
                                          for b in spec.behaviours))


edits = st.tuples(st.sampled_from(["change", "add", "remove", "none"]), st.integers(0, 50),
                  st.integers(0, 10_000), st.one_of(st.none(), st.integers(0, 31)))


def edited(values: list[int], edit: tuple[str, int, int, int | None]) -> list[int]:
    kind, at, new, _ = edit
    out = list(values)
    if kind == "change" and new not in out:
        out[at % len(out)] = new
    elif kind == "add" and new not in out:
        out.insert(at % (len(out) + 1), new)
    elif kind == "remove" and len(out) > 1:
        del out[at % len(out)]
    return out


def executed(log: list[Any]) -> set[tuple[str, tuple[int, ...]]]:
    return {(f.call, f.path) for f in log if isinstance(f, GrainDispatched)}


def inputs_at_dispatch(plan: Plan, log: list[Any]) -> dict[tuple[str, tuple[int, ...]], str]:
    """Each dispatched Grain's input values (as the kernel holds them), from a fresh log."""
    kernel = Kernel(plan)
    seen: dict[tuple[str, tuple[int, ...]], str] = {}
    for fact in log:
        if isinstance(fact, GrainDispatched) and fact.generation == 0:
            seen[(fact.call, fact.path)] = repr(kernel.inputs_of((fact.call, fact.path)))
        kernel.apply(fact)
    return seen


def present(log: list[Any]) -> set[tuple[str, tuple[int, ...]]]:
    return {(f.call, f.path) for f in log
            if isinstance(f, GrainCommitted) and f.outcome == REPORT_PRESENT}


@settings(**REPORT_AT_ONCE)
@given(spec=programs, values=st.lists(st.integers(0, 10_000), min_size=1, max_size=4,
                                      unique=True),
       edit=edits, batch=st.sampled_from([None, 1, 3]), seed=st.integers(0, 2**16),
       policy=st.sampled_from([None, Policy.PARENT_BOUND]),
       restarts=st.sampled_from([0.0, 0.0, 0.1]))
def test_a_reusing_run_equals_a_fresh_one_and_runs_only_what_an_edit_touched(
        spec: ProgramSpec, values: list[int], edit: tuple[str, int, int, int | None],
        batch: int | None, seed: int, policy: Policy | None, restarts: float) -> None:
    spec = no_group_failures(spec)
    before = PurePipeline(spec).compile()
    after = PurePipeline(spec, salted=edit[3]).compile()
    rows_a, rows_b = [(v,) for v in values], [(v,) for v in edited(values, edit)]
    schedule = ExecutorOptions(batch_size=batch, policy=policy, seed=seed, random_order=True)

    first = execute(before, rows_a, replace(schedule, reuse=Reuse(before)))
    index = ReuseIndex.from_view(RunView("first", {}, {0: fold_shard(0, numbered(first.log))}))
    # driver restarts: the rebuilt machine folds the GrainReused facts it finds in the log
    reusing = execute(after, rows_b, replace(schedule, reuse=Reuse(after, index),
                                             restart_rate=restarts, check_rebuild=True))
    assert_same_as_reference(reusing, evaluate(after, rows_b))
    reusing.kernel.validate()

    # the oracle: a fresh run of the edited program, Grain by Grain
    fresh: ExecutionResult = execute(after, rows_b, schedule)
    done_before = inputs_at_dispatch(before, first.log)
    kept = {(call, done_before[(call, path)]) for call, path in present(first.log)
            if call_config(before, call) == call_config(after, call)}
    touched = {grain for grain, inputs in inputs_at_dispatch(after, fresh.log).items()
               if (grain[0], inputs) not in kept}
    ran = executed(reusing.log)
    assert ran == touched, f"Grains run vs those an edit touched: {set_differences(ran, touched)}"


def call_config(plan: Plan, call: str) -> Any:
    module = plan.module(plan.call_node(call).call.module)  # type: ignore[union-attr]
    return dict(module.kwargs).get("salt")
