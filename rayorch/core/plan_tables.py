"""The Plan as flat routing tables: what the kernel runs when an Item resolves.

:class:`PlanTables` is built once per Kernel from the :class:`~rayorch.core.plan.Plan`;
each Port lists its consumers with the precomputed facts the kernel needs of them: a
Call (``CallInfo``), or a primitive's node (a ``KernelNode`` that the primitive builds
in ``route``: see :mod:`rayorch.core.primitives`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rayorch.core.ids import ROOT, CallId, DomainId, GrainKey, Path
from rayorch.core.plan import ModuleOptions, NodeKind, NodeSpec, Plan
from rayorch.core.primitives import primitive
from rayorch.core.primitives.base import KernelNode
from rayorch.core.primitives.expand import ChildCreated, Closed, Expansion
from rayorch.core.scheduler import CallQueue


class CallInfo:
    """What the kernel needs of one Call, precomputed."""

    __slots__ = ("batch_size", "domain", "id", "inputs", "max_attempts", "num_outputs",
                 "outputs", "policy",
                 "queue_push", "root", "single")

    def __init__(self, node: NodeSpec, options: ModuleOptions) -> None:
        assert node.call is not None
        self.id: CallId = node.call.id
        self.domain = node.domain
        self.inputs = node.inputs
        self.outputs = node.outputs
        self.single = len(set(node.inputs)) == 1
        self.num_outputs = len(node.outputs)
        self.max_attempts = options.max_attempts
        self.batch_size = options.batch_size
        self.policy = options.policy
        self.root = node.domain == ROOT
        self.queue_push: Callable[[GrainKey], None] = lambda grain: None


Handler = Callable[[Any, Path, Any], None]


class PlanTables:
    """The Plan as flat lookup tables: what to run when an Item resolves."""

    def __init__(self, plan: Plan) -> None:
        ports = plan.ports
        self.port_names = tuple(p.name for p in ports)
        self.outputs = plan.output_ports
        parent_of = {d.id: d.parent for d in plan.domains}
        self.domain_order = tuple(d.id for d in sorted(plan.domains, key=lambda d: d.depth))
        self.domain_parent = parent_of
        self.child_domains: dict[str, tuple[str, ...]] = {
            d: tuple(c for c in self.domain_order if parent_of[c] == d) for d in parent_of
        }
        self.domain_ports: dict[str, tuple[int, ...]] = {
            d: tuple(p.id for p in ports if p.domain == d) for d in parent_of
        }
        self.root_ports = len(self.domain_ports[ROOT])
        self.port_domains = tuple(p.domain for p in ports)
        self.inputs: list[tuple[int, int]] = []
        self.calls: dict[CallId, CallInfo] = {}
        self.expands: dict[DomainId, Expansion] = {}
        self.nodes: dict[int, KernelNode] = {}  # node id -> a primitive's node
        self.domain_calls: dict[str, list[CallId]] = {d: [] for d in parent_of}
        self._routes: list[tuple[int, Handler | None, Any]] = []  # (port, handler, info)
        self._observers: list[tuple[DomainId, Closed | None, ChildCreated | None]] = []
        for node in plan.nodes:
            kind = node.kind
            if kind == NodeKind.INPUT:
                self.inputs.append((node.arg_index, node.outputs[0]))
            elif kind == NodeKind.CALL:
                assert node.call is not None
                info = CallInfo(node, plan.module(node.call.module).options)
                self.calls[info.id] = info
                self.domain_calls[node.domain].append(info.id)
                for port in dict.fromkeys(node.inputs):
                    self._routes.append((port, None, info))
            elif kind != NodeKind.OUTPUT:
                self.nodes[node.id] = primitive(kind).route(node, self)
        for domain, closed, child in self._observers:
            expansion = self.expands[domain]
            if closed is not None:
                expansion.on_close.append(closed)
            if child is not None:
                expansion.on_child.append(child)
        self.num_inputs = 1 + max((arg for arg, _ in self.inputs), default=-1)
        self.consumers: list[tuple[tuple[Handler, Any], ...]] = [() for _ in ports]

    # -- what a primitive's route() calls ------------------------------------------
    def route(self, port: int, handler: Handler) -> None:
        """Call ``handler(kernel, path, value)`` when ``port`` resolves for an Entity."""
        self._routes.append((port, handler, None))

    def observe_expansion(
        self, domain: DomainId, closed: Closed | None = None, child: ChildCreated | None = None
    ) -> None:
        """Be told when an Expansion into ``domain`` closes, and when it creates a child."""
        self._observers.append((domain, closed, child))

    def bind(self, kernel: Any, call_ready: Handler, queues: dict[CallId, CallQueue]) -> None:
        """Attach a kernel (its Call handler ``call_ready(info, path, value)``) and queues."""
        routes: list[list[tuple[Handler, Any]]] = [[] for _ in self.consumers]
        for port, handler, info in self._routes:
            routes[port].append((call_ready, info) if handler is None else (handler, kernel))
        self.consumers = [tuple(r) for r in routes]
        for call_id, info in self.calls.items():
            queue = queues[call_id]
            info.queue_push = queue.push if queue.parent_bound else queue.fifo.append

    def descendants(
        self, expansions: dict[tuple[str, Path], int], path: Path, chain: tuple[str, ...]
    ) -> list[Path]:
        """Existing Entities below ``path`` in the last Domain of ``chain``."""
        level = [path]
        for domain in chain:
            level = [
                (*p, i) for p in level for i in range(expansions.get((domain, p), 0))
            ]
        return level

    def entities(
        self, expansions: dict[tuple[str, Path], int], source: int
    ) -> list[tuple[str, Path]]:
        """Every Entity of one source's tree, Domain by Domain."""
        paths: dict[str, list[Path]] = {ROOT: [(source,)]}
        out: list[tuple[str, Path]] = [(ROOT, (source,))]
        for domain in self.domain_order[1:]:
            parent = self.domain_parent[domain]
            assert parent is not None
            level = [
                (*p, i) for p in paths[parent] for i in range(expansions.get((domain, p), 0))
            ]
            paths[domain] = level
            out.extend((domain, p) for p in level)
        return out


__all__ = ["CallInfo", "Handler", "PlanTables"]
