"""The compiled, immutable plan of a pipeline program.

A Plan is a small graph of nodes connected by Ports: the inputs, Calls and outputs
of ``forward``, and the structural primitives (expand, reduce, filter, broadcast, each
defined in one module of :mod:`rayorch.core.primitives`). Every Port lives in one
Domain; Domains form a tree rooted at ``"root"``. The kernel, the reference
interpreter, the audit tool and the runtime all read the same Plan.

A Plan holds user code only in :attr:`ModuleSpec.target`; :meth:`Plan.describe`
gives a msgpack-able description without it (stored with a run, so events can be
read back without importing user code).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import orjson

from rayorch.core.errors import PlanLookupError
from rayorch.core.ids import ROOT, CallId, DomainId
from rayorch.core.pool_sizing import AUTO_MAX_REPLICAS
from rayorch.core.recovery import RecoveryPolicy


class NodeKind(StrEnum):
    """The kinds of the graph's own nodes (input, call, output) and the built-in primitives'.

    A primitive's kind is the name it is registered under in :mod:`rayorch.core.primitives`
    (``NodeSpec.kind`` is a ``str``): the members below name the built-in ones, and a new
    primitive adds none (see :func:`node_kind`).
    """

    INPUT = "input"
    CALL = "call"
    EXPAND = "expand"
    REDUCE = "reduce"
    FILTER = "filter"
    BROADCAST = "broadcast"
    OUTPUT = "output"


def node_kind(name: str) -> str:
    """The kind named ``name`` in a plan description: the NodeKind member if there is one."""
    try:
        return NodeKind(name)
    except ValueError:
        return name


class Policy(StrEnum):
    """Reservation policy of a Call's ready queue."""

    ELASTIC = "elastic"
    PARENT_BOUND = "parent_bound"


@dataclass(frozen=True, slots=True)
class ModuleOptions:
    """Execution options of a module; every Call of the module shares its pool."""

    replicas: int = 1
    """Actors at the start: all of them for a fixed size, the min for a range or ``"auto"``."""
    batch_size: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: tuple[tuple[str, float], ...] = ()
    max_attempts: int = 3
    timeout_s: float | None = None
    policy: Policy = Policy.ELASTIC
    batched: bool = True
    num_outputs: int = 1
    ray_options: tuple[tuple[str, Any], ...] = field(default=(), compare=False)
    """Ray actor options passed through to ``ray.remote(...).options`` (runtime_env, ...)."""
    recovery: RecoveryPolicy | None = None
    """What the actor does when the UDF raises (None: ``isolate_tail``)."""
    output_layout: str = "rows"
    """``rows``: a tuple of outputs per record; ``columns``: one list per output (upstream)."""
    max_inflight: int = 1
    """Batches one actor runs at once (an engine that batches concurrent requests wants
    several: docs/topics/ACTORS.md, "Several batches in flight per actor")."""
    max_rss: int | None = None
    """Bytes of resident memory past which an actor is recycled: it finishes its batches,
    then a fresh one replaces it (docs/topics/ACTORS.md, "Actors that recycle themselves")."""
    max_batches: int | None = None
    """Batches an actor runs before it is recycled the same way (None: no limit)."""
    keep_values: bool = False
    """Its outputs are lineage (a drop's verdict): kept after their source is delivered,
    never freed (docs/topics/PAYLOADS.md, "Freeing values")."""
    max_replicas: int | None = None
    """None: ``replicas`` is fixed; else the pool sizes itself between ``replicas`` and this
    (``replicas=(min, max)``; ``"auto"`` is ``(1, AUTO_MAX_REPLICAS)``, bounded in practice
    by the free resources: docs/topics/POOL-SIZING.md, "Pools that size themselves")."""

    @property
    def sizes_itself(self) -> bool:
        """Whether the runtime may change the pool's size during a run."""
        return self.max_replicas is not None and self.max_replicas > self.replicas

    @property
    def replicas_text(self) -> str:
        """``4``, ``(1, 8)`` or ``auto``: as the user would write it."""
        if not self.sizes_itself:
            return str(self.replicas)
        if self.replicas == 1 and self.max_replicas == AUTO_MAX_REPLICAS:
            return "auto"
        return f"({self.replicas}, {self.max_replicas})"


