"""The oracle: a plain sequential evaluation of a Plan, with no scheduler.

Nodes are evaluated in plan (trace) order, which is topological; each node is
evaluated for every Entity of its Domain, Entities in path order. A Call runs its
UDF on a batch of one row per Entity through :mod:`rayorch.core.udf`. The rules are
those of docs/ARCHITECTURE.md, "Semantics", written as directly as possible:

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

from rayorch.core.ids import ROOT, CallId, DomainId, Path, format_grain, format_path
from rayorch.core.outcome import DROPPED, GroupFailure, Item, Outcome, RecordFailure, present
from rayorch.core.plan import NodeKind, NodeSpec, Plan
from rayorch.core.udf import UdfError, expansion_elements, instantiate, invoke_batch
from rayorch.core.vocabulary import EXPANSION_DROPPED, EXPANSION_FAILED, EXPANSION_SUCCEEDED


@dataclass
class ReferenceResult:
    """What a sequential evaluation produced."""

    outputs: dict[int, tuple[Item, ...]]  # source index -> one Item per plan output
    expansions: dict[tuple[DomainId, Path], tuple[str, int]] = field(default_factory=dict)
    barriers: set[tuple[CallId, Path]] = field(default_factory=set)
    items: dict[tuple[int, Path], Item] = field(default_factory=dict)


def _bad(item: Item) -> bool:
    return item.outcome is Outcome.FAILED or item.outcome is Outcome.SUPPRESSED


def _suppressed(cause_item: Item, origin: str) -> Item:
    if cause_item.outcome is Outcome.SUPPRESSED:
        return cause_item
    return Item(Outcome.SUPPRESSED, None, f"{origin} failed: {cause_item.cause}")


def _not_a_sequence(domain: DomainId, path: Path, value: Any) -> Item:
    return Item(
        Outcome.SUPPRESSED, None,
        f"F.expand into {domain} at {format_path(path)}: the value is a {type(value).__name__}, "
        "not a sequence; the expanded module must return a list per record",
    )


def evaluate(
    plan: Plan, sources: Sequence[tuple[Any, ...]], first_index: int = 0
) -> ReferenceResult:
    """Evaluate ``plan`` on ``sources`` (one tuple of forward arguments each)."""
    result = ReferenceResult(outputs={})
    items = result.items
    entities: dict[DomainId, list[Path]] = {ROOT: [(first_index + i,) for i in range(len(sources))]}
    origin: dict[tuple[int, Path], str] = {}  # which Grain a Failed Item came from
    failed_expansions: dict[tuple[DomainId, Path], Item] = {}  # what their reduces give
    functions: dict[str, Callable[..., Any]] = {}

    def cause_of(port: int, path: Path) -> str:
        return origin.get((port, path), "an input")

    for node in plan.nodes:
        kind = node.kind
        if kind is NodeKind.INPUT:
            for path in entities[ROOT]:
                value = sources[path[0] - first_index][node.arg_index]
                items[(node.outputs[0], path)] = present(value)
        elif kind is NodeKind.CALL:
            if node.call is not None and node.call.module not in functions:
                functions[node.call.module] = instantiate(plan.module(node.call.module))
            _evaluate_call(plan, node, entities[node.domain], items, origin, functions, result)
        elif kind is NodeKind.EXPAND:
            parent_domain = plan.domain(node.domain).parent
            assert parent_domain is not None
            children: list[Path] = []
            for path in entities[parent_domain]:
                aligned = [items[(port, path)] for port in node.inputs]
                item = next((i for i in aligned if not i.present), aligned[0])
                columns = [expansion_elements(i.value) if i.present else None for i in aligned]
                lengths = {len(c) for c in columns if c is not None}
                if item.outcome is Outcome.DROPPED:
                    result.expansions[(node.domain, path)] = (EXPANSION_DROPPED, 0)
                elif any(c is None for c in columns) or len(lengths) > 1:
                    result.expansions[(node.domain, path)] = (EXPANSION_FAILED, 0)
                    bad_value = next((i.value for i, c in zip(aligned, columns) if c is None),
                                     None)
                    failed_expansions[(node.domain, path)] = (
                        _suppressed(item, cause_of(node.inputs[0], path)) if _bad(item)
                        else _not_a_sequence(node.domain, path, bad_value)
                        if any(c is None for c in columns)
                        else Item(Outcome.SUPPRESSED, None,
                                  f"F.expand into {node.domain} at {format_path(path)}: the "
                                  "aligned lists have different lengths "
                                  f"{[len(c) for c in columns if c is not None]}")
                    )
                else:
                    count = lengths.pop()
                    result.expansions[(node.domain, path)] = (EXPANSION_SUCCEEDED, count)
                    for ordinal in range(count):
                        children.append((*path, ordinal))
                        for port, column in zip(node.outputs, columns):
                            assert column is not None
                            items[(port, (*path, ordinal))] = present(column[ordinal])
            entities[node.domain] = children
        elif kind is NodeKind.REDUCE:
            assert node.source_domain is not None
            for path in entities[node.domain]:
                state, count = result.expansions[(node.source_domain, path)]
                values = [items[(node.inputs[0], (*path, i))] for i in range(count)]
                if len(node.inputs) > 1:  # members=: the membership decides who is kept
                    members = [items[(node.inputs[1], (*path, i))] for i in range(count)]
                    failed = [(i, m, node.inputs[1]) for i, m in enumerate(members) if _bad(m)]
                    failed += [(i, v, node.inputs[0]) for i, (m, v) in
                               enumerate(zip(members, values)) if m.present and not v.present]
                    kept = [v for m, v in zip(members, values) if m.present]
                else:
                    failed = [(i, v, node.inputs[0]) for i, v in enumerate(values) if _bad(v)]
                    kept = [v for v in values if v.present]
                if state == EXPANSION_DROPPED:
                    out = DROPPED
                elif state == EXPANSION_FAILED:
                    out = failed_expansions[(node.source_domain, path)]
                elif failed:
                    i, member, port = min(failed, key=lambda f: f[0])
                    out = _suppressed(member, cause_of(port, (*path, i))) if _bad(member) else \
                        Item(Outcome.SUPPRESSED, None, "a member's value was Dropped")
                else:
                    out = present([v.value for v in kept])
                items[(node.outputs[0], path)] = out
        elif kind is NodeKind.FILTER:
            for path in entities[node.domain]:
                value, mask = (items[(p, path)] for p in node.inputs)
                bad = [(p, i) for p, i in zip(node.inputs, (value, mask)) if _bad(i)]
                if bad:
                    out = _suppressed(bad[0][1], cause_of(bad[0][0], path))
                elif not value.present or not mask.present or not mask.value:
                    out = DROPPED
                else:
                    out = value
                items[(node.outputs[0], path)] = out
        elif kind is NodeKind.BROADCAST:
            source = node.inputs[0]
            depth = plan.domain(plan.ports[source].domain).depth
            for path in entities[node.domain]:
                item = items[(source, path[: depth + 1])]
                out = _suppressed(item, cause_of(source, path[: depth + 1])) if _bad(item) else item
                items[(node.outputs[0], path)] = out
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
        bad = [(p, i) for p, i in zip(node.inputs, inputs) if _bad(i)]
        barrier = len(path) > 1 and (call.id, path[:-1]) in result.barriers
        grain = format_grain((call.id, path))
        if bad:
            port, item = bad[0]
            outs = [_suppressed(item, origin.get((port, path), "an input"))] * len(node.outputs)
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
