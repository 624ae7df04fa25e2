"""A primitive owns its meaning: one defined and registered here, in this file alone, is
traced, compiled, described, run by the kernel and evaluated by the reference.

``F.fill``-like ``fill(port, default=...)``: same Domain; a Dropped Item becomes
``Present(default)``; a Failed/Suppressed one makes the output Suppressed. The package
docstring of ``rayorch.core.primitives`` promises that a new primitive touches its
module, the registry and its test; this test is the module and the test, and registers
itself with ``monkeypatch`` instead of the registry line.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import rayorch as ro
from rayorch import F
from rayorch.core import compile_errors as ce
from rayorch.core.errors import PlanLookupError
from rayorch.core.items import Absent, suppressed_by
from rayorch.core.outcome import Outcome, present
from rayorch.core.plan import NodeKind, NodeSpec, Plan
from rayorch.core.primitives import PRIMITIVES
from rayorch.core.primitives.base import Evaluation, KernelNode, Primitive, bad, malformed
from rayorch.core.reference import evaluate
from rayorch.core.state import Kernel
from rayorch.core.tracer import Port, Trace, active_trace, caller_location
from rayorch.runtime.in_process import ExecutorOptions, execute

if TYPE_CHECKING:
    from rayorch.core.ids import Path as EntityPath
    from rayorch.core.plan_tables import PlanTables
    from rayorch.core.propagation import ItemPropagation


def fill(port: Any, default: Any) -> Port:
    return FILL.trace(active_trace("fill"), port, default)


class Filling(KernelNode):
    __slots__ = ("default", "output")
    kind = "fill"

    def __init__(self, node: NodeSpec) -> None:
        self.default = dict(node.params)["default"]
        self.output = node.outputs[0]

    def on_input(self, kernel: ItemPropagation, path: EntityPath, value: Any) -> None:
        if type(value) is Absent:
            value = self.default if value.outcome is Outcome.DROPPED else suppressed_by(value)
        kernel._resolve(self.output, path, value)


class Fill(Primitive):
    kind = "fill"

    def trace(self, trace: Trace, value: Any, default: Any) -> Port:
        location = caller_location()
        port = trace.own(value, "the argument of fill", location)
        return trace.add_node(self.kind, port.domain, (port,), [f"fill({port.name})"],
                              location, params=(("default", default),))[0]

    def lint(self, plan: Plan, node: NodeSpec) -> None:
        if plan.ports[node.inputs[0]].domain != node.domain:
            raise malformed(ce.DomainMismatchError, node, "fill changes Domain")

    def route(self, node: NodeSpec, tables: PlanTables) -> Filling:
        filling = Filling(node)
        tables.route(node.inputs[0], filling.on_input)
        return filling

    def evaluate(self, node: NodeSpec, ev: Evaluation) -> None:
        (port,) = node.inputs
        for path in ev.entities[node.domain]:
            item = ev.items[(port, path)]
            if bad(item):
                item = ev.suppressed_by(item, port, path)
            elif not item.present:
                item = present(dict(node.params)["default"])
            ev.items[(node.outputs[0], path)] = item


FILL = Fill()


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PRIMITIVES, FILL.kind, FILL)


def fan(counts: list[int]) -> list[list[int]]:
    return [list(range(c)) for c in counts]


def odd(pages: list[int]) -> list[Any]:
    return [ro.RecordFailure("page 7 is unreadable") if p == 7 else p % 2 == 1 for p in pages]


def square(pages: list[int]) -> list[int]:
    return [p * p for p in pages]


class Filled(ro.Pipeline):
    """expand -> filter (odd pages) -> fill (-1 for the others) -> square -> reduce."""

    def __init__(self) -> None:
        super().__init__()
        self.fan = ro.RayModule(fan, batch_size=2)
        self.odd = ro.RayModule(odd, batch_size=3)
        self.square = ro.RayModule(square, batch_size=4)

    def forward(self, counts: Any) -> Any:
        pages = F.expand(self.fan(counts))
        return F.reduce(self.square(fill(F.filter(pages, self.odd(pages)), default=-1)))


ROWS = [(4,), (0,), (9,), (1,)]
WANT = {0: [1, 1, 1, 9], 1: [], 3: [1]}  # page 7 of source 2 fails: its parent is Suppressed


def outcomes(outputs: dict[int, tuple[Any, ...]]) -> dict[int, Any]:
    return {i: items[0].value if items[0].present else items[0].outcome
            for i, items in outputs.items()}


@pytest.mark.usefixtures("registered")
def test_a_primitive_registered_alone_runs_in_the_kernel_and_the_reference_alike() -> None:
    plan = Filled().compile()
    assert [str(n.kind) for n in plan.nodes].count("fill") == 1
    want = {**WANT, 2: Outcome.SUPPRESSED}
    assert outcomes(evaluate(plan, ROWS).outputs) == want
    for seed in range(3):
        options = ExecutorOptions(seed=seed, random_order=True, validate=True, batch_size=seed + 1)
        assert outcomes(execute(plan, ROWS, options).outputs) == want, seed


@pytest.mark.usefixtures("registered")
def test_its_node_and_constants_survive_the_plan_description() -> None:
    plan = Filled().compile()
    again = Plan.from_description(plan.describe())
    assert again.fingerprint() == plan.fingerprint()
    [node] = [n for n in again.nodes if n.kind == "fill"]
    assert dict(node.params) == {"default": -1}
    kernel = Kernel(again)  # routes the rebuilt plan's fill node through the registry
    assert "fill" in {n.kind for n in kernel.tables.nodes.values()}


def test_a_plan_naming_an_unregistered_primitive_is_refused_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(PRIMITIVES, FILL.kind, FILL)
    desc = Filled().compile().describe()
    monkeypatch.delitem(PRIMITIVES, FILL.kind)
    with pytest.raises(PlanLookupError, match="'fill', which no primitive is registered"):
        Kernel(Plan.from_description(desc))


def test_outside_its_module_no_code_names_a_built_in_primitive() -> None:
    """The count the package docstring makes: each NodeKind.<primitive> is used in its own
    module only (the tracer, compiler, plan tables, kernel and reference dispatch by kind)."""
    root = Path(ro.__file__).parent
    built_in = {"EXPAND": "expand.py", "REDUCE": "reduce.py", "FILTER": "filter.py",
                "BROADCAST": "broadcast.py"}
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (isinstance(node, ast.Attribute) and node.attr in built_in
                    and isinstance(node.value, ast.Name) and node.value.id == "NodeKind"):
                found.setdefault(node.attr, set()).add(str(path.relative_to(root)))
    assert found == {k: {f"core/primitives/{v}"} for k, v in built_in.items()}
    assert set(PRIMITIVES) == {NodeKind[k] for k in built_in}
