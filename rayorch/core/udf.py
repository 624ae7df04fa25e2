"""The UDF invocation ABI shared by the executor, the reference interpreter and the workers.

* :func:`instantiate` turns a :class:`ModuleSpec` into a callable: a class target is
  built once with ``module.args``/``module.kwargs``; a function target gets
  ``module.kwargs`` bound as keyword arguments.
* :func:`invoke_batch` runs that callable on a batch of rows (one tuple of input values
  per Grain) and returns, per row, a tuple of ``num_outputs`` values or the
  :class:`RecordFailure`/:class:`GroupFailure` the UDF gave for that record.
* Anything else that goes wrong (an exception, a wrong number of results, a wrong
  arity) is a *physical* failure of the whole batch: :class:`UdfError`.
* :func:`expansion_elements` says how ``F.expand`` reads a value as a sequence.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.core.facts import (
    REPORT_GROUP_FAILURE,
    REPORT_PRESENT,
    REPORT_RECORD_FAILURE,
    GrainCommitted,
    storable_problem,
)
from rayorch.core.ids import CallId, Path
from rayorch.core.outcome import GroupFailure, RecordFailure
from rayorch.core.plan import CallSpec, ModuleOptions, ModuleSpec
from rayorch.core.sanitize import strip_ansi

Row = tuple[Any, ...]
RowResult = tuple[Any, ...] | RecordFailure

_CAUSE_LIMIT = 500


class UdfError(RayorchError):
    """A physical failure of a whole batch: the UDF raised or returned a malformed result.

    ``str(error)`` (and ``error.cause``) is a one-line cause such as ``"ValueError: boom"``.
    The batch's Grains are retried with a new generation, up to ``max_attempts``.
    """

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause

    def __str__(self) -> str:
        return self.cause


def one_line_cause(exc: BaseException) -> str:
    """``"ValueError: boom"``: the exception's type and the first line of its message."""
    text = strip_ansi(str(exc)).strip().splitlines()
    first = text[0] if text else ""
    cause = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return cause if len(cause) <= _CAUSE_LIMIT else cause[: _CAUSE_LIMIT - 3] + "..."


def instantiate(module: ModuleSpec) -> Callable[..., Any]:
    """Build the callable for one actor (or one interpreter) from a module spec."""
    target = module.target
    if target is None:
        raise UdfError(
            f"module {module.name!r} has no code (the plan was rebuilt from a description); "
            "compile the pipeline from its Python class to run it"
        )
    kwargs = dict(module.kwargs)
    if inspect.isclass(target):
        instance = target(*module.args, **kwargs)
        if not callable(instance):
            raise UdfError(
                f"module {module.name!r}: an instance of {target.__name__} is not callable; "
                "define __call__(self, ...) on the class"
            )
        return instance
    if module.args:
        return functools.partial(target, *module.args, **kwargs)
    return functools.partial(target, **kwargs) if kwargs else target


def _normalize(out: Any, num_outputs: int, position: int) -> RowResult:
    if isinstance(out, RecordFailure):
        return out
    if num_outputs == 1:
        return (out,)
    if not isinstance(out, (tuple, list)) or len(out) != num_outputs:
        got = f"{len(out)} values" if isinstance(out, (tuple, list)) else type(out).__name__
        raise UdfError(
            f"ArityError: record {position} returned {got}, but the Call has "
            f"num_outputs={num_outputs}; return a tuple of {num_outputs} values per record"
        )
    return tuple(out)


