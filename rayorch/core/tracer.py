"""Symbolic tracing of ``forward``: Ports, the active trace, and node recording.

Every check that can be made when a node is created is made then, so the error points
at the exact line of ``forward`` that is wrong: here for inputs, Calls and outputs; for a
structural primitive by the primitive itself (its module in :mod:`rayorch.core.primitives`),
which adds its node through :meth:`Trace.add_node`.
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
    kind: str  # a NodeKind, or the kind of a primitive (rayorch.core.primitives)
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
    params: tuple[tuple[str, Any], ...] = ()


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
    memo: dict[Any, Any] = field(default_factory=dict)
    """What a primitive remembers across its uses in one tracing (expand: the Ports it
    expanded, so that expanding them again gives the same child Domain)."""
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

    def new_domain(self, parent: DomainId) -> DomainId:
        """A new child Domain of ``parent``, created by the node added next."""
        k = self.children_count.get(parent, 0)
        self.children_count[parent] = k + 1
        child = child_domain_id(parent, k)
        self.domain_parent[child] = parent
        self.domain_expand[child] = len(self.nodes)
        return child

    def producer(self, port: Port) -> TracedNode:
        """The node whose output ``port`` is."""
        return self.nodes[self.ports[port.id].producer]

    def own_all(self, location: SourceLocation | None, *named: tuple[Any, str]) -> list[Port]:
        """Check each ``(value, what)`` is a Port of this trace (``what`` names it in errors)."""
        return [self.own(value, what, location) for value, what in named]

    # -- node constructors (called by the public API) ---------------------------
    def add_node(
        self,
        kind: str,
        domain: DomainId,
        inputs: tuple[Port, ...],
        out_names: list[str],
        location: SourceLocation | None,
        *,
        source_domain: DomainId | None = None,
        params: tuple[tuple[str, Any], ...] = (),
    ) -> list[Port]:
        """Add a primitive's node (its checks made) with one output Port per name, in ``domain``.

        ``params`` are the node's constants (msgpack-able), kept in the plan.
        """
        node = TracedNode(len(self.nodes), kind, domain, tuple(p.id for p in inputs),
                          location=location, source_domain=source_domain, params=params)
        return self._add_node(node, out_names, domain)

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
