"""``F.filter``: same Domain; where the boolean mask Item is False the Item becomes Dropped.

Its meaning, in one place: the trace-time check (the Port and the mask in one Domain),
the plan lint, the kernel's rule (a Failed/Suppressed value or mask suppresses the Item
at once; else it waits for both) and the reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rayorch.core import compile_errors as ce
from rayorch.core.ids import Path
from rayorch.core.items import DROPPED_ITEM, PENDING, Absent, suppressed_by
from rayorch.core.outcome import DROPPED, Outcome
from rayorch.core.plan import NodeKind, NodeSpec, Plan
from rayorch.core.primitives.base import Evaluation, KernelNode, Primitive, bad, malformed
from rayorch.core.tracer import Port, Trace, active_trace, caller_location

if TYPE_CHECKING:
    from rayorch.core.plan_tables import PlanTables
    from rayorch.core.propagation import ItemPropagation


def filter(port: Any, mask: Any) -> Port:
    """Same Domain; where the boolean ``mask`` Item is False the Item becomes Dropped."""
    return FILTER.trace(active_trace("F.filter"), port, mask)


class Filtering(KernelNode):
    """One filter node in a kernel."""

    __slots__ = ("mask", "output", "port")
    kind = NodeKind.FILTER

    def __init__(self, node: NodeSpec) -> None:
        self.port, self.mask = node.inputs
        self.output = node.outputs[0]

    def on_input(self, kernel: ItemPropagation, path: Path, value: Any) -> None:
        items = kernel._items
        output = self.output
        if (output, path) in items:
            return
        item = items.get((self.port, path), PENDING)
        flag = items.get((self.mask, path), PENDING)
        for v in (item, flag):
            if type(v) is Absent and v.outcome is not Outcome.DROPPED:
                kernel._resolve(output, path, suppressed_by(v))
                return
        if item is PENDING or flag is PENDING:
            return
        if type(flag) is Absent or type(item) is Absent or not flag:
            kernel._resolve(output, path, DROPPED_ITEM)
        else:
            kernel._resolve(output, path, item)


class Filter(Primitive):
    kind = NodeKind.FILTER

    def trace(self, trace: Trace, value: Any, mask: Any) -> Port:
        location = caller_location()
        port, mask_port = trace.own_all(
            location, (value, "the first argument of F.filter"), (mask, "the mask of F.filter"))
        if port.domain == mask_port.domain:
            return trace.add_node(self.kind, port.domain, (port, mask_port),
                                  [f"filter({port.name})"], location)[0]
        raise ce.DomainMismatchError(
            f"F.filter of {port.name!r} (in {port.domain}) with a mask in {mask_port.domain}",
            location,
            "compute the mask in the same Domain as the Port, or move one of them with "
            "F.broadcast / F.reduce",
        )

    def lint(self, plan: Plan, node: NodeSpec) -> None:
        if len(node.inputs) != 2 or any(plan.ports[p].domain != node.domain for p in node.inputs):
            raise malformed(ce.DomainMismatchError, node, f"filter node {node.id} does not "
                            f"filter a Port by a mask of its Domain {node.domain}")

    def route(self, node: NodeSpec, tables: PlanTables) -> Filtering:
        filtering = Filtering(node)
        for source in dict.fromkeys((filtering.port, filtering.mask)):
            tables.route(source, filtering.on_input)
        return filtering

    def evaluate(self, node: NodeSpec, ev: Evaluation) -> None:
        items = ev.items
        for path in ev.entities[node.domain]:
            value, mask = (items[(p, path)] for p in node.inputs)
            failed = [(p, i) for p, i in zip(node.inputs, (value, mask)) if bad(i)]
            if failed:
                out = ev.suppressed_by(failed[0][1], failed[0][0], path)
            elif not value.present or not mask.present or not mask.value:
                out = DROPPED
            else:
                out = value
            items[(node.outputs[0], path)] = out


FILTER = Filter()

__all__ = ["FILTER", "Filter", "Filtering", "filter"]
