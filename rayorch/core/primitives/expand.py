"""``F.expand`` / ``F.expand_aligned``: each Item, a sequence, becomes the ordered children
of its Entity in a new child Domain (one Expansion per parent).

Its meaning, in one place: the trace-time checks (only outputs of one Call, each Port
expanded once), the plan lint, the kernel's Expansion (close it, create the children,
tell the consumers of the child Domain: reduces, broadcasts) and the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rayorch.core import compile_errors as ce
from rayorch.core.ids import Path, format_path
from rayorch.core.items import DROPPED_ITEM, DROPPED_X, FAILED_X, PENDING, Absent, suppressed_by
from rayorch.core.outcome import Item, Outcome, present
from rayorch.core.plan import NodeKind, NodeSpec, Plan
from rayorch.core.primitives.base import Evaluation, KernelNode, Primitive, bad, malformed
from rayorch.core.tracer import Port, Trace, active_trace, caller_location
from rayorch.core.udf import expansion_elements
from rayorch.core.vocabulary import EXPANSION_DROPPED, EXPANSION_FAILED, EXPANSION_SUCCEEDED

if TYPE_CHECKING:
    from rayorch.core.plan_tables import PlanTables
    from rayorch.core.propagation import ItemPropagation

Closed = Callable[["ItemPropagation", Path, int, "Absent | None"], None]
"""``closed(kernel, parent, count, absent)``: an Expansion closed with ``count`` children,
or with none because of ``absent`` (Dropped, or Suppressed with the cause)."""
ChildCreated = Callable[["ItemPropagation", Path], None]
"""``child_created(kernel, child)``: a child's expanded Items were resolved."""


def expand(port: Any) -> Port:
    """Each Item (a sequence) becomes the ordered children of its Entity in a new child Domain."""
    return EXPAND.trace(active_trace("F.expand"), (port,))[0]


def expand_aligned(*ports: Any) -> tuple[Port, ...]:
    """Several outputs of one Call, expanded together into *one* child Domain.

    For each parent the lists must have the same length; child ``j`` sees element ``j``
    of each (one Port per expanded output). Lists of different lengths, or a value that
    is not a list, fail that parent's Expansion (its reduces give Suppressed).
    """
    return tuple(EXPAND.trace(active_trace("F.expand_aligned"), ports))


class Expansion(KernelNode):
    """One expand node in a kernel: closes each parent's Expansion when its Items resolve."""

    __slots__ = ("domain", "inputs", "on_child", "on_close", "outputs", "ports_per_child")
    kind = NodeKind.EXPAND

    def __init__(self, node: NodeSpec, ports_per_child: int) -> None:
        self.domain = node.domain  # the child Domain it creates
        self.inputs = node.inputs  # several: F.expand_aligned (outputs of one Call)
        self.outputs = node.outputs
        self.ports_per_child = ports_per_child
        self.on_close: list[Closed] = []
        self.on_child: list[ChildCreated] = []

    def on_input(self, kernel: ItemPropagation, path: Path, value: Any) -> None:
        """The expanded Item of ``path`` resolved: close the Expansion, create the children."""
        key = (self.domain, path)
        if len(self.inputs) > 1:  # F.expand_aligned: wait for every aligned output
            values = [kernel._items.get((port, path), PENDING) for port in self.inputs]
            if any(v is PENDING for v in values):
                return
            value = next((v for v in values if type(v) is Absent), value)
        else:
            values = [value]
        if type(value) is Absent:
            dropped = value.outcome is Outcome.DROPPED
            kernel._close_expansion(key, DROPPED_X if dropped else FAILED_X)
            self._no_children(kernel, path, DROPPED_ITEM if dropped else suppressed_by(value))
            return
        columns = [expansion_elements(v) for v in values]
        problem = None
        bad_value = next((v for v, c in zip(values, columns) if c is None), None)
        if any(c is None for c in columns):
            problem = (f"the value is a {type(bad_value).__name__}, not a sequence; the "
                       "expanded module must return a list per record")
        elif len({len(c) for c in columns if c is not None}) > 1:
            problem = (f"the aligned lists have different lengths "
                       f"{[len(c) for c in columns if c is not None]}")
        if problem is not None:
            kernel._close_expansion(key, FAILED_X)
            where = f"F.expand into {self.domain} at {format_path(path)}"
            self._no_children(kernel, path, Absent(Outcome.SUPPRESSED, f"{where}: {problem}"))
            return
        elements = columns[0]
        assert elements is not None
        count = len(elements)
        kernel._close_expansion(key, count)
        for closed in self.on_close:
            closed(kernel, path, count, None)
        if count == 0:
            return
        kernel._pending[path[0]] += count * self.ports_per_child
        on_child = self.on_child
        resolve = kernel._resolve
        for ordinal in range(count):
            child = (*path, ordinal)
            for port, column in zip(self.outputs, columns):
                assert column is not None
                resolve(port, child, column[ordinal])
            for created in on_child:
                created(kernel, child)

    def _no_children(self, kernel: ItemPropagation, path: Path, absent: Absent) -> None:
        for closed in self.on_close:
            closed(kernel, path, 0, absent)


