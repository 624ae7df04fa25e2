"""Compile a pipeline program into an immutable, checked :class:`Plan`.

``compile_pipeline`` traces ``forward`` once with symbolic Ports (checks made at
each node point at their line), then checks the whole program (outputs, unused
inputs, duplicate names) and lints the resulting graph (acyclic, Domains; each
primitive's node by the primitive's own ``lint``, see :mod:`rayorch.core.primitives`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rayorch.core import compile_errors as ce
from rayorch.core.ast_lock import signature as locked_signature
from rayorch.core.ids import ROOT
from rayorch.core.plan import (
    CallSpec,
    DomainSpec,
    ModuleSpec,
    NodeKind,
    NodeSpec,
    Plan,
    PortSpec,
    SourceLocation,
)
from rayorch.core.primitives import primitive
from rayorch.core.tracer import Port, Trace

if TYPE_CHECKING:
    from rayorch.core.program import PipelineBase


def _forward_location(pipeline: PipelineBase) -> SourceLocation | None:
    forward = type(pipeline).forward
    try:
        file = inspect.getsourcefile(forward) or "<unknown>"
        lines, first = inspect.getsourcelines(forward)
    except (OSError, TypeError):
        return None
    return SourceLocation(file, first, lines[0].strip() if lines else "")


def _module_names(pipeline: PipelineBase) -> tuple[dict[int, str], list[ModuleSpec]]:
    names: dict[int, str] = {}
    specs: list[ModuleSpec] = []
    for dotted, module in pipeline.named_modules():
        other = names.get(id(module))
        if other is not None:
            raise ce.DuplicateNameError(
                f"one RayModule is registered under two names, {other!r} and {dotted!r}",
                _forward_location(pipeline),
                "assign each RayModule to one attribute; to share a pool, call the same "
                "attribute at several places in forward",
            )
        names[id(module)] = dotted
        specs.append(module.spec(dotted))
    return names, specs


def _input_names(pipeline: PipelineBase, location: SourceLocation | None) -> list[str]:
    params = list(locked_signature(pipeline.forward).parameters.values())
    names = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY):
            raise ce.ModuleDefinitionError(
                f"forward takes *args/**kwargs/keyword-only parameter {p.name!r}",
                location,
                "declare one positional parameter per input column: def forward(self, pdfs)",
            )
        names.append(p.name)
    if not names:
        raise ce.ModuleDefinitionError(
            "forward takes no input",
            location,
            "declare the source column: def forward(self, items)",
        )
    return names


def _outputs(result: Any) -> list[tuple[str, Any]]:
    if isinstance(result, Port):
        return [("output", result)]
    if isinstance(result, Mapping):
        return [(str(k), v) for k, v in result.items()]
    if isinstance(result, Sequence) and not isinstance(result, (str, bytes)):
        return [(f"output{i}", v) for i, v in enumerate(result)]
    return []


def compile_pipeline(pipeline: PipelineBase) -> Plan:
    """Trace and check ``pipeline.forward``; raise a CompileError subclass if invalid."""
    fwd_location = _forward_location(pipeline)
    module_names, specs = _module_names(pipeline)
    input_names = _input_names(pipeline, fwd_location)
    trace = Trace(module_names)
    with trace:
        inputs = [trace.add_input(name, i) for i, name in enumerate(input_names)]
        result = pipeline.forward(*inputs)
        outputs = _outputs(result)
        if not outputs:
            raise ce.NoOutputError(
                f"forward returned {type(result).__name__}, not a Port",
                fwd_location,
                "return the final Port (or a tuple/dict of Ports) from forward",
            )
        seen: set[str] = set()
        for name, value in outputs:
            if name in seen:
                raise ce.DuplicateNameError(
                    f"two outputs are named {name!r}",
                    fwd_location,
                    "give every output its own name",
                )
            seen.add(name)
            trace.add_output(value, name, fwd_location)
    consumed = {p for node in trace.nodes for p in node.inputs}
    for port in inputs:
        if port.id not in consumed:
            raise ce.UnusedInputError(
                f"input {port.name!r} of forward is never used",
                fwd_location,
                "use every forward argument, or remove the unused one",
            )
    plan = _build_plan(type(pipeline).__name__, trace, specs)
    lint_plan(plan)
    return plan


def _build_plan(name: str, trace: Trace, specs: list[ModuleSpec]) -> Plan:
    nodes = []
    used_modules: set[str] = set()
    for n in trace.nodes:
        call = None
        if n.kind is NodeKind.CALL:
            call = CallSpec(n.call_id, n.module, n.static_kwargs, n.num_outputs, n.keywords)
            used_modules.add(n.module)
        nodes.append(
            NodeSpec(
                id=n.id,
                kind=n.kind,
                domain=n.domain,
                inputs=n.inputs,
                outputs=n.outputs,
                location=n.location,
                call=call,
                source_domain=n.source_domain,
                name=n.name,
                arg_index=n.arg_index,
                params=n.params,
            )
        )
    ports = tuple(
        PortSpec(i, p.name, p.domain, p.producer, p.index) for i, p in enumerate(trace.ports)
    )
    consumers: list[list[int]] = [[] for _ in ports]
    for node in nodes:
        for port in node.inputs:
            consumers[port].append(node.id)
    domains = tuple(
        DomainSpec(d, parent, d.count("/"), trace.domain_expand[d])
        for d, parent in trace.domain_parent.items()
    )
    outputs = [n for n in nodes if n.kind is NodeKind.OUTPUT]
    return Plan(
        nodes=tuple(nodes),
        ports=ports,
        domains=domains,
        modules=tuple(s for s in specs if s.name in used_modules),
        input_ports=tuple(n.outputs[0] for n in nodes if n.kind is NodeKind.INPUT),
        output_ports=tuple(n.inputs[0] for n in outputs),
        output_names=tuple(n.name for n in outputs),
        consumers=tuple(tuple(c) for c in consumers),
        name=name,
    )


def lint_plan(plan: Plan) -> None:
    """Check a plan's graph: ports exist, Domains agree, no cycle."""
    domain_ids = {d.id for d in plan.domains}
    for node in plan.nodes:
        for port in (*node.inputs, *node.outputs):
            if not 0 <= port < len(plan.ports):
                raise ce.ModuleDefinitionError(
                    f"node {node.id} refers to unknown port {port}",
                    node.location,
                    "rebuild the plan with compile_pipeline",
                )
        if node.domain not in domain_ids:
            raise ce.ModuleDefinitionError(
                f"node {node.id} is in unknown Domain {node.domain!r}",
                node.location,
                "rebuild the plan with compile_pipeline",
            )
        if node.kind == NodeKind.CALL:
            domains = {plan.ports[p].domain for p in node.inputs}
            if domains != {node.domain}:
                raise ce.DomainMismatchError(
                    f"call node {node.id} mixes Domains {sorted(domains)}",
                    node.location,
                    "use F.broadcast or F.reduce to bring inputs into one Domain",
                )
        elif node.kind == NodeKind.OUTPUT:
            if plan.ports[node.inputs[0]].domain != ROOT:
                raise ce.OutputDomainError(
                    f"output {node.name!r} is not in the root Domain",
                    node.location,
                    "reduce it to the root Domain with F.reduce",
                )
        elif node.kind != NodeKind.INPUT:
            primitive(node.kind).lint(plan, node)
    _check_acyclic(plan)


def _check_acyclic(plan: Plan) -> None:
    indegree = {n.id: 0 for n in plan.nodes}
    successors: dict[int, list[int]] = {n.id: [] for n in plan.nodes}
    for node in plan.nodes:
        producers = {plan.ports[p].producer for p in node.inputs}
        indegree[node.id] = len(producers)
        for producer in producers:
            successors[producer].append(node.id)
    ready = [nid for nid, deg in indegree.items() if deg == 0]
    visited = 0
    while ready:
        nid = ready.pop()
        visited += 1
        for succ in successors[nid]:
            indegree[succ] -= 1
            if indegree[succ] == 0:
                ready.append(succ)
    if visited != len(plan.nodes):
        stuck = min(nid for nid, deg in indegree.items() if deg > 0)
        node = plan.nodes[stuck]
        raise ce.CycleError(
            f"the plan has a cycle through node {stuck} ({node.kind})",
            node.location,
            "a Port can only be used after the node producing it; rebuild the plan with "
            "compile_pipeline",
        )
