"""Upstream RayOrch's API beside ours, without Ray: builders, option namespaces, recovery
policies (in-actor exception handling), output layouts, F.expand_aligned and
F.reduce(members=) in the kernel and in the sequential oracle."""

from __future__ import annotations

from typing import Any

import pytest

import rayorch as ro
from rayorch import F
from rayorch.core import compile_errors as ce
from rayorch.core.outcome import Outcome
from rayorch.core.plan import CallSpec, ModuleOptions
from rayorch.core.program import RAY_ACTOR_OPTIONS, RESERVED_RAY_OPTIONS
from rayorch.core.recovery import RecoveryMode
from rayorch.core.reference import evaluate
from rayorch.core.udf import UdfError, instantiate, invoke_batch, run_with_recovery
from rayorch.runtime.in_process import ExecutorOptions, execute

HERE = __file__.rsplit("/", 1)[-1]


class AddOne:
    def run(self, values: list[int]) -> list[int]:
        return [v + 1 for v in values]


class Model:
    def __init__(self, path: str, *, scale: int = 1) -> None:
        self.path, self.scale = path, scale

    def __call__(self, xs: list[int]) -> list[int]:
        return [x * self.scale for x in xs]


def located(err: pytest.ExceptionInfo[Any], *parts: str) -> None:
    text = str(err.value)
    assert f"{HERE}:" in text, text  # names the line that is wrong
    for part in parts:
        assert part in text, text


# -- builders and namespaces ------------------------------------------------------------
def test_builder_sorts_execution_ray_and_constructor_options() -> None:
    module = (
        ro.RayModule(Model)
        .pre_init("m.bin", scale=3)
        .ray_options(replicas=2, batch_size=8, num_gpus=1, memory=2**20,
                     runtime_env={"env_vars": {"A": "1"}}, max_restarts=1)
        .returns(1)
    )
    opts = module.options
    assert (opts.replicas, opts.batch_size, opts.num_gpus) == (2, 8, 1.0)
    assert dict(opts.ray_options) == {"memory": 2**20, "runtime_env": {"env_vars": {"A": "1"}},
                                      "max_restarts": 1}
    assert module.args == ("m.bin",) and module.kwargs == {"scale": 3}
    flat = ro.RayModule(Model, "m.bin", scale=3, replicas=2,
                        ray_options={"runtime_env": {"env_vars": {"A": "1"}}})
    assert flat.kwargs == {"scale": 3} and dict(flat.options.ray_options) == {
        "runtime_env": {"env_vars": {"A": "1"}}}


def test_ray_actor_option_list_matches_ray() -> None:
    utils = pytest.importorskip("ray._common.ray_option_utils")
    assert set(utils.actor_options) == (
        RAY_ACTOR_OPTIONS | set(RESERVED_RAY_OPTIONS) | {"num_cpus", "num_gpus", "resources"})


class TakesAnything:
    def __init__(self, **options: Any) -> None:
        self.options = options

    def __call__(self, xs: list[int]) -> list[int]:
        return xs


def test_ray_option_given_flat_is_refused_at_its_line() -> None:
    with pytest.raises(ce.ModuleDefinitionError) as err:
        ro.RayModule(Model, "m", runtime_env={"pip": ["x"]})
    located(err, "'runtime_env' is a Ray actor option", "ray_options={'runtime_env'")
    with pytest.raises(ce.ModuleDefinitionError) as err:  # not swallowed by **kwargs
        ro.RayModule(TakesAnything, memory=2**30)
    located(err, "'memory' is a Ray actor option", ".pre_init(memory=")
    meant = ro.RayModule(TakesAnything).pre_init(memory=5)
    assert meant.kwargs == {"memory": 5} and meant.options.ray_options == ()


