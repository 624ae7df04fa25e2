"""The UDF invocation ABI shared by the executor, the reference interpreter and the workers.

* :func:`instantiate` turns a :class:`ModuleSpec` into a callable: a class target is
  built once with ``module.args``/``module.kwargs``; a function target gets
  ``module.kwargs`` bound as keyword arguments. An ``async def`` entry point is run on
  one event loop of its own (:class:`ModuleLoop`), so the callable is plain and may be
  called from several threads at once: their coroutines share that loop.
* :func:`invoke_batch` runs that callable on a batch of rows (one tuple of input values
  per Grain) and returns, per row, a tuple of ``num_outputs`` values or the
  :class:`RecordFailure`/:class:`GroupFailure` the UDF gave for that record.
* Anything else that goes wrong (an exception, a wrong number of results, a wrong
  arity) is a *physical* failure of the whole batch: :class:`UdfError`.
* :func:`run_with_recovery` is what a pool actor runs: ``invoke_batch`` plus the
  module's recovery policy for exceptions (:mod:`rayorch.core.recovery`), so that an
  exception never leaves the living actor; only :class:`ActorFailure` does.
* :func:`expansion_elements` says how ``F.expand`` reads a value as a sequence.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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
from rayorch.core.json_values import json_problem
from rayorch.core.outcome import ActorFailure, GroupFailure, RecordFailure
from rayorch.core.plan import CallSpec, ModuleOptions, ModuleSpec
from rayorch.core.recovery import DEFAULT_RECOVERY, RecoveryMode
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


def is_async_target(target: Any) -> bool:
    """Whether a module's entry point (``run``, else ``__call__``, or the function) is a
    coroutine function."""
    if inspect.isclass(target):
        run = getattr(target, "run", None)
        entry = run if callable(run) else inspect.getattr_static(target, "__call__", None)
        return inspect.iscoroutinefunction(entry)
    return inspect.iscoroutinefunction(target)


class ModuleLoop:
    """One asyncio event loop on a daemon thread, for one async module instance.

    The instance is built on the loop (an engine's constructor finds it running) and every
    call of its entry point is a coroutine scheduled there, whichever thread calls: the
    batches a pool actor runs at once (``max_inflight``) share the loop, and so one engine.
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name=f"rayorch-loop-{name}",
                         daemon=True).start()

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the loop (awaited when it returns an awaitable)."""
        async def call() -> Any:
            out = fn(*args, **kwargs)
            return await out if inspect.isawaitable(out) else out

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result()


def instantiate(module: ModuleSpec) -> Callable[..., Any]:
    """Build the callable for one actor (or one interpreter) from a module spec."""
    target = module.target
    if target is None:
        raise UdfError(
            f"module {module.name!r} has no code (the plan was rebuilt from a description); "
            "compile the pipeline from its Python class to run it"
        )
    if is_async_target(target):
        loop = ModuleLoop(module.name)
        entry = loop.run(_build, module)
        return functools.partial(loop.run, entry)
    return _build(module)


def _build(module: ModuleSpec) -> Callable[..., Any]:
    target = module.target
    kwargs = dict(module.kwargs)
    if inspect.isclass(target):
        instance = target(*module.args, **kwargs)
        run = getattr(instance, "run", None)
        if callable(run):  # upstream RayOrch's entry point, preferred as upstream does
            return run  # type: ignore[no-any-return]
        if not callable(instance):
            raise UdfError(
                f"module {module.name!r}: an instance of {target.__name__} is not callable; "
                "define run(self, batch) or __call__(self, batch) on the class"
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
            f"num_outputs={num_outputs}; return a tuple of {num_outputs} values per record "
            "(or declare output_layout='columns' to return one list per output)"
        )
    return tuple(out)


def _as_results(call: CallSpec, outs: Any, size: int) -> list[Any]:
    """``outs`` as a list of ``size`` results, or a BatchError."""
    if not isinstance(outs, Sequence) or isinstance(outs, (str, bytes)):
        try:
            if isinstance(outs, (str, bytes)):
                raise TypeError
            outs = list(outs)
        except TypeError:
            raise UdfError(
                f"BatchError: {call.id} returned a {type(outs).__name__}, expected a sequence "
                f"of {size} results (one per record of the batch)"
            ) from None
    if len(outs) != size:
        hint = ""
        if len(outs) == call.num_outputs > 1 and size != call.num_outputs:
            hint = (f" (it returned {call.num_outputs} values: one list per output? then "
                    "declare output_layout='columns', or build the module with .returns(n))")
        raise UdfError(
            f"BatchError: {call.id} returned {len(outs)} results for a batch of {size}; "
            f"a batched module must return one result per input record{hint}"
        )
    return list(outs)


def _from_columns(call: CallSpec, outs: Any, size: int) -> list[RowResult]:
    """Upstream's layout: one list per output; a failure in any output fails the record."""
    columns = _as_results(call, outs, call.num_outputs) if call.num_outputs > 1 else [outs]
    columns = [_as_results(call, column, size) for column in columns]
    rows: list[RowResult] = []
    for values in zip(*columns):
        failures = [v for v in values if isinstance(v, RecordFailure)]
        group = [v for v in failures if isinstance(v, GroupFailure)]
        rows.append(group[0] if group else failures[0] if failures else tuple(values))
    return rows


