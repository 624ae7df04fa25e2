"""The Plan as flat routing tables: what the kernel runs when an Item resolves.

:class:`PlanTables` is built once per Kernel from the :class:`~rayorch.core.plan.Plan`;
each Port lists its consumers (a Call, an Expansion, a reduce, a filter, a broadcast)
with the precomputed facts the kernel needs of them (``CallInfo``, ``ExpandInfo``, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rayorch.core.ids import ROOT, CallId, GrainKey, Path, domain_depth
from rayorch.core.plan import ModuleOptions, NodeKind, NodeSpec, Plan
from rayorch.core.scheduler import CallQueue


class CallInfo:
    """What the kernel needs of one Call, precomputed."""

    __slots__ = ("domain", "id", "inputs", "max_attempts", "num_outputs", "outputs", "policy",
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
        self.policy = options.policy
        self.root = node.domain == ROOT
        self.queue_push: Callable[[GrainKey], None] = lambda grain: None


class ReduceInfo:
    __slots__ = ("domain", "input", "members", "node", "output", "ports")

    def __init__(self, node: NodeSpec) -> None:
        assert node.source_domain is not None
        self.node = node.id
        self.domain = node.source_domain  # the child Domain it reads
        self.input = node.inputs[0]
        self.members: int | None = node.inputs[1] if len(node.inputs) > 1 else None
        self.ports = len(node.inputs)  # Items per child it waits for
        self.output = node.outputs[0]


class BroadcastInfo:
    __slots__ = ("chain", "output", "source", "source_len")

    def __init__(self, node: NodeSpec, source_domain: str, chain: tuple[str, ...]) -> None:
        self.source = node.inputs[0]
        self.source_len = domain_depth(source_domain) + 1
        self.output = node.outputs[0]
        self.chain = chain  # Domains below the source's, down to the target Domain


class ExpandInfo:
    __slots__ = ("broadcasts", "domain", "inputs", "outputs", "ports_per_child", "reduces")

    def __init__(self, node: NodeSpec, ports_per_child: int) -> None:
        self.domain = node.domain  # the child Domain it creates
        self.inputs = node.inputs  # several: F.expand_aligned (outputs of one Call)
        self.outputs = node.outputs
        self.ports_per_child = ports_per_child
        self.reduces: list[ReduceInfo] = []
        self.broadcasts: list[BroadcastInfo] = []


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
        self.inputs: list[tuple[int, int]] = []
        self.calls: dict[CallId, CallInfo] = {}
        self.expands: dict[str, ExpandInfo] = {}
        self.domain_calls: dict[str, list[CallId]] = {d: [] for d in parent_of}
        self._routes: list[tuple[int, str, Any]] = []  # (port, handler name, info)
        reduces: list[ReduceInfo] = []
        broadcasts: list[tuple[str, BroadcastInfo]] = []
        for node in plan.nodes:
            kind = node.kind
            if kind is NodeKind.INPUT:
                self.inputs.append((node.arg_index, node.outputs[0]))
            elif kind is NodeKind.CALL:
                assert node.call is not None
                info = CallInfo(node, plan.module(node.call.module).options)
                self.calls[info.id] = info
                self.domain_calls[node.domain].append(info.id)
                for port in dict.fromkeys(node.inputs):
                    self._routes.append((port, "call", info))
            elif kind is NodeKind.EXPAND:
                expand = ExpandInfo(node, len(self.domain_ports[node.domain]))
                self.expands[node.domain] = expand
                for port in node.inputs:
                    self._routes.append((port, "expand", expand))
            elif kind is NodeKind.REDUCE:
                reduce = ReduceInfo(node)
                reduces.append(reduce)
                self._routes.append((reduce.input, "reduce", reduce))
                if reduce.members is not None:
                    self._routes.append((reduce.members, "reduce_members", reduce))
            elif kind is NodeKind.FILTER:
                port, mask = node.inputs
                for source in dict.fromkeys((port, mask)):
                    self._routes.append((source, "filter", (port, mask, node.outputs[0])))
            elif kind is NodeKind.BROADCAST:
                source_domain = ports[node.inputs[0]].domain
                chain: list[str] = []
                domain: str | None = node.domain
                while domain is not None and domain != source_domain:
                    chain.append(domain)
                    domain = parent_of[domain]
                info_b = BroadcastInfo(node, source_domain, tuple(reversed(chain)))
                broadcasts.append((node.domain, info_b))
                self._routes.append((info_b.source, "broadcast", info_b))
        for reduce in reduces:
            self.expands[reduce.domain].reduces.append(reduce)
        for domain, info_b in broadcasts:
            self.expands[domain].broadcasts.append(info_b)
        self.num_inputs = 1 + max((arg for arg, _ in self.inputs), default=-1)
        self.consumers: list[tuple[tuple[Handler, Any], ...]] = [() for _ in ports]

    def bind(self, handlers: dict[str, Handler], queues: dict[CallId, CallQueue]) -> None:
        """Attach a kernel's handlers and queues to the routes."""
        routes: list[list[tuple[Handler, Any]]] = [[] for _ in self.consumers]
        for port, name, info in self._routes:
            routes[port].append((handlers[name], info))
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


__all__ = ["BroadcastInfo", "CallInfo", "ExpandInfo", "Handler", "PlanTables", "ReduceInfo"]