def test_unknown_keyword_is_refused_never_a_silent_constructor_argument() -> None:
    with pytest.raises(ce.ModuleDefinitionError) as err:
        ro.RayModule(Model, "m", scael=2)
    located(err, "unknown option 'scael'", "Model.__init__")
    with pytest.raises(ce.ModuleDefinitionError) as err:
        ro.RayModule(Model).ray_options(replica=2)
    located(err, "unknown option 'replica' in .ray_options")
    with pytest.raises(ce.ModuleDefinitionError) as err:
        ro.RayModule(Model).ray_options(name="mine")
    located(err, "Ray option 'name'", "names the pool's actors")
    with pytest.raises(ce.ModuleDefinitionError) as err:
        ro.RayModule(Model).ray_options(max_retries=2)
    located(err, "max_retries", "RecoveryPolicy.retry_batch")


class TakesTimeout:
    def __init__(self, timeout_s: float = 1.0) -> None:
        self.timeout_s = timeout_s

    def __call__(self, xs: list[int]) -> list[int]:
        return xs


def test_option_that_is_also_a_constructor_parameter_must_be_disambiguated() -> None:
    with pytest.raises(ce.ModuleDefinitionError) as err:
        ro.RayModule(TakesTimeout, timeout_s=5)
    located(err, "'timeout_s' is both an execution option", ".pre_init(timeout_s=")
    explicit = ro.RayModule(TakesTimeout).pre_init(timeout_s=5).ray_options(timeout_s=9)
    assert explicit.kwargs == {"timeout_s": 5} and explicit.options.timeout_s == 9


def test_pdf_engine_options_stay_constructor_arguments() -> None:
    from rayorch.pipelines.pdf import PdfPipeline

    ocr = PdfPipeline(engine="text", engine_options={"timeout_s": 7}).ocr
    assert ocr.kwargs == {"timeout_s": 7} and ocr.args == ("text",)
    assert ocr.options.timeout_s is None


def test_constructor_arguments_are_checked_against_the_signature() -> None:
    with pytest.raises(ce.ModuleDefinitionError) as err:
        ro.RayModule(Model).pre_init("a", "b", "c")
    located(err, "do not fit Model.__init__")


