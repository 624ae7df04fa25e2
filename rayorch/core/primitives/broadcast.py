"""``F.broadcast``: an ancestor's value made available to every descendant Entity.

Its meaning, in one place: the trace-time checks (from a strict ancestor Domain; within
one Domain it is the Port itself), the plan lint, the kernel's hand-down (when the
ancestor's Item resolves, and to each child created after it) and the reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rayorch.core import compile_errors as ce
from rayorch.core.ids import Path, domain_depth
from rayorch.core.items import PENDING, Absent, suppressed_by
from rayorch.core.outcome import Outcome
from rayorch.core.plan import NodeKind, NodeSpec, Plan
from rayorch.core.primitives.base import Evaluation, KernelNode, Primitive, bad, malformed
from rayorch.core.tracer import Port, Trace, active_trace, caller_location

if TYPE_CHECKING:
    from rayorch.core.plan_tables import PlanTables
    from rayorch.core.propagation import ItemPropagation


def broadcast(port: Any, like: Any) -> Port:
    """An ancestor's value made available to every descendant Entity in ``like``'s Domain.

    Within one Domain it is the Port itself (as upstream RayOrch).
    """
    return BROADCAST.trace(active_trace("F.broadcast"), port, like)


def _handed_down(value: Any) -> Any:
    """What a descendant sees of its ancestor's Item (a failure becomes Suppressed)."""
    if type(value) is Absent and value.outcome is not Outcome.DROPPED:
        return suppressed_by(value)
    return value


class Broadcasting(KernelNode):
    """One broadcast node in a kernel."""

    __slots__ = ("chain", "output", "source", "source_len")
    kind = NodeKind.BROADCAST

    def __init__(self, node: NodeSpec, source_domain: str, chain: tuple[str, ...]) -> None:
        self.source = node.inputs[0]
        self.source_len = domain_depth(source_domain) + 1
        self.output = node.outputs[0]
        self.chain = chain  # Domains below the source's, down to the target Domain

    def on_source(self, kernel: ItemPropagation, path: Path, value: Any) -> None:
        """An ancestor Item resolved: hand it to every existing descendant in the target Domain."""
        item = _handed_down(value)
        pending = kernel._pending
        items = kernel._items
        for child in kernel.tables.descendants(kernel._expansions, path, self.chain):
            if path[0] not in pending:
                return  # the source completed: its Items were released
            if (self.output, child) not in items:
                kernel._resolve(self.output, child, item)

    def child_created(self, kernel: ItemPropagation, child: Path) -> None:
        """A child of the target Domain was created: hand it the ancestor's Item if known."""
        items = kernel._items
        item = items.get((self.source, child[: self.source_len]), PENDING)
        if item is not PENDING and (self.output, child) not in items:
            kernel._resolve(self.output, child, _handed_down(item))


class Broadcast(Primitive):
    kind = NodeKind.BROADCAST

    def trace(self, trace: Trace, value: Any, like: Any) -> Port:
        location = caller_location()
        port, like_port = trace.own_all(location, (value, "the first argument of F.broadcast"),
                                        (like, "the like= argument of F.broadcast"))
        if port.domain == like_port.domain:
            return port  # already there: the identity (as upstream RayOrch)
        if not trace.is_ancestor(port.domain, like_port.domain):
            raise ce.BroadcastError(
                f"F.broadcast of {port.name!r} (in {port.domain}) like {like_port.name!r} "
                f"(in {like_port.domain}): {port.domain} is not an ancestor of {like_port.domain}",
                location,
                "broadcast only from a parent/ancestor Domain down to its descendants; within one "
                "Domain use the Port directly, upwards use F.reduce",
            )
        return trace.add_node(self.kind, like_port.domain, (port, like_port),
                              [f"broadcast({port.name})"], location)[0]

    def lint(self, plan: Plan, node: NodeSpec) -> None:
        source = plan.ports[node.inputs[0]].domain
        domain: str | None = plan.domain(node.domain).parent
        while domain is not None and domain != source:
            domain = plan.domain(domain).parent
        if domain is None:
            raise malformed(ce.BroadcastError, node, f"broadcast node {node.id}: {source} is "
                            f"not an ancestor of {node.domain}")

    def route(self, node: NodeSpec, tables: PlanTables) -> Broadcasting:
        source_domain = tables.port_domains[node.inputs[0]]
        chain: list[str] = []
        domain: str | None = node.domain
        while domain is not None and domain != source_domain:
            chain.append(domain)
            domain = tables.domain_parent[domain]
        broadcasting = Broadcasting(node, source_domain, tuple(reversed(chain)))
        tables.route(broadcasting.source, broadcasting.on_source)
        tables.observe_expansion(node.domain, child=broadcasting.child_created)
        return broadcasting

    def evaluate(self, node: NodeSpec, ev: Evaluation) -> None:
        source = node.inputs[0]
        depth = ev.plan.domain(ev.plan.ports[source].domain).depth
        items = ev.items
        for path in ev.entities[node.domain]:
            ancestor = path[: depth + 1]
            item = items[(source, ancestor)]
            items[(node.outputs[0], path)] = (
                ev.suppressed_by(item, source, ancestor) if bad(item) else item)


BROADCAST = Broadcast()

__all__ = ["BROADCAST", "Broadcast", "Broadcasting", "broadcast"]
