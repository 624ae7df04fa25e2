"""``F.reduce`` / ``F.reduce_aligned``: children -> parent, the list of child values in
ordinal order.

Its meaning, in one place: the trace-time checks (a Port of a child Domain; ``members=``
in the same Domain), the plan lint, the kernel's countdown over the members of each
Expansion (emitted once all are terminal, or Suppressed as soon as one fails) and the
reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rayorch.core import compile_errors as ce
from rayorch.core.ids import Path, format_path
from rayorch.core.items import PENDING, Absent, suppressed_by
from rayorch.core.outcome import DROPPED, Item, Outcome, present
from rayorch.core.plan import NodeKind, NodeSpec, Plan
from rayorch.core.primitives.base import Evaluation, KernelNode, Primitive, bad, malformed
from rayorch.core.tracer import Port, Trace, active_trace, caller_location
from rayorch.core.vocabulary import EXPANSION_DROPPED, EXPANSION_FAILED

if TYPE_CHECKING:
    from rayorch.core.plan_tables import PlanTables
    from rayorch.core.propagation import ItemPropagation


def reduce(port: Any, *, members: Any = None) -> Port:
    """Children -> parent: the list of child values in ordinal order.

    Without ``members`` the Dropped children are left out. With ``members=m`` (a Port
    of the same child Domain) the list holds the value of every child whose ``m`` Item
    is Present; a child whose ``m`` is Dropped is left out; a Failed/Suppressed ``m``,
    or a member whose value is not Present, makes the parent's Item Suppressed.
    """
    return REDUCE.trace(active_trace("F.reduce"), port, members)


def reduce_aligned(*ports: Any, members: Any = None) -> tuple[Port, ...]:
    """Reduce several Ports of one child Domain over one member set (default: the first).

    The lists have the same length and order for every parent: ``F.reduce(p,
    members=m)`` for each ``p``.
    """
    trace = active_trace("F.reduce_aligned")
    if not ports:
        return ()
    member_port = ports[0] if members is None else members
    return tuple(REDUCE.trace(trace, p, member_port) for p in ports)


class Reduction(KernelNode):
    """One reduce node in a kernel: a countdown per parent in ``kernel._reduce_left``."""

    __slots__ = ("domain", "input", "members", "node", "output", "ports")
    kind = NodeKind.REDUCE

    def __init__(self, node: NodeSpec) -> None:
        assert node.source_domain is not None
        self.node = node.id
        self.domain = node.source_domain  # the child Domain it reads
        self.input = node.inputs[0]
        self.members: int | None = node.inputs[1] if len(node.inputs) > 1 else None
        self.ports = len(node.inputs)  # Items per child it waits for
        self.output = node.outputs[0]

    def expansion_closed(
        self, kernel: ItemPropagation, parent: Path, count: int, absent: Absent | None
    ) -> None:
        """The Expansion of ``parent`` closed: no children gives the parent's Item now."""
        if absent is not None:
            kernel._resolve(self.output, parent, absent)
        elif count == 0:
            kernel._resolve(self.output, parent, [])
        else:
            kernel._reduce_left[(self.node, parent)] = count * self.ports

    def on_member(self, kernel: ItemPropagation, path: Path, value: Any) -> None:
        """A member of a reduce resolved: emit the parent's list once all are terminal."""
        parent = path[:-1]
        key = (self.node, parent)
        reduce_left = kernel._reduce_left
        left = reduce_left.get(key)
        if left is None:
            return  # already suppressed by an earlier failed member
        if self.members is not None:
            self._step(kernel, path, key, left)
            return
        if type(value) is Absent and value.outcome is not Outcome.DROPPED:
            del reduce_left[key]
            kernel._resolve(self.output, parent, suppressed_by(value))
            return
        if left > 1:
            reduce_left[key] = left - 1
            return
        del reduce_left[key]
        items = kernel._items
        port = self.input
        count = kernel._expansions[(self.domain, parent)]
        members = [items[(port, (*parent, i))] for i in range(count)]
        kernel._resolve(self.output, parent, [m for m in members if type(m) is not Absent])

    def on_membership(self, kernel: ItemPropagation, path: Path, value: Any) -> None:
        """The ``members=`` Item of a child of a reduce resolved."""
        key = (self.node, path[:-1])
        left = kernel._reduce_left.get(key)
        if left is not None:
            self._step(kernel, path, key, left)

    def _step(self, kernel: ItemPropagation, path: Path, key: tuple[int, Path], left: int) -> None:
        """``F.reduce(values, members=m)``: one of a child's two Items resolved."""
        assert self.members is not None
        parent = path[:-1]
        items = kernel._items
        member = items.get((self.members, path), PENDING)
        value = items.get((self.input, path), PENDING)
        blame = None
        if type(member) is Absent and member.outcome is not Outcome.DROPPED:
            blame = suppressed_by(member)
        elif member is not PENDING and type(member) is not Absent and type(value) is Absent:
            blame = suppressed_by(value) if value.outcome is not Outcome.DROPPED else Absent(
                Outcome.SUPPRESSED, f"F.reduce(members=...) at {format_path(path)}: the member "
                "is Present but its value was Dropped, so the aligned lists cannot keep it")
        reduce_left = kernel._reduce_left
        if blame is not None:
            del reduce_left[key]
            kernel._resolve(self.output, parent, blame)
            return
        if left > 1:
            reduce_left[key] = left - 1
            return
        del reduce_left[key]
        count = kernel._expansions[(self.domain, parent)]
        kept = [items[(self.input, (*parent, i))] for i in range(count)
                if type(items[(self.members, (*parent, i))]) is not Absent]
        kernel._resolve(self.output, parent, kept)

    def countdown(self, kernel: ItemPropagation, parent: Path) -> tuple[int, int]:
        count = kernel._expansions[(self.domain, parent)]
        watched = (self.input,) if self.members is None else (self.input, self.members)
        items = kernel._items
        missing = sum((port, (*parent, i)) not in items for i in range(count) for port in watched)
        return missing, self.output