class Expand(Primitive):
    kind = NodeKind.EXPAND

    def trace(self, trace: Trace, values: tuple[Any, ...]) -> list[Port]:
        """One Expansion per parent: several Ports expand *aligned* into one child Domain."""
        location = caller_location()
        what = "F.expand" if len(values) == 1 else "F.expand_aligned"
        if not values:
            raise ce.ExpandError(f"{what} of no Port", location,
                                 "pass the Port(s) to expand: F.expand_aligned(xs, ys)")
        ports = [trace.own(v, f"argument {i + 1} of {what}", location)
                 for i, v in enumerate(values)]
        producers = []
        for port in ports:
            producer = trace.producer(port)
            if producer.kind is not NodeKind.CALL:
                raise ce.ExpandError(
                    f"{what} of {port.name!r}, which is the output of {producer.kind}, "
                    "not of a Call",
                    location,
                    "expand the output of a module call whose per-record value is a sequence "
                    "(e.g. F.expand(self.render(pdfs)))",
                )
            producers.append(producer.id)
        if len(set(producers)) > 1 or len({p.id for p in ports}) < len(ports):
            raise ce.ExpandError(
                f"{what} of {', '.join(p.name for p in ports)}: aligned Ports must be distinct "
                "outputs of one Call",
                location,
                "return the aligned lists from one module (.returns(n) / num_outputs=n) and "
                "expand those outputs together",
            )
        expanded: dict[tuple[int, ...], list[Port]] = trace.memo.setdefault(self.kind, {})
        key = tuple(p.id for p in ports)
        if key in expanded:  # the same expansion again: the same child Domain (upstream)
            return expanded[key]
        taken = [p for p in ports if any(p.id in other for other in expanded)]
        if taken:
            raise ce.ExpandError(
                f"{what} of {taken[0].name!r}, which already belongs to another expansion",
                location,
                "expand a Port once (reuse the expanded Port), or declare the alignment once "
                "with F.expand_aligned",
            )
        child = trace.new_domain(ports[0].domain)
        outs = trace.add_node(self.kind, child, tuple(ports),
                              [f"expand({p.name})" for p in ports], location)
        expanded[key] = outs
        return outs

    def lint(self, plan: Plan, node: NodeSpec) -> None:
        domain = plan.domain(node.domain)
        producers = {plan.ports[p].producer for p in node.inputs}
        if (len(producers) != 1 or plan.nodes[producers.pop()].kind != NodeKind.CALL
                or domain.expand_node != node.id
                or any(plan.ports[p].domain != domain.parent for p in node.inputs)):
            raise malformed(ce.ExpandError, node, f"expand node {node.id} does not expand "
                            f"outputs of one Call in the parent of the Domain {node.domain} it "
                            "creates")

    def route(self, node: NodeSpec, tables: PlanTables) -> Expansion:
        expansion = Expansion(node, len(tables.domain_ports[node.domain]))
        tables.expands[node.domain] = expansion
        for port in node.inputs:
            tables.route(port, expansion.on_input)
        return expansion

    def evaluate(self, node: NodeSpec, ev: Evaluation) -> None:
        items = ev.items
        children: list[Path] = []
        for path in ev.entities[ev.parent_domain(node.domain)]:
            aligned = [items[(port, path)] for port in node.inputs]
            item = next((i for i in aligned if not i.present), aligned[0])
            columns = [expansion_elements(i.value) if i.present else None for i in aligned]
            lengths = {len(c) for c in columns if c is not None}
            key = (node.domain, path)
            if item.outcome is Outcome.DROPPED:
                ev.expansions[key] = (EXPANSION_DROPPED, 0)
            elif any(c is None for c in columns) or len(lengths) > 1:
                ev.expansions[key] = (EXPANSION_FAILED, 0)
                ev.failed_expansions[key] = (
                    ev.suppressed_by(item, node.inputs[0], path) if bad(item)
                    else _not_a_sequence(node, path, aligned, columns)
                    if any(c is None for c in columns)
                    else Item(Outcome.SUPPRESSED, None,
                              f"F.expand into {node.domain} at {format_path(path)}: the "
                              "aligned lists have different lengths "
                              f"{[len(c) for c in columns if c is not None]}")
                )
            else:
                count = lengths.pop()
                ev.expansions[key] = (EXPANSION_SUCCEEDED, count)
                for ordinal in range(count):
                    children.append((*path, ordinal))
                    for port, column in zip(node.outputs, columns):
                        assert column is not None
                        items[(port, (*path, ordinal))] = present(column[ordinal])
        ev.entities[node.domain] = children


def _not_a_sequence(
    node: NodeSpec, path: Path, aligned: list[Item], columns: list[list[Any] | None]
) -> Item:
    value = next((i.value for i, c in zip(aligned, columns) if c is None), None)
    return Item(
        Outcome.SUPPRESSED, None,
        f"F.expand into {node.domain} at {format_path(path)}: the value is a "
        f"{type(value).__name__}, not a sequence; the expanded module must return a list per "
        "record",
    )


EXPAND = Expand()

__all__ = ["EXPAND", "Expand", "Expansion", "expand", "expand_aligned"]