def invoke_batch(
    fn: Callable[..., Any], options: ModuleOptions, call: CallSpec, rows: Sequence[Row]
) -> list[RowResult]:
    """Run ``fn`` on ``rows``; one result per row, or raise :class:`UdfError` for the batch.

    The last ``len(call.keywords)`` inputs are passed by keyword (data inputs given as
    keywords at the call site), after the positional ones. :class:`ActorFailure`
    propagates as it is (the actor must be replaced).
    """
    static: Mapping[str, Any] = dict(call.static_kwargs)
    num_outputs = call.num_outputs
    keywords = call.keywords
    positional = len(rows[0]) - len(keywords) if rows else 0
    if not rows:
        return []
    if not options.batched:
        results: list[RowResult] = []
        for position, row in enumerate(rows):
            kw = dict(zip(keywords, row[positional:]))
            try:
                out = fn(*row[:positional], **kw, **static)
            except RecordFailure as failure:
                out = failure
            except ActorFailure:
                raise
            except Exception as exc:
                raise UdfError(one_line_cause(exc)) from exc
            results.append(_normalize(out, num_outputs, position))
        return results
    columns = [list(column) for column in zip(*rows)]
    kw = dict(zip(keywords, columns[positional:]))
    try:
        outs = fn(*columns[:positional], **kw, **static)
    except ActorFailure:
        raise
    except RecordFailure as failure:
        if len(rows) == 1:  # raised for a batch of one: it is that record's failure
            return [failure]
        raise UdfError(one_line_cause(failure)) from failure  # isolation will tell whose
    except Exception as exc:
        raise UdfError(one_line_cause(exc)) from exc
    if options.output_layout == "columns":
        return _from_columns(call, outs, len(rows))
    return [_normalize(out, num_outputs, position)
            for position, out in enumerate(_as_results(call, outs, len(rows)))]


@dataclass(slots=True)
class RecoveredBatch:
    """What :func:`run_with_recovery` made of one batch."""

    results: list[RowResult]
    exceptions: int = 0  # how many runs of the user code raised (each handled in place)
    runs: int = 1  # how many times the user code was called
    causes: list[str] = field(default_factory=list)


def run_with_recovery(
    fn: Callable[..., Any], options: ModuleOptions, call: CallSpec, rows: Sequence[Row]
) -> RecoveredBatch:
    """Run a batch, recovering from exceptions in place (docs/ARCHITECTURE.md).

    Every record ends with a result: its value(s), its own RecordFailure/GroupFailure,
    or a RecordFailure carrying the exception it raised *alone* (after the policy's
    retries). Batch-mates of a raising record are never failed for it. Only
    :class:`ActorFailure` escapes (the actor is to be replaced).
    """
    policy = options.recovery or DEFAULT_RECOVERY
    done = RecoveredBatch([], 0, 0)
    if not options.batched and len(rows) > 1:
        for row in rows:  # a per-record UDF: every record is its own batch
            one = run_with_recovery(fn, options, call, [row])
            done.results.extend(one.results)
            done.exceptions += one.exceptions
            done.runs += one.runs
            done.causes.extend(one.causes)
        return done
    results: list[RowResult | None] = [None] * len(rows)
    cause_of: dict[int, str] = {}

    def attempt(indices: Sequence[int]) -> bool:
        done.runs += 1
        try:
            outs = invoke_batch(fn, options, call, [rows[i] for i in indices])
        except UdfError as exc:
            done.exceptions += 1
            done.causes.append(exc.cause)
            for i in indices:
                cause_of[i] = exc.cause
            return False
        for i, out in zip(indices, outs, strict=True):
            results[i] = out
        return True

    everything = list(range(len(rows)))
    if attempt(everything):
        return _finished(done, results, cause_of)
    mode = policy.mode
    if mode is RecoveryMode.RETRY_BATCH:
        for _ in range(policy.max_retries or 0):
            if attempt(everything):
                return _finished(done, results, cause_of)
    if len(rows) == 1 and mode is not RecoveryMode.ISOLATE_TAIL:
        tail = everything if mode is RecoveryMode.ABORT or mode is RecoveryMode.RETRY_BATCH \
            else _retry_alone(attempt, everything, policy.max_retries or 0)
        return _finished(done, results, cause_of, tail)
    if mode is RecoveryMode.ISOLATE_TAIL:
        # The batch run counts as the first attempt; alone, a record gets the rest
        # (at least one run alone, so that its batch-mates' innocence is established).
        runs_alone = max(1, options.max_attempts - 1) if len(rows) > 1 else \
            options.max_attempts - 1
        tail = [i for i in everything if not _alone(attempt, i, runs_alone)]
        return _finished(done, results, cause_of, tail)
    tail = [i for i in everything if not attempt([i])]  # the isolation pass
    if mode is RecoveryMode.RETRY_TAIL:
        tail = _retry_alone(attempt, tail, policy.max_retries or 0)
    return _finished(done, results, cause_of, tail)