class Reduce(Primitive):
    kind = NodeKind.REDUCE

    def trace(self, trace: Trace, value: Any, members: Any = None) -> Port:
        location = caller_location()
        port = trace.own(value, "the argument of F.reduce", location)
        parent = trace.domain_parent.get(port.domain)
        if parent is None:
            raise ce.ReduceError(
                f"F.reduce of {port.name!r}, which is in the root Domain (it has no parent)",
                location,
                "reduce only Ports of a child Domain, i.e. downstream of an F.expand",
            )
        inputs: tuple[Port, ...] = (port,)
        if members is not None:
            member_port = trace.own(members, "members= of F.reduce", location)
            if member_port.domain != port.domain:
                raise ce.DomainMismatchError(
                    f"F.reduce of {port.name!r} (in {port.domain}) with members "
                    f"{member_port.name!r} in {member_port.domain}",
                    location,
                    "members= must be a Port of the same child Domain as the reduced value",
                )
            if member_port.id != port.id:
                inputs = (port, member_port)
        return trace.add_node(self.kind, parent, inputs, [f"reduce({port.name})"], location,
                              source_domain=port.domain)[0]

    def lint(self, plan: Plan, node: NodeSpec) -> None:
        source = node.source_domain
        if (source is None or plan.domain(source).parent != node.domain
                or any(plan.ports[p].domain != source for p in node.inputs)):
            raise malformed(ce.ReduceError, node,
                            f"reduce node {node.id} does not read a child Domain of {node.domain}")

    def route(self, node: NodeSpec, tables: PlanTables) -> Reduction:
        reduction = Reduction(node)
        tables.route(reduction.input, reduction.on_member)
        if reduction.members is not None:
            tables.route(reduction.members, reduction.on_membership)
        tables.observe_expansion(reduction.domain, closed=reduction.expansion_closed)
        return reduction

    def evaluate(self, node: NodeSpec, ev: Evaluation) -> None:
        source = node.source_domain
        assert source is not None
        items = ev.items
        for path in ev.entities[node.domain]:
            state, count = ev.expansions[(source, path)]
            values = [items[(node.inputs[0], (*path, i))] for i in range(count)]
            if len(node.inputs) > 1:  # members=: the membership decides who is kept
                members = [items[(node.inputs[1], (*path, i))] for i in range(count)]
                failed = [(i, m, node.inputs[1]) for i, m in enumerate(members) if bad(m)]
                failed += [(i, v, node.inputs[0]) for i, (m, v) in
                           enumerate(zip(members, values)) if m.present and not v.present]
                kept = [v for m, v in zip(members, values) if m.present]
            else:
                failed = [(i, v, node.inputs[0]) for i, v in enumerate(values) if bad(v)]
                kept = [v for v in values if v.present]
            out: Item
            if state == EXPANSION_DROPPED:
                out = DROPPED
            elif state == EXPANSION_FAILED:
                out = ev.failed_expansions[(source, path)]
            elif failed:
                i, member, port = min(failed, key=lambda f: f[0])
                out = ev.suppressed_by(member, port, (*path, i)) if bad(member) else \
                    Item(Outcome.SUPPRESSED, None, "a member's value was Dropped")
            else:
                out = present([v.value for v in kept])
            items[(node.outputs[0], path)] = out


REDUCE = Reduce()

__all__ = ["REDUCE", "Reduce", "Reduction", "reduce", "reduce_aligned"]