def invoke_batch(
    fn: Callable[..., Any], options: ModuleOptions, call: CallSpec, rows: Sequence[Row]
) -> list[RowResult]:
    """Run ``fn`` on ``rows``; one result per row, or raise :class:`UdfError` for the batch."""
    static: Mapping[str, Any] = dict(call.static_kwargs)
    num_outputs = call.num_outputs
    if not rows:
        return []
    if not options.batched:
        results: list[RowResult] = []
        for position, row in enumerate(rows):
            try:
                out = fn(*row, **static)
            except RecordFailure as failure:
                out = failure
            except Exception as exc:
                raise UdfError(one_line_cause(exc)) from exc
            results.append(_normalize(out, num_outputs, position))
        return results
    columns = [list(column) for column in zip(*rows)]
    try:
        outs = fn(*columns, **static)
    except Exception as exc:
        raise UdfError(one_line_cause(exc)) from exc
    if not isinstance(outs, Sequence) or isinstance(outs, (str, bytes)):
        try:
            if isinstance(outs, (str, bytes)):
                raise TypeError
            outs = list(outs)
        except TypeError:
            raise UdfError(
                f"BatchError: {call.id} returned a {type(outs).__name__}, expected a sequence "
                f"of {len(rows)} results (one per record of the batch)"
            ) from None
    if len(outs) != len(rows):
        raise UdfError(
            f"BatchError: {call.id} returned {len(outs)} results for a batch of {len(rows)}; "
            "a batched module must return one result per input record"
        )
    return [_normalize(out, num_outputs, position) for position, out in enumerate(outs)]


def expansion_elements(value: Any) -> list[Any] | None:
    """The children ``F.expand`` makes of ``value``, or None if it is not a sequence.

    Lists, tuples, ranges, numpy arrays and other iterables qualify; ``str``,
    ``bytes`` and mappings do not (expanding them is almost always a bug).
    """
    if isinstance(value, (str, bytes, bytearray, Mapping)):
        return None
    if isinstance(value, list):
        return value
    try:
        return list(value)
    except TypeError:
        return None


UNSTORABLE = "UnstorableValue"


def _clean_cause(cause: Any) -> str:
    """A failure's cause as stored: text, without ANSI colour codes."""
    return strip_ansi(cause if isinstance(cause, str) else str(cause))


def _unstorable_output(call: CallId, outputs: tuple[Any, ...]) -> str | None:
    """The one-line cause when an output cannot be stored faithfully, else None.

    Checked in the actor, before any commit, so such a value is a per-record failure on
    every store instead of a crash of the commit (docs/ARCHITECTURE.md, "Trust model").
    """
    if storable_problem(outputs) is None:
        return None
    for index, value in enumerate(outputs):
        problem = storable_problem(value)
        if problem is not None:
            field = call if len(outputs) == 1 else f"{call}.{index}"
            cause = (f"{UNSTORABLE}: output {field!r} is a {type(value).__name__} that the "
                     f"lineage store cannot keep faithfully ({problem})")
            return cause if len(cause) <= _CAUSE_LIMIT else cause[: _CAUSE_LIMIT - 3] + "..."
    return f"{UNSTORABLE}: the outputs of {call!r} cannot be stored"


def reports_for(
    call: CallId, tags: Sequence[tuple[Path, int]], results: Sequence[RowResult], ts: float = 0.0
) -> list[GrainCommitted]:
    """One ``GrainCommitted`` per ``(path, generation)`` tag, from ``invoke_batch`` results."""
    reports = []
    for (path, generation), result in zip(tags, results, strict=True):
        if isinstance(result, GroupFailure):
            report = GrainCommitted(call, path, generation, REPORT_GROUP_FAILURE, None,
                                    _clean_cause(result.cause), ts=ts)
        elif isinstance(result, RecordFailure):
            report = GrainCommitted(call, path, generation, REPORT_RECORD_FAILURE, None,
                                    _clean_cause(result.cause), ts=ts)
        else:
            problem = _unstorable_output(call, result)
            if problem is None:
                report = GrainCommitted(call, path, generation, REPORT_PRESENT, result, ts=ts)
            else:
                report = GrainCommitted(call, path, generation, REPORT_RECORD_FAILURE, None,
                                        problem, ts=ts)
        reports.append(report)
    return reports


__all__ = [
    "Row",
    "RowResult",
    "reports_for",
    "UdfError",
    "expansion_elements",
    "instantiate",
    "invoke_batch",
    "one_line_cause",
]