def _alone(attempt: Callable[[Sequence[int]], bool], index: int, runs: int) -> bool:
    return any(attempt([index]) for _ in range(runs))


def _retry_alone(attempt: Callable[[Sequence[int]], bool], tail: list[int],
                 retries: int) -> list[int]:
    """The records still raising after ``retries`` deferred rounds (each round: every
    record of the tail once, alone)."""
    for _ in range(retries):
        if not tail:
            break
        tail = [i for i in tail if not attempt([i])]
    return tail


def _finished(done: RecoveredBatch, results: list[RowResult | None], cause_of: dict[int, str],
              raised: Sequence[int] = ()) -> RecoveredBatch:
    """Records in ``raised`` are Failed with the last exception they raised."""
    for i in raised:
        results[i] = RecordFailure(cause_of[i])
    assert all(r is not None for r in results)
    done.results = results  # type: ignore[assignment]
    return done


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


def _cause_text(cause: Any) -> str:
    """A failure's cause as text (upstream lets a cause be any object; facts store text)."""
    if isinstance(cause, str):
        return cause
    try:
        return str(cause)
    except Exception:  # a faulty __str__ must not hide the failure
        return type(cause).__name__


UNSTORABLE = "UnstorableValue"


def _clean_cause(cause: Any) -> str:
    """A failure's cause as stored: text, without ANSI colour codes."""
    return strip_ansi(_cause_text(cause))


def _unstorable_output(call: CallId, outputs: tuple[Any, ...], json_rule: bool) -> str | None:
    """The one-line cause when an output cannot be stored faithfully, else None.

    Checked in the actor, before any commit, so such a value is a per-record failure on
    every store instead of a crash of the commit (docs/ARCHITECTURE.md, "Trust model").
    With ``json_rule`` (a durable store, whose runs a file sink may write) an output JSON
    cannot hold fails too, by the sinks' own rule (:mod:`rayorch.core.json_values`).
    """
    if storable_problem(outputs) is None and not (json_rule and json_problem(outputs)):
        return None
    for index, value in enumerate(outputs):
        field = call if len(outputs) == 1 else f"{call}.{index}"
        problem = storable_problem(value)
        if problem is not None:
            cause = (f"{UNSTORABLE}: output {field!r} is a {type(value).__name__} that the "
                     f"lineage store cannot keep faithfully ({problem})")
        elif json_rule and (problem := json_problem(value)) is not None:
            cause = f"{UNSTORABLE}: output {field!r} {problem} (file sinks write JSON)"
        else:
            continue
        return cause if len(cause) <= _CAUSE_LIMIT else cause[: _CAUSE_LIMIT - 3] + "..."
    return f"{UNSTORABLE}: the outputs of {call!r} cannot be stored"


def reports_for(
    call: CallId, tags: Sequence[tuple[Path, int]], results: Sequence[RowResult], ts: float = 0.0,
    *, json_rule: bool = False,
) -> list[GrainCommitted]:
    """One ``GrainCommitted`` per ``(path, generation)`` tag, from ``invoke_batch`` results.

    ``json_rule``: outputs a file sink could not write fail their records (durable stores).
    """
    reports = []
    for (path, generation), result in zip(tags, results, strict=True):
        if isinstance(result, GroupFailure):
            report = GrainCommitted(call, path, generation, REPORT_GROUP_FAILURE, None,
                                    _clean_cause(result.cause), ts=ts)
        elif isinstance(result, RecordFailure):
            report = GrainCommitted(call, path, generation, REPORT_RECORD_FAILURE, None,
                                    _clean_cause(result.cause), ts=ts)
        else:
            problem = _unstorable_output(call, result, json_rule)
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
    "RecoveredBatch",
    "reports_for",
    "run_with_recovery",
    "UdfError",
    "expansion_elements",
    "ModuleLoop",
    "instantiate",
    "invoke_batch",
    "is_async_target",
    "one_line_cause",
]