def test_run_method_is_the_entry_point_and_ro_function_wraps_functions() -> None:
    module = ro.RayModule(AddOne)
    fn = instantiate(module.spec("a"))
    assert fn([1, 2]) == [2, 3]
    assert module.options.output_layout == "columns"

    @ro.function(num_outputs=2)
    def split(xs: list[int]) -> tuple[list[int], list[int]]:
        return [x // 2 for x in xs], [x % 2 for x in xs]

    assert isinstance(split, ro.RayModule) and split.options.num_outputs == 2
    call = CallSpec("s", "s", num_outputs=2)
    assert invoke_batch(instantiate(split.spec("s")), split.options, call,
                        [(5,), (6,)]) == [(2, 1), (3, 0)]


def test_pipeline_without_super_init_registers_its_modules() -> None:
    class P(ro.Pipeline):
        def __init__(self) -> None:
            self.first = ro.RayModule(AddOne).ray_options(replicas=2, batch_size=8)
            self.second = ro.RayModule(AddOne).ray_options(replicas=2, batch_size=8)

        def forward(self, values: Any) -> Any:
            return self.second(self.first(values))

    plan = P().compile()
    assert [m.name for m in plan.modules] == ["first", "second"]
    assert execute(plan, [(1,), (2,)]).outputs[1][0].value == 4


# -- output layouts ---------------------------------------------------------------------
def test_columns_layout_failures_fail_the_whole_record() -> None:
    opts = ModuleOptions(num_outputs=2, output_layout="columns")
    call = CallSpec("m", "m", num_outputs=2)

    def fn(xs: list[int]) -> list[list[Any]]:
        return [[x if x else ro.RecordFailure("zero") for x in xs], [x * 2 for x in xs]]

    assert invoke_batch(fn, opts, call, [(1,), (0,)]) == [(1, 2), ro.RecordFailure("zero")]
    with pytest.raises(UdfError, match="BatchError"):
        invoke_batch(lambda xs: [[1, 2]], opts, call, [(1,), (2,)])


def test_rows_layout_mismatch_names_the_columns_layout() -> None:
    with pytest.raises(UdfError, match="output_layout='columns'"):
        invoke_batch(lambda xs: [xs, xs], ModuleOptions(num_outputs=2),
                     CallSpec("m", "m", num_outputs=2), [(1,), (2,), (3,)])


def test_keyword_data_inputs_reach_the_udf_by_keyword() -> None:
    call = CallSpec("m", "m", static_kwargs=(("k", 10),), keywords=("other",))
    seen: list[Any] = []

    def fn(xs: list[int], *, other: list[int], k: int) -> list[int]:
        seen.append((xs, other, k))
        return [x + o + k for x, o in zip(xs, other)]

    assert invoke_batch(fn, ModuleOptions(), call, [(1, 2), (3, 4)]) == [(13,), (17,)]
    assert seen == [([1, 3], [2, 4], 10)]


# -- recovery policies (what a pool actor does with an exception) -------------------------
class Flaky:
    """Raises on ``bad`` records; a record in ``transient`` raises on its first run only."""

    def __init__(self, bad: set[int], transient: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.bad, self.transient, self.calls = bad, set(transient), 0

    def __call__(self, xs: list[int]) -> list[int]:
        self.calls += 1
        for x in xs:
            if x in self.bad:
                raise ValueError(f"bad {x}")
            if x in self.transient:
                self.transient.discard(x)
                raise TimeoutError(f"transient {x}")
        return [x * 10 for x in xs]


ONE = CallSpec("m", "m")


@pytest.mark.parametrize("recovery", [None, "retry_batch", "retry_tail", "abort",
                                      ro.RecoveryPolicy.retry_batch(max_retries=3)])
@pytest.mark.parametrize("max_attempts", [1, 3])
def test_innocent_batch_mates_are_never_failed(recovery: Any, max_attempts: int) -> None:
    options = ro.RayModule(Flaky, set(), recovery=recovery, max_attempts=max_attempts).options
    done = run_with_recovery(Flaky({2}), options, ONE, [(1,), (2,), (3,)])
    assert done.results[0] == (10,) and done.results[2] == (30,)
    assert done.results[1] == ro.RecordFailure("ValueError: bad 2")
    assert done.exceptions >= 2


@pytest.mark.parametrize("recovery", [None, "retry_batch", "retry_tail"])
def test_a_transient_exception_is_retried_on_the_same_instance(recovery: Any) -> None:
    fn = Flaky(set(), {2})
    options = ro.RayModule(Flaky, set(), recovery=recovery).options
    done = run_with_recovery(fn, options, ONE, [(1,), (2,)])
    assert done.results == [(10,), (20,)] and done.exceptions == 1


def test_policies_differ_in_what_they_run_again() -> None:
    def runs(recovery: Any, rows: int, **kw: Any) -> int:
        options = ro.RayModule(Flaky, set(), recovery=recovery, **kw).options
        return run_with_recovery(Flaky({0}), options, ONE, [(i,) for i in range(rows)]).runs

    # isolate_tail: batch, then each record alone; the bad one until max_attempts
    assert runs(None, 3, max_attempts=3) == 1 + 3 + 1
    # retry_batch(2): batch 3 times, then an isolation pass
    assert runs(ro.RecoveryPolicy.retry_batch(max_retries=2), 3) == 3 + 3
    # retry_tail(2): batch, isolation pass, then the tail (one record) twice more
    assert runs(ro.RecoveryPolicy.retry_tail(max_retries=2), 3) == 1 + 3 + 2
    # abort: batch, isolation pass, no retry
    assert runs("abort", 3) == 1 + 3
    assert runs("abort", 1) == 1


def test_actor_failure_escapes_the_recovery() -> None:
    def broken(xs: list[int]) -> list[int]:
        raise ro.ActorFailure("CUDA context lost")

    with pytest.raises(ro.ActorFailure):
        run_with_recovery(broken, ModuleOptions(), ONE, [(1,), (2,)])


def test_upstream_style_recovery_objects_are_understood() -> None:
    class Mode:
        name = "RETRY_TAIL"

    class UpstreamPolicy:
        udf_mode = Mode()
        max_udf_retries = 2
        infra_retries = 4

    options = ro.RayModule(AddOne).ray_options(recovery=UpstreamPolicy()).options
    assert options.recovery is not None
    assert options.recovery.mode is RecoveryMode.RETRY_TAIL and options.recovery.max_retries == 2
    assert options.max_attempts == 5  # crashes: infra_retries + 1 runs


# -- F.expand_aligned and F.reduce(members=) -----------------------------------------------
def pages_and_meta(docs: list[int]) -> tuple[list[list[int]], list[list[str]]]:
    return [list(range(d)) for d in docs], [[f"p{i}" for i in range(d)] for d in docs]


def ocr(pages: list[int], meta: list[str]) -> list[Any]:
    return [ro.RecordFailure("blank") if p == 4 else f"{m}={p * 2}" for p, m in zip(pages, meta)]


def keep_even(pages: list[int]) -> list[bool]:
    return [p % 2 == 0 for p in pages]


def join(texts: list[list[str]], metas: list[list[str]]) -> list[str]:
    return [f"{'|'.join(t)}#{','.join(m)}" for t, m in zip(texts, metas)]


class Aligned(ro.Pipeline):
    def __init__(self) -> None:
        self.render = ro.RayModule(pages_and_meta).returns(2)
        self.ocr = ro.RayModule(ocr)
        self.mask = ro.RayModule(keep_even)
        self.join = ro.RayModule(join)

    def forward(self, docs: Any) -> Any:
        pages, meta = F.expand_aligned(*self.render(docs))
        kept = F.filter(pages, self.mask(pages))
        texts = self.ocr(kept, meta=meta)
        groups, metas = F.reduce_aligned(texts, meta, members=texts)
        return self.join(groups, metas)


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("seed", range(4))
def test_aligned_expand_and_member_reduce_agree_with_the_oracle(
    batch_size: int, seed: int
) -> None:
    plan = Aligned().compile()
    sources = [(0,), (3,), (5,), (2,)]
    expected = evaluate(plan, sources).outputs
    faults = ExecutorOptions(batch_size=batch_size, random_order=True, seed=seed,
                             fault_rate=0.3, restart_rate=0.05, fence_on_restart=True,
                             check_rebuild=True, validate=True)
    got = execute(plan, sources, faults).outputs
    assert got == expected
    values = [expected[i][0] for i in range(4)]
    assert values[0].value == "#"  # no page
    assert values[1].value == "p0=0|p2=4#p0,p2"  # page 1 filtered out of both lists
    assert values[2].outcome is Outcome.SUPPRESSED  # page 4's OCR failed: a member failed
    assert values[3].value == "p0=0#p0"


def mismatched(docs: list[int]) -> tuple[list[list[int]], list[list[int]]]:
    return [[1, 2] for _ in docs], [[1] if d else [1, 2] for d in docs]


def test_aligned_lists_of_different_lengths_fail_that_parent_only() -> None:
    class P(ro.Pipeline):
        def __init__(self) -> None:
            self.make = ro.RayModule(mismatched).returns(2)
            self.sum = ro.RayModule(lambda xs, ys: [sum(x) + sum(y) for x, y in zip(xs, ys)])

        def forward(self, docs: Any) -> Any:
            xs, ys = F.expand_aligned(*self.make(docs))
            return self.sum(*F.reduce_aligned(xs, ys))

    plan = P().compile()
    out = execute(plan, [(1,), (0,)], ExecutorOptions(validate=True)).outputs
    assert out == evaluate(plan, [(1,), (0,)]).outputs
    assert out[0][0].outcome is Outcome.SUPPRESSED and "different lengths" in str(out[0][0].cause)
    assert out[1][0].value == 6


def test_expand_aligned_refuses_outputs_of_different_calls() -> None:
    class P(ro.Pipeline):
        def __init__(self) -> None:
            self.a = ro.RayModule(pages_and_meta).returns(2)
            self.b = ro.RayModule(pages_and_meta).returns(2)

        def forward(self, docs: Any) -> Any:
            x, _ = self.a(docs)
            y, _ = self.b(docs)
            return F.reduce(F.expand_aligned(x, y)[0])

    with pytest.raises(ce.ExpandError) as err:
        P().compile()
    located(err, "outputs of one Call")


def test_a_failure_raised_by_a_batched_udf_is_traced_to_its_record() -> None:
    def fn(xs: list[int]) -> list[int]:
        if 2 in xs:
            raise ro.GroupFailure("two spoils the group")
        return xs

    done = run_with_recovery(fn, ModuleOptions(), ONE, [(1,), (2,), (3,)])
    assert done.results == [(1,), ro.GroupFailure("two spoils the group"), (3,)]


def test_expanding_a_port_twice_gives_the_same_child_domain() -> None:
    class P(ro.Pipeline):
        def __init__(self) -> None:
            self.split = ro.RayModule(pages_and_meta).returns(2)
            self.a = ro.RayModule(keep_even)
            self.b = ro.RayModule(keep_even)
            self.pair = ro.RayModule(lambda xs, ys: [x and y for x, y in zip(xs, ys)])

        def forward(self, docs: Any) -> Any:
            pages, _ = self.split(docs)
            both = self.pair(self.a(F.expand(pages)), self.b(F.expand(pages)))
            return F.reduce(both)

    plan = P().compile()
    assert [d.id for d in plan.domains] == ["root", "root/0"]
    assert execute(plan, [(3,)]).outputs[0][0].value == [True, False, True]

    class Twice(ro.Pipeline):
        def __init__(self) -> None:
            self.split = ro.RayModule(pages_and_meta).returns(2)

        def forward(self, docs: Any) -> Any:
            pages, meta = self.split(docs)
            F.expand_aligned(pages, meta)
            return F.reduce(F.expand(pages))

    with pytest.raises(ce.ExpandError) as err:
        Twice().compile()
    located(err, "already belongs to another expansion")


class RaisesOn:
    """Raises on ``bad`` records; ``ro.ActorFailure`` on ``broken`` ones, the first time
    in this process (a fresh instance, as on a replaced actor, does not raise again)."""

    broke: set[int] = set()

    def __init__(self, bad: set[int], broken: set[int]) -> None:
        self.bad, self.broken = bad, broken

    def __call__(self, xs: list[int]) -> list[int]:
        for x in xs:
            if x in self.bad:
                raise ValueError(f"bad {x}")
            if x in self.broken and x not in RaisesOn.broke:
                RaisesOn.broke.add(x)
                raise ro.ActorFailure(f"device lost at {x}")
        return [x * 10 for x in xs]


class OneStage(ro.Pipeline):
    def __init__(self, bad: set[int], broken: set[int]) -> None:
        super().__init__()
        self.m = ro.RayModule(RaisesOn, bad, broken, batch_size=4, max_attempts=2)

    def forward(self, xs: Any) -> Any:
        return self.m(xs)


def test_the_in_process_executor_handles_exceptions_as_a_pool_actor_does() -> None:
    """An exception is handled in place by the recovery policy (no GrainRetried, the
    batch-mates are not failed); only ro.ActorFailure is a physical failure, retried."""
    from rayorch.core.facts import GrainRetried

    plan = OneStage({2}, set()).compile()
    result = execute(plan, [(i,) for i in range(4)], ExecutorOptions(seed=1))
    outcomes = {i: out[0] for i, out in result.outputs.items()}
    assert outcomes[2].outcome is Outcome.FAILED and outcomes[2].cause == "ValueError: bad 2"
    assert [outcomes[i].value for i in (0, 1, 3)] == [0, 10, 30]
    assert not any(isinstance(f, GrainRetried) for f in result.log)
    assert outcomes == {i: evaluate(plan, [(i,) for i in range(4)]).outputs[i][0]
                        for i in range(4)}

    broken = execute(OneStage(set(), {1}).compile(), [(i,) for i in range(4)],
                     ExecutorOptions(seed=1))
    assert [broken.outputs[i][0].value for i in range(4)] == [0, 10, 20, 30]
    retried = [f for f in broken.log if isinstance(f, GrainRetried)]
    assert retried and all("ActorFailure: device lost at 1" in f.cause for f in retried)
