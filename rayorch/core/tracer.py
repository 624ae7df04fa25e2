"""Symbolic tracing of ``forward``: Ports, the active trace, and node recording.

Every structural check that can be made when a node is created is made here, so
the error points at the exact line of ``forward`` that is wrong.
"""

from __future__ import annotations

import contextvars
import linecache
import os
import sys
from dataclasses import dataclass, field
from typing import Any, NoReturn

from rayorch.core import compile_errors as ce
from rayorch.core.ids import ROOT, DomainId, child_domain_id
from rayorch.core.plan import NodeKind, SourceLocation

_CORE_DIR = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_DIR = os.path.dirname(_CORE_DIR)
_ACTIVE: contextvars.ContextVar[Trace | None] = contextvars.ContextVar(
    "rayorch_trace", default=None
)


def caller_location() -> SourceLocation | None:
    """The first stack frame outside rayorch's own tracing code (a line of ``forward``)."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        in_core = filename.startswith(_CORE_DIR + os.sep)
        in_api = filename in (os.path.join(_PACKAGE_DIR, "pipeline.py"),)
        if not in_core and not in_api:
            code = linecache.getline(filename, frame.f_lineno).strip()
            return SourceLocation(frame.f_code.co_filename, frame.f_lineno, code)
        frame = frame.f_back  # type: ignore[assignment]
    return None


class Port:
    """A symbolic value in ``forward``: one column over all Entities of one Domain."""

    __slots__ = ("_trace", "id")

    def __init__(self, trace: Trace, port_id: int) -> None:
        self._trace = trace
        self.id = port_id

    @property
    def domain(self) -> DomainId:
        return self._trace.ports[self.id].domain

    @property
    def name(self) -> str:
        return self._trace.ports[self.id].name

    def __repr__(self) -> str:
        return f"Port({self.name!r}, domain={self.domain!r})"

    def _symbolic(self, what: str) -> NoReturn:
        raise ce.SymbolicValueError(
            f"{what} of Port {self.name!r}: a Port is symbolic while forward is traced, "
            "so it cannot drive Python control flow",
            caller_location(),
            "express per-record decisions inside a module (or with F.filter(port, mask)); "
            "forward only wires modules together",
        )

    def __bool__(self) -> bool:
        self._symbolic("bool()")

    def __iter__(self) -> NoReturn:
        self._symbolic("iteration")

    def __len__(self) -> int:
        self._symbolic("len()")

    def __getitem__(self, key: Any) -> NoReturn:
        self._symbolic("indexing")

    def __hash__(self) -> int:
        return hash((id(self._trace), self.id))


@dataclass(slots=True)
class TracedPort:
    name: str
    domain: DomainId
    producer: int
    index: int = 0


@dataclass(slots=True)
class TracedNode:
    id: int
    kind: NodeKind
    domain: DomainId
    inputs: tuple[int, ...]
    outputs: tuple[int, ...] = ()
    location: SourceLocation | None = None
    call_id: str = ""
    module: str = ""
    static_kwargs: tuple[tuple[str, Any], ...] = ()
    num_outputs: int = 1
    source_domain: DomainId | None = None
    name: str = ""
    arg_index: int = 0
    keywords: tuple[str, ...] = ()


def _holds_port(value: Any) -> bool:
    if isinstance(value, Port):
        return True
    if isinstance(value, dict):
        return any(_holds_port(k) or _holds_port(v) for k, v in value.items())
    if isinstance(value, (tuple, list, set, frozenset)):
        return any(_holds_port(v) for v in value)
    return False


@dataclass(slots=True)
class Trace:
    """The record of one tracing of ``forward``."""

    module_names: dict[int, str]  # id(RayModule) -> dotted name
    nodes: list[TracedNode] = field(default_factory=list)
    ports: list[TracedPort] = field(default_factory=list)
    domain_parent: dict[DomainId, DomainId | None] = field(default_factory=lambda: {ROOT: None})
    domain_expand: dict[DomainId, int | None] = field(default_factory=lambda: {ROOT: None})
    children_count: dict[DomainId, int] = field(default_factory=dict)
    call_sites: dict[str, int] = field(default_factory=dict)
    expanded: dict[tuple[int, ...], list[Port]] = field(default_factory=dict)
    _token: contextvars.Token[Trace | None] | None = None

    # -- activation --------------------------------------------------------------
    def __enter__(self) -> Trace:
        self._token = _ACTIVE.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _ACTIVE.reset(self._token)
            self._token = None

    # -- helpers -----------------------------------------------------------------
    def is_ancestor(self, ancestor: DomainId, domain: DomainId) -> bool:
        """True if ``ancestor`` is a strict ancestor of ``domain``."""
        parent = self.domain_parent.get(domain)
        while parent is not None:
            if parent == ancestor:
                return True
            parent = self.domain_parent.get(parent)
        return False

    def _new_port(self, name: str, domain: DomainId, producer: int, index: int = 0) -> Port:
        self.ports.append(TracedPort(name, domain, producer, index))
        return Port(self, len(self.ports) - 1)

    def _add_node(self, node: TracedNode, out_names: list[str], domain: DomainId) -> list[Port]:
        self.nodes.append(node)
        outs = [self._new_port(n, domain, node.id, i) for i, n in enumerate(out_names)]
        node.outputs = tuple(p.id for p in outs)
        return outs

    def own(self, value: Any, what: str, location: SourceLocation | None) -> Port:
        """Check ``value`` is a Port of this trace."""
        if isinstance(value, Port) and value._trace is self:
            return value
        if isinstance(value, Port):
            raise ce.CallArgumentError(
                f"{what} is a Port from another tracing of forward",
                location,
                "use only Ports created inside this forward",
            )
        raise ce.CallArgumentError(
            f"{what} must be a Port, got {type(value).__name__} {value!r:.60}",
            location,
            "pass constants as keyword arguments of the call (they reach the module as "
            "static keyword arguments), and Ports positionally",
        )

    # -- node constructors (called by the public API) ---------------------------
    def add_input(self, name: str, arg_index: int) -> Port:
        node = TracedNode(len(self.nodes), NodeKind.INPUT, ROOT, (), name=name, arg_index=arg_index)
        return self._add_node(node, [name], ROOT)[0]

    def add_call(
        self, module_key: int, args: tuple[Any, ...], kwargs: dict[str, Any], num_outputs: int
    ) -> list[Port]:
        location = caller_location()
        name = self.module_names.get(module_key)
        if name is None:
            raise ce.ModuleDefinitionError(
                "this RayModule is not registered on the pipeline",
                location,
                "create it in __init__ and assign it to an attribute "
                "(self.ocr = ro.RayModule(...))",
            )
        port_kwargs = {k: v for k, v in kwargs.items() if isinstance(v, Port)}
        static = {k: v for k, v in kwargs.items() if not isinstance(v, Port)}
        if not args and not port_kwargs:
            raise ce.CallArgumentError(
                f"call of {name!r} has no Port argument",
                location,
                "pass at least one Port (positionally or by keyword); "
                "every Call runs once per Entity of its Domain",
            )
        ports = [self.own(a, f"argument {i + 1} of {name!r}", location) for i, a in enumerate(args)]
        ports += [self.own(v, f"keyword argument {k!r} of {name!r}", location)
                  for k, v in port_kwargs.items()]
        for key, value in static.items():
            if _holds_port(value):
                raise ce.CallArgumentError(
                    f"keyword argument {key!r} of {name!r} holds a Port inside a container",
                    location,
                    "pass each Port directly as an argument (positionally or as key=port); "
                    "a container of Ports cannot be traced",
                )
        domains = {p.domain for p in ports}
        if len(domains) > 1:
            listing = ", ".join(f"{p.name} in {p.domain}" for p in ports)
            raise ce.DomainMismatchError(
                f"the inputs of {name!r} live in different Domains ({listing})",
                location,
                "bring them into one Domain: F.broadcast(parent_port, like=child_port) to give "
                "children their ancestor's value, or F.reduce(child_port) to collect children",
            )
        site = self.call_sites.get(name, 0)
        self.call_sites[name] = site + 1
        call_id = name if site == 0 else f"{name}@{site}"
        domain = ports[0].domain
        node = TracedNode(
            len(self.nodes),
            NodeKind.CALL,
            domain,
            tuple(p.id for p in ports),
            location=location,
            call_id=call_id,
            module=name,
            static_kwargs=tuple(sorted(static.items())),
            num_outputs=num_outputs,
            keywords=tuple(port_kwargs),
        )
        out_names = (
            [call_id] if num_outputs == 1 else [f"{call_id}.{i}" for i in range(num_outputs)]
        )
        return self._add_node(node, out_names, domain)

    def add_expand(self, *values: Any) -> list[Port]:
        """One Expansion per parent: several Ports expand *aligned* into one child Domain."""
        location = caller_location()
        what = "F.expand" if len(values) == 1 else "F.expand_aligned"
        if not values:
            raise ce.ExpandError(f"{what} of no Port", location,
                                 "pass the Port(s) to expand: F.expand_aligned(xs, ys)")
        ports = [self.own(v, f"argument {i + 1} of {what}", location)
                 for i, v in enumerate(values)]
        producers = []
        for port in ports:
            producer = self.nodes[self.ports[port.id].producer]
            if producer.kind is not NodeKind.CALL:
                raise ce.ExpandError(
                    f"{what} of {port.name!r}, which is the output of {producer.kind.value}, "
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
        key = tuple(p.id for p in ports)
        if key in self.expanded:  # the same expansion again: the same child Domain (upstream)
            return self.expanded[key]
        taken = [p for p in ports if any(p.id in other for other in self.expanded)]
        if taken:
            raise ce.ExpandError(
                f"{what} of {taken[0].name!r}, which already belongs to another expansion",
                location,
                "expand a Port once (reuse the expanded Port), or declare the alignment once "
                "with F.expand_aligned",
            )
        parent = ports[0].domain
        k = self.children_count.get(parent, 0)
        self.children_count[parent] = k + 1
        child = child_domain_id(parent, k)
        node = TracedNode(len(self.nodes), NodeKind.EXPAND, child, tuple(p.id for p in ports),
                          location=location)
        self.domain_parent[child] = parent
        self.domain_expand[child] = node.id
        outs = self._add_node(node, [f"expand({p.name})" for p in ports], child)
        self.expanded[key] = outs
        return outs

    def add_reduce(self, value: Any, members: Any = None) -> Port:
        location = caller_location()
        port = self.own(value, "the argument of F.reduce", location)
        parent = self.domain_parent.get(port.domain)
        if parent is None:
            raise ce.ReduceError(
                f"F.reduce of {port.name!r}, which is in the root Domain (it has no parent)",
                location,
                "reduce only Ports of a child Domain, i.e. downstream of an F.expand",
            )
        inputs: tuple[int, ...] = (port.id,)
        if members is not None:
            member_port = self.own(members, "members= of F.reduce", location)
            if member_port.domain != port.domain:
                raise ce.DomainMismatchError(
                    f"F.reduce of {port.name!r} (in {port.domain}) with members "
                    f"{member_port.name!r} in {member_port.domain}",
                    location,
                    "members= must be a Port of the same child Domain as the reduced value",
                )
            if member_port.id != port.id:
                inputs = (port.id, member_port.id)
        node = TracedNode(
            len(self.nodes),
            NodeKind.REDUCE,
            parent,
            inputs,
            location=location,
            source_domain=port.domain,
        )
        return self._add_node(node, [f"reduce({port.name})"], parent)[0]

    def add_filter(self, value: Any, mask: Any) -> Port:
        location = caller_location()
        port = self.own(value, "the first argument of F.filter", location)
        mask_port = self.own(mask, "the mask of F.filter", location)
        if port.domain != mask_port.domain:
            raise ce.DomainMismatchError(
                f"F.filter of {port.name!r} (in {port.domain}) with a mask in {mask_port.domain}",
                location,
                "compute the mask in the same Domain as the Port, or move one of them with "
                "F.broadcast / F.reduce",
            )
        node = TracedNode(
            len(self.nodes),
            NodeKind.FILTER,
            port.domain,
            (port.id, mask_port.id),
            location=location,
        )
        return self._add_node(node, [f"filter({port.name})"], port.domain)[0]

    def add_broadcast(self, value: Any, like: Any) -> Port:
        location = caller_location()
        port = self.own(value, "the first argument of F.broadcast", location)
        like_port = self.own(like, "the like= argument of F.broadcast", location)
        if port.domain == like_port.domain:
            return port  # already there: the identity (as upstream RayOrch)
        if not self.is_ancestor(port.domain, like_port.domain):
            raise ce.BroadcastError(
                f"F.broadcast of {port.name!r} (in {port.domain}) like {like_port.name!r} "
                f"(in {like_port.domain}): {port.domain} is not an ancestor of {like_port.domain}",
                location,
                "broadcast only from a parent/ancestor Domain down to its descendants; within one "
                "Domain use the Port directly, upwards use F.reduce",
            )
        node = TracedNode(
            len(self.nodes),
            NodeKind.BROADCAST,
            like_port.domain,
            (port.id, like_port.id),
            location=location,
        )
        return self._add_node(node, [f"broadcast({port.name})"], like_port.domain)[0]

    def add_output(self, value: Any, name: str, location: SourceLocation | None) -> None:
        port = self.own(value, f"output {name!r} of forward", location)
        if port.domain != ROOT:
            raise ce.OutputDomainError(
                f"output {name!r} ({port.name}) is in Domain {port.domain}, not in the root Domain",
                location,
                "reduce it back to the root Domain with F.reduce (once per F.expand) so there "
                "is one result per source item",
            )
        node = TracedNode(
            len(self.nodes), NodeKind.OUTPUT, ROOT, (port.id,), location=location, name=name
        )
        self.nodes.append(node)


def active_trace(what: str) -> Trace:
    """The trace in progress, or a clear error if ``what`` is used outside forward."""
    trace = _ACTIVE.get()
    if trace is None:
        raise ce.ModuleDefinitionError(
            f"{what} was used outside of Pipeline.forward",
            caller_location(),
            "call modules and F.* only inside forward; run a pipeline with pipeline.run(inputs)",
        )
    return trace
