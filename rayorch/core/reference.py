"""The oracle: a plain sequential evaluation of a Plan, with no scheduler.

Nodes are evaluated in plan (trace) order, which is topological; each node is
evaluated for every Entity of its Domain, Entities in path order. A Call runs its
UDF on a batch of one row per Entity through :mod:`rayorch.core.udf`; a primitive's
node is evaluated by its own ``evaluate`` (one module each in :mod:`rayorch.core.primitives`).
The rules are those of docs/ARCHITECTURE.md, "Semantics", written as directly as possible:

* input propagation: any input Failed/Suppressed -> Suppressed; any Dropped -> Dropped;
* expand: Present(seq) -> children 0..m-1; Dropped -> expansion dropped; else failed;
* reduce: Present(list of Present child values, ordinal order); any child Failed or
  Suppressed -> Suppressed; expansion dropped -> Dropped; failed -> Suppressed with the
  expanded input's cause (``render[3] failed: ...``), or, for a Present value that is not
  a sequence, a cause that says so;
* filter: mask False -> Dropped; broadcast: every descendant sees the ancestor's Item;
* RecordFailure -> Failed; GroupFailure -> Failed, and later siblings of that Call under
  the same parent are Suppressed (in the root Domain: that record only);
* a physical failure (any other exception) is retried up to ``max_attempts``, then Failed
  with the last cause.

The kernel must agree with it on every Present value and every outcome; a Suppressed
Item's cause names whichever failure the evaluator saw first, so causes of Suppressed
Items may differ between schedules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rayorch.core.ids import ROOT, CallId, DomainId, Path, format_grain
from rayorch.core.outcome import DROPPED, GroupFailure, Item, Outcome, RecordFailure, present
from rayorch.core.plan import NodeKind, NodeSpec, Plan
from rayorch.core.primitives import primitive
from rayorch.core.primitives.base import Evaluation, bad, suppressed
from rayorch.core.udf import UdfError, instantiate, invoke_batch


@dataclass
class ReferenceResult:
    """What a sequential evaluation produced."""

    outputs: dict[int, tuple[Item, ...]]  # source index -> one Item per plan output
    expansions: dict[tuple[DomainId, Path], tuple[str, int]] = field(default_factory=dict)
    barriers: set[tuple[CallId, Path]] = field(default_factory=set)
    items: dict[tuple[int, Path], Item] = field(default_factory=dict)


def evaluate(
    plan: Plan, sources: Sequence[tuple[Any, ...]], first_index: int = 0
) -> ReferenceResult:
    """Evaluate ``plan`` on ``sources`` (one tuple of forward arguments each)."""
    result = ReferenceResult(outputs={})
    ev = Evaluation(plan, result.items,
                    {ROOT: [(first_index + i,) for i in range(len(sources))]}, result.expansions)
    items, entities = result.items, ev.entities
    functions: dict[str, Callable[..., Any]] = {}
    for node in plan.nodes:
        kind = node.kind
        if kind == NodeKind.INPUT:
            for path in entities[ROOT]:
                value = sources[path[0] - first_index][node.arg_index]
                items[(node.outputs[0], path)] = present(value)
        elif kind == NodeKind.CALL:
            if node.call is not None and node.call.module not in functions:
                functions[node.call.module] = instantiate(plan.module(node.call.module))
            _evaluate_call(plan, node, entities[node.domain], items, ev.origin, functions, result)
        elif kind != NodeKind.OUTPUT:
            primitive(kind).evaluate(node, ev)  # its rule: rayorch.core.primitives
    for path in entities[ROOT]:
        result.outputs[path[0]] = tuple(items[(port, path)] for port in plan.output_ports)
    return result


def _evaluate_call(
    plan: Plan,
    node: NodeSpec,
    paths: list[Path],
    items: dict[tuple[int, Path], Item],
    origin: dict[tuple[int, Path], str],
    functions: dict[str, Callable[..., Any]],
    result: ReferenceResult,
) -> None:
    call = node.call
    assert call is not None
    options = plan.module(call.module).options
    fn = functions[call.module]
    for path in paths:
        inputs = [items[(p, path)] for p in node.inputs]
        failed = [(p, i) for p, i in zip(node.inputs, inputs) if bad(i)]
        barrier = len(path) > 1 and (call.id, path[:-1]) in result.barriers
        grain = format_grain((call.id, path))
        if failed:
            port, item = failed[0]
            outs = [suppressed(item, origin.get((port, path), "an input"))] * len(node.outputs)
        elif any(i.outcome is Outcome.DROPPED for i in inputs):
            outs = [DROPPED] * len(node.outputs)
        elif barrier:
            outs = [Item(Outcome.SUPPRESSED, None, "GroupFailure")] * len(node.outputs)
        else:
            row = tuple(i.value for i in inputs)
            outs = _run_record(fn, options.max_attempts, options, call, row)
            if outs and isinstance(outs[0], GroupFailure) and len(path) > 1:
                result.barriers.add((call.id, path[:-1]))
            outs = [
                Item(Outcome.FAILED, None, o.cause) if isinstance(o, RecordFailure) else o
                for o in outs
            ]
            for port, out in zip(node.outputs, outs):
                if out.outcome is Outcome.FAILED:
                    origin[(port, path)] = grain
        for port, out in zip(node.outputs, outs):
            items[(port, path)] = out


def _run_record(
    fn: Callable[..., Any], attempts: int, options: Any, call: Any, row: tuple[Any, ...]
) -> list[Any]:
    """One record, as a batch of one, retried on physical failures."""
    cause = ""
    for _ in range(attempts):
        try:
            (out,) = invoke_batch(fn, options, call, [row])
        except UdfError as error:
            cause = error.cause
            continue
        if isinstance(out, RecordFailure):
            return [out] * call.num_outputs
        return [present(v) for v in out]
    return [Item(Outcome.FAILED, None, cause)] * call.num_outputs


__all__ = ["ReferenceResult", "evaluate"]