@dataclass(frozen=True, slots=True)
class ModuleSpec:
    """A registered module: its stable dotted name, user target and options."""

    name: str
    target: Any = field(compare=False, repr=False)
    args: tuple[Any, ...] = field(default=(), compare=False, repr=False)
    kwargs: tuple[tuple[str, Any], ...] = field(default=(), compare=False, repr=False)
    options: ModuleOptions = ModuleOptions()
    target_name: str = ""


@dataclass(frozen=True, slots=True)
class SourceLocation:
    file: str
    line: int
    code: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True, slots=True)
class PortSpec:
    """A symbolic column: one value per Entity of ``domain``."""

    id: int
    name: str
    domain: DomainId
    producer: int  # node id
    index: int = 0  # which output of the producer


@dataclass(frozen=True, slots=True)
class DomainSpec:
    id: DomainId
    parent: DomainId | None
    depth: int
    expand_node: int | None  # the expand node that creates this Domain (None for root)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node of the plan.

    ``inputs``/``outputs`` are Port ids. Per kind:

    * input: no inputs, one output (root Domain); ``arg_index`` = forward argument.
    * call: inputs = the Call's Port arguments (all in ``domain``), ``call`` set.
    * expand: one input (a call output in ``domain``'s parent), one output in the child
      Domain ``domain``.
    * reduce: one input in the child Domain ``source_domain``, output in ``domain``.
    * filter: inputs (port, mask), one output, all in ``domain``.
    * broadcast: inputs (ancestor port, like port); output in ``domain`` (= like's Domain).
    * output: one input in the root Domain; ``name`` is the output name.

    A primitive's constants are in ``params`` (msgpack-able ``(name, value)`` pairs).
    """

    id: int
    kind: str  # a NodeKind, or the kind of a primitive (rayorch.core.primitives)
    domain: DomainId
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    location: SourceLocation | None = None
    call: CallSpec | None = None
    source_domain: DomainId | None = None  # reduce: the child Domain it reads
    name: str = ""
    arg_index: int = 0
    params: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class CallSpec:
    """One application of a module inside ``forward``: a node of the plan.

    ``id`` is stable across runs of the same program: the module's dotted name,
    suffixed ``@k`` for its k-th call site after the first.
    """

    id: CallId
    module: str
    static_kwargs: tuple[tuple[str, Any], ...] = ()
    num_outputs: int = 1
    keywords: tuple[str, ...] = ()
    """Names of the last ``len(keywords)`` inputs, passed to the UDF by keyword."""


@dataclass(frozen=True, slots=True)
class Plan:
    """The immutable result of compiling a pipeline program."""

    nodes: tuple[NodeSpec, ...]
    ports: tuple[PortSpec, ...]
    domains: tuple[DomainSpec, ...]
    modules: tuple[ModuleSpec, ...]
    input_ports: tuple[int, ...]
    output_ports: tuple[int, ...]
    output_names: tuple[str, ...]
    consumers: tuple[tuple[int, ...], ...]  # port id -> consuming node ids
    name: str = "pipeline"

    # -- lookups ---------------------------------------------------------------
    def domain(self, domain_id: DomainId) -> DomainSpec:
        for d in self.domains:
            if d.id == domain_id:
                return d
        raise PlanLookupError(f"the plan has no Domain {domain_id!r}")

    def module(self, name: str) -> ModuleSpec:
        for m in self.modules:
            if m.name == name:
                return m
        raise PlanLookupError(f"the plan has no module {name!r}")

    @property
    def calls(self) -> tuple[NodeSpec, ...]:
        """The call nodes, in plan (trace) order."""
        return tuple(n for n in self.nodes if n.kind is NodeKind.CALL)

    def call_node(self, call_id: CallId) -> NodeSpec:
        for n in self.nodes:
            if n.call is not None and n.call.id == call_id:
                return n
        raise PlanLookupError(f"the plan has no Call {call_id!r}")

    def feeders(self) -> dict[CallId, tuple[CallId, ...]]:
        """Each Call's nearest upstream Calls: whose outputs reach its inputs through the
        structural primitives only (expand, reduce, filter, broadcast), in plan order."""
        by_node = {n.id: n for n in self.nodes}
        out: dict[CallId, tuple[CallId, ...]] = {}
        for node in self.calls:
            assert node.call is not None
            found: dict[CallId, None] = {}
            todo = [self.ports[p].producer for p in node.inputs]
            seen: set[int] = set()
            while todo:
                producer = by_node[todo.pop()]
                if producer.id in seen:
                    continue
                seen.add(producer.id)
                if producer.call is not None:
                    found[producer.call.id] = None
                else:
                    todo.extend(self.ports[p].producer for p in producer.inputs)
            out[node.call.id] = tuple(sorted(found))
        return out

    def options(self, call_id: CallId) -> ModuleOptions:
        node = self.call_node(call_id)
        assert node.call is not None
        return self.module(node.call.module).options

    # -- description -----------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """A JSON/msgpack-able description (no user code) of the plan's structure."""
        return {
            "name": self.name,
            "domains": [[d.id, d.parent, d.depth, d.expand_node] for d in self.domains],
            "ports": [[p.id, p.name, p.domain, p.producer, p.index] for p in self.ports],
            "nodes": [
                {
                    "id": n.id,
                    "kind": str(n.kind),
                    "domain": n.domain,
                    "inputs": list(n.inputs),
                    "outputs": list(n.outputs),
                    "call": None
                    if n.call is None
                    else {
                        "id": n.call.id,
                        "module": n.call.module,
                        "num_outputs": n.call.num_outputs,
                        # only when used, so that older plans keep their fingerprint
                        **({"keywords": list(n.call.keywords)} if n.call.keywords else {}),
                    },
                    "source_domain": n.source_domain,
                    "name": n.name,
                    "arg_index": n.arg_index,
                    "line": None if n.location is None else str(n.location),
                    # only when used, so that older plans keep their fingerprint
                    **({"params": [list(p) for p in n.params]} if n.params else {}),
                }
                for n in self.nodes
            ],
            "modules": [
                {
                    "name": m.name,
                    "target": m.target_name,
                    "options": {
                        "replicas": m.options.replicas,
                        "batch_size": m.options.batch_size,
                        "max_attempts": m.options.max_attempts,
                        "policy": m.options.policy.value,
                        "num_outputs": m.options.num_outputs,
                        "batched": m.options.batched,
                        # only when used, so that older plans keep their fingerprint
                        **({"max_replicas": m.options.max_replicas}
                           if m.options.sizes_itself else {}),
                        **({"keep_values": True} if m.options.keep_values else {}),
                    },
                }
                for m in self.modules
            ],
            "inputs": list(self.input_ports),
            "outputs": list(self.output_ports),
            "output_names": list(self.output_names),
        }

    @classmethod
    def from_description(cls, desc: dict[str, Any]) -> Plan:
        """Rebuild a structure-only Plan (no user code) from :meth:`describe`."""
        modules = tuple(
            ModuleSpec(
                name=m["name"],
                target=None,
                options=ModuleOptions(
                    replicas=m["options"]["replicas"],
                    batch_size=m["options"]["batch_size"],
                    max_attempts=m["options"]["max_attempts"],
                    policy=Policy(m["options"]["policy"]),
                    num_outputs=m["options"]["num_outputs"],
                    batched=m["options"]["batched"],
                    max_replicas=m["options"].get("max_replicas"),
                    keep_values=bool(m["options"].get("keep_values", False)),
                ),
                target_name=m["target"],
            )
            for m in desc["modules"]
        )
        nodes = []
        for n in desc["nodes"]:
            call = n["call"]
            loc = None
            if n["line"]:
                file, _, line = n["line"].rpartition(":")
                loc = SourceLocation(file, int(line))
            nodes.append(
                NodeSpec(
                    id=n["id"],
                    kind=node_kind(n["kind"]),
                    domain=n["domain"],
                    inputs=tuple(n["inputs"]),
                    outputs=tuple(n["outputs"]),
                    location=loc,
                    call=None
                    if call is None
                    else CallSpec(call["id"], call["module"], (), call["num_outputs"],
                                  tuple(call.get("keywords", ()))),
                    source_domain=n["source_domain"],
                    name=n["name"],
                    arg_index=n["arg_index"],
                    params=tuple((k, v) for k, v in n.get("params", ())),
                )
            )
        ports = tuple(PortSpec(p[0], p[1], p[2], p[3], p[4]) for p in desc["ports"])
        consumers: list[list[int]] = [[] for _ in ports]
        for node in nodes:
            for port in node.inputs:
                consumers[port].append(node.id)
        return cls(
            nodes=tuple(nodes),
            ports=ports,
            domains=tuple(DomainSpec(d[0], d[1], d[2], d[3]) for d in desc["domains"]),
            modules=modules,
            input_ports=tuple(desc["inputs"]),
            output_ports=tuple(desc["outputs"]),
            output_names=tuple(desc["output_names"]),
            consumers=tuple(tuple(c) for c in consumers),
            name=desc["name"],
        )

    def fingerprint(self) -> str:
        """A stable hash of the plan's structure (not of user code)."""
        desc = self.describe()
        for node in desc["nodes"]:
            node.pop("line", None)
        blob = orjson.dumps(desc, option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(blob).hexdigest()[:16]

    def explain(self) -> str:
        """A readable listing of Domains, Calls and edges."""
        lines = [f"plan {self.name} (fingerprint {self.fingerprint()})", "domains:"]
        for d in self.domains:
            indent = "  " * (d.depth + 1)
            origin = "" if d.expand_node is None else f"  (created by node {d.expand_node})"
            lines.append(f"{indent}{d.id}{origin}")
        lines.append("nodes:")
        for n in self.nodes:
            ins = ", ".join(self.ports[p].name for p in n.inputs)
            outs = ", ".join(self.ports[p].name for p in n.outputs)
            what = str(n.kind) if n.call is None else f"call {n.call.id}"
            where = "" if n.location is None else f"   # {n.location}"
            lines.append(f"  [{n.id}] {what:<24} {n.domain:<12} ({ins}) -> ({outs}){where}")
        lines.append("pools:")
        for m in self.modules:
            o = m.options
            needs = ", ".join([f"num_cpus={o.num_cpus:g}"]
                              + ([f"num_gpus={o.num_gpus:g}"] if o.num_gpus else [])
                              + [f"{key}={amount:g}" for key, amount in o.resources])
            lines.append(f"  {m.name:<24} replicas={o.replicas_text:<10} "
                         f"batch_size={o.batch_size:<5} {needs}")
        lines.append(
            "outputs: "
            + ", ".join(
                f"{name}={self.ports[p].name}"
                for name, p in zip(self.output_names, self.output_ports)
            )
        )
        return "\n".join(lines)


def override_plan(plan: Plan, batch_size: int | None, policy: Policy | None) -> Plan:
    """The plan with every module's batch size and/or policy replaced (the executor's knobs)."""
    if batch_size is None and policy is None:
        return plan
    modules = []
    for module in plan.modules:
        options = module.options
        if batch_size is not None:
            options = replace(options, batch_size=batch_size)
        if policy is not None:
            options = replace(options, policy=policy)
        modules.append(replace(module, options=options))
    return replace(plan, modules=tuple(modules))


__all__ = [
    "ROOT",
    "CallSpec",
    "DomainSpec",
    "ModuleOptions",
    "ModuleSpec",
    "NodeKind",
    "NodeSpec",
    "Plan",
    "Policy",
    "PortSpec",
    "SourceLocation",
    "node_kind",
    "override_plan",
]
