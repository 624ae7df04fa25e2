"""The UDF invocation ABI (rayorch.core.udf)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

import rayorch as ro
from rayorch.core.plan import CallSpec, ModuleOptions, ModuleSpec
from rayorch.core.udf import UdfError, expansion_elements, instantiate, invoke_batch

BATCHED = ModuleOptions()
PER_RECORD = ModuleOptions(batched=False)
ONE = CallSpec("m", "m")


class Scale:
    built = 0

    def __init__(self, factor: int, offset: int = 0) -> None:
        Scale.built += 1
        self.factor, self.offset = factor, offset

    def __call__(self, xs: list[int], ys: list[int], plus: int = 0) -> list[int]:
        return [x * self.factor + y + self.offset + plus for x, y in zip(xs, ys)]


def add(x: int, y: int, bias: int = 0) -> int:
    return x + y + bias


def test_a_class_is_built_once_with_args_and_kwargs_and_called_per_batch() -> None:
    Scale.built = 0
    fn = instantiate(ModuleSpec("m", Scale, args=(10,), kwargs=(("offset", 1),)))
    call = CallSpec("m", "m", static_kwargs=(("plus", 100),))
    assert invoke_batch(fn, BATCHED, call, [(1, 2), (3, 4)]) == [(113,), (135,)]
    assert invoke_batch(fn, BATCHED, call, [(0, 0)]) == [(101,)]
    assert Scale.built == 1


def test_a_function_gets_module_kwargs_bound_and_runs_per_record() -> None:
    fn = instantiate(ModuleSpec("m", add, kwargs=(("bias", 5),)))
    assert invoke_batch(fn, PER_RECORD, ONE, [(1, 2), (3, 4)]) == [(8,), (12,)]


def test_failures_returned_by_a_batch_or_raised_per_record_stay_per_record() -> None:
    def batch(xs: list[int]) -> list[Any]:
        return [ro.RecordFailure("odd") if x % 2 else x for x in xs]

    def single(x: int) -> int:
        if x == 3:
            raise ro.GroupFailure("three")
        return x

    assert invoke_batch(batch, BATCHED, ONE, [(1,), (2,)]) == [ro.RecordFailure("odd"), (2,)]
    out = invoke_batch(single, PER_RECORD, ONE, [(3,), (4,)])
    assert out == [ro.GroupFailure("three"), (4,)] and isinstance(out[0], ro.GroupFailure)


def test_several_outputs_per_record() -> None:
    call = CallSpec("m", "m", num_outputs=2)
    assert invoke_batch(lambda xs: [(x, -x) for x in xs], BATCHED, call, [(1,), (2,)]) == [
        (1, -1), (2, -2)]


@pytest.mark.parametrize(
    ("fn", "options", "call", "cause"),
    [
        (lambda xs: 1 / 0, BATCHED, ONE, "ZeroDivisionError: division by zero"),
        (lambda x: int("x"), PER_RECORD, ONE, "ValueError: invalid literal"),
        (lambda xs: xs[:1], BATCHED, ONE, "BatchError: m returned 1 results for a batch of 2"),
        (lambda xs: 5, BATCHED, ONE, "BatchError: m returned a int"),
        (lambda xs: [(1, 2, 3)] * 2, BATCHED, CallSpec("m", "m", num_outputs=2), "ArityError"),
    ],
)
def test_anything_else_is_a_physical_failure_of_the_batch(
    fn: Any, options: ModuleOptions, call: CallSpec, cause: str
) -> None:
    with pytest.raises(UdfError) as err:
        invoke_batch(fn, options, call, [(1,), (2,)])
    assert str(err.value).startswith(cause) and "\n" not in str(err.value)
    again = pickle.loads(pickle.dumps(err.value))
    assert isinstance(again, UdfError) and again.cause == err.value.cause
    assert isinstance(err.value, ro.RayorchError)


def test_what_expand_accepts_as_a_sequence() -> None:
    assert expansion_elements([1, 2]) == [1, 2]
    assert expansion_elements((1, 2)) == [1, 2]
    assert expansion_elements(range(3)) == [0, 1, 2]
    assert expansion_elements([]) == []
    for bad in ("ab", b"ab", {"a": 1}, 5, None):
        assert expansion_elements(bad) is None
