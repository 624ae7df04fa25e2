"""The compiler: one test per compile error (message checked), and valid plans."""

from __future__ import annotations

import re

import pytest

import rayorch as ro
from rayorch import F
from rayorch.core import compile_errors as ce
from rayorch.core.compiler import lint_plan
from rayorch.core.plan import NodeKind, NodeSpec, Plan

HERE = __file__.rsplit("/", 1)[-1]


def ident(xs: list[object]) -> list[object]:
    return list(xs)


def split(xs: list[int]) -> list[list[int]]:
    return [list(range(x)) for x in xs]


def pair(a: list[object], b: list[object]) -> list[object]:
    return list(zip(a, b))


def two(xs: list[int]) -> list[tuple[int, int]]:
    return [(x, -x) for x in xs]


def make(forward, **modules):  # type: ignore[no-untyped-def]
    """A pipeline class with the given modules and forward."""

    class Prog(ro.Pipeline):
        def __init__(self) -> None:
            super().__init__()
            for name, module in modules.items():
                setattr(self, name, module)

    Prog.forward = forward  # type: ignore[method-assign]
    return Prog()


def assert_located(err: pytest.ExceptionInfo[ro.CompileError], *fragments: str) -> None:
    msg = str(err.value)
    assert re.search(rf"{re.escape(HERE)}:\d+: in forward", msg), msg
    assert "\nfix: " in msg, msg
    for fragment in fragments:
        assert fragment in msg, msg


def test_bool_of_port_is_a_trace_error() -> None:
    def forward(self, xs):  # type: ignore[no-untyped-def]
        ys = self.a(xs)
        if ys:  # the line the error must name
            return ys
        return ys

    with pytest.raises(ro.TraceError) as err:
        make(forward, a=ro.RayModule(ident)).compile()
    assert_located(err, "bool() of Port", "if ys:", "F.filter")


def test_iterating_a_port_is_a_trace_error() -> None:
    def forward(self, xs):  # type: ignore[no-untyped-def]
        return [y for y in self.a(xs)]

    with pytest.raises(ce.SymbolicValueError) as err:
        make(forward, a=ro.RayModule(ident)).compile()
    assert_located(err, "iteration of Port")


def test_inputs_in_two_domains_suggest_broadcast_or_reduce() -> None:
    def forward(self, xs):  # type: ignore[no-untyped-def]
        kids = F.expand(self.split(xs))
        return F.reduce(self.pair(kids, xs))

    with pytest.raises(ce.DomainMismatchError) as err:
        make(forward, split=ro.RayModule(split), pair=ro.RayModule(pair)).compile()
    assert_located(err, "different Domains", "F.broadcast", "F.reduce", "self.pair(kids, xs)")


def test_broadcast_from_a_descendant_is_refused() -> None:
    def forward(self, xs):  # type: ignore[no-untyped-def]
        kids = F.expand(self.split(xs))
        F.broadcast(kids, like=xs)
        return xs

    with pytest.raises(ce.BroadcastError) as err:
        make(forward, split=ro.RayModule(split)).compile()
    assert_located(err, "is not an ancestor", "F.reduce")


def test_broadcast_within_one_domain_is_the_port_itself() -> None:
    def forward(self, xs):  # type: ignore[no-untyped-def]
        return self.pair(xs, F.broadcast(xs, like=xs))

    plan = make(forward, pair=ro.RayModule(pair)).compile()
    assert not [n for n in plan.nodes if n.kind is NodeKind.BROADCAST]
    (call,) = plan.calls
    assert call.inputs[0] == call.inputs[1]  # as upstream RayOrch: no node, the same Port


def test_reduce_of_the_root_domain_is_refused() -> None:
    def forward(self, xs):  # type: ignore[no-untyped-def]
        return self.a(F.reduce(self.a(xs)))

    with pytest.raises(ce.ReduceError) as err:
        make(forward, a=ro.RayModule(ident)).compile()
    assert_located(err, "root Domain", "downstream of an F.expand")


def test_expand_of_an_input_is_refused() -> None:
    def forward(self, xs):  # type: ignore[no-untyped-def]
        return F.reduce(self.a(F.expand(xs)))

    with pytest.raises(ce.ExpandError) as err:
        make(forward, a=ro.RayModule(ident)).compile()
    assert_located(err, "output of input, not of a Call")


def test_expand_of_a_reduce_is_refused() -> None:
    def forward(self, xs):  # type: ignore[no-untyped-def]
        kids = F.expand(self.split(xs))
        back = F.expand(F.reduce(kids))
        return F.reduce(self.a(back))

    with pytest.raises(ce.ExpandError) as err:
        make(forward, split=ro.RayModule(split), a=ro.RayModule(ident)).compile()
    assert_located(err, "output of reduce")


def test_no_output_is_refused() -> None:
    def forward(self, xs):  # type: ignore[no-untyped-def]
        self.a(xs)

    with pytest.raises(ce.NoOutputError) as err:
        make(forward, a=ro.RayModule(ident)).compile()
    assert_located(err, "returned NoneType", "return the final Port")


def test_output_in_a_child_domain_is_refused() -> None:
    def forward(self, xs):  # type: ignore[no-untyped-def]
        return self.a(F.expand(self.split(xs)))

    with pytest.raises(ce.OutputDomainError) as err:
        make(forward, split=ro.RayModule(split), a=ro.RayModule(ident)).compile()
    assert_located(err, "not in the root Domain", "F.reduce")


def test_unused_input_is_refused() -> None:
    def forward(self, xs, unused):  # type: ignore[no-untyped-def]
        return self.a(xs)

    with pytest.raises(ce.UnusedInputError) as err:
        make(forward, a=ro.RayModule(ident)).compile()
    assert_located(err, "'unused'", "never used")


def test_module_under_two_names_is_a_duplicate() -> None:
    shared = ro.RayModule(ident)

    def forward(self, xs):  # type: ignore[no-untyped-def]
        return self.a(xs)

    with pytest.raises(ce.DuplicateNameError) as err:
        make(forward, a=shared, b=shared).compile()
    assert_located(err, "'a' and 'b'")


def test_two_outputs_with_one_name_are_duplicates() -> None:
    class Named:
        def __init__(self, port: object) -> None:
            self.port = port

    def forward(self, xs):  # type: ignore[no-untyped-def]
        y = self.a(xs)
        return _Pairs([("out", y), ("out", y)])

    with pytest.raises(ce.DuplicateNameError) as err:
        make(forward, a=ro.RayModule(ident)).compile()
    assert_located(err, "two outputs are named 'out'")


class _Pairs(dict):  # type: ignore[type-arg]
    """A mapping that yields a repeated key, as a user-defined mapping might."""

    def __init__(self, pairs: list[tuple[str, object]]) -> None:
        super().__init__()
        self._pairs = pairs

    def items(self):  # type: ignore[no-untyped-def, override]
        return iter(self._pairs)


def test_constant_positional_argument_is_refused() -> None:
    def forward(self, xs):  # type: ignore[no-untyped-def]
        return self.pair(xs, [1, 2])

    with pytest.raises(ce.CallArgumentError) as err:
        make(forward, pair=ro.RayModule(pair)).compile()
    assert_located(err, "argument 2 of 'pair' must be a Port", "keyword arguments")


def test_port_as_keyword_argument_is_a_keyword_data_input() -> None:
    def forward(self, xs):  # type: ignore[no-untyped-def]
        return self.a(xs, other=xs, scale=2)

    plan = make(forward, a=ro.RayModule(ident)).compile()
    (node,) = plan.calls
    assert node.call is not None
    assert node.call.keywords == ("other",) and len(node.inputs) == 2
    assert node.call.static_kwargs == (("scale", 2),)


def test_port_inside_a_static_container_is_refused() -> None:
    def forward(self, xs):  # type: ignore[no-untyped-def]
        return self.a(xs, others=[xs])

    with pytest.raises(ce.CallArgumentError) as err:
        make(forward, a=ro.RayModule(ident)).compile()
    assert_located(err, "keyword argument 'others'", "container")


def test_unregistered_module_is_refused() -> None:
    def forward(self, xs):  # type: ignore[no-untyped-def]
        return ro.RayModule(ident)(xs)

    with pytest.raises(ce.ModuleDefinitionError) as err:
        make(forward).compile()
    assert_located(err, "not registered", "assign it to an attribute")


def test_filter_mask_from_another_domain_is_refused() -> None:
    def forward(self, xs):  # type: ignore[no-untyped-def]
        kids = F.expand(self.split(xs))
        return F.reduce(F.filter(kids, xs))

    with pytest.raises(ce.DomainMismatchError) as err:
        make(forward, split=ro.RayModule(split)).compile()
    assert_located(err, "F.filter", "mask in root")


def test_bad_module_options_are_refused_at_definition() -> None:
    with pytest.raises(ce.ModuleDefinitionError, match=r"batch_size must be >= 1"):
        ro.RayModule(ident, batch_size=0)
    with pytest.raises(ce.ModuleDefinitionError, match=r"policy='parent_bound'"):
        ro.RayModule(ident, policy="fastest")


def test_calling_a_module_outside_forward_is_refused() -> None:
    with pytest.raises(ce.ModuleDefinitionError, match=r"outside of Pipeline\.forward"):
        ro.RayModule(ident)([1, 2])


def test_cycle_in_a_hand_built_plan_is_found() -> None:
    def forward(self, xs):  # type: ignore[no-untyped-def]
        return self.a(self.b(xs))

    plan = make(forward, a=ro.RayModule(ident), b=ro.RayModule(ident)).compile()
    nodes = list(plan.nodes)
    b_node = nodes[1]  # call b reads the input; make it read a's output instead
    a_out = nodes[2].outputs[0]
    nodes[1] = NodeSpec(
        b_node.id,
        NodeKind.CALL,
        b_node.domain,
        (a_out,),
        b_node.outputs,
        b_node.location,
        b_node.call,
    )
    bad = Plan(
        tuple(nodes),
        plan.ports,
        plan.domains,
        plan.modules,
        plan.input_ports,
        plan.output_ports,
        plan.output_names,
        plan.consumers,
    )
    with pytest.raises(ce.CycleError, match="cycle through node"):
        lint_plan(bad)


# -- valid plans --------------------------------------------------------------------


def test_nested_fanout_document_page_region() -> None:
    def forward(self, docs):  # type: ignore[no-untyped-def]
        pages = F.expand(self.split(docs))
        regions = F.expand(self.split(pages))
        texts = self.ocr(regions, F.broadcast(docs, like=regions), lang="de")
        per_page = self.a(F.reduce(texts))
        return self.a(F.reduce(per_page))

    plan = make(
        forward,
        split=ro.RayModule(split),
        ocr=ro.RayModule(pair, batch_size=8),
        a=ro.RayModule(ident),
    ).compile()
    assert [d.id for d in plan.domains] == ["root", "root/0", "root/0/0"]
    calls = [n.call.id for n in plan.calls if n.call]
    assert calls == ["split", "split@1", "ocr", "a", "a@1"]
    ocr = plan.call_node("ocr")
    assert ocr.domain == "root/0/0"
    assert ocr.call is not None and ocr.call.static_kwargs == (("lang", "de"),)
    reduces = [n for n in plan.nodes if n.kind is NodeKind.REDUCE]
    assert [(r.source_domain, r.domain) for r in reduces] == [
        ("root/0/0", "root/0"),
        ("root/0", "root"),
    ]
    assert plan.options("split@1") is plan.options("split")  # one pool per module
    text = plan.explain()
    assert "call ocr" in text and "root/0/0" in text and "broadcast(docs)" in text


def test_multi_output_call_and_named_outputs() -> None:
    def forward(self, xs):  # type: ignore[no-untyped-def]
        pos, neg = self.two(xs)
        return {"pos": pos, "neg": self.a(neg)}

    plan = make(forward, two=ro.RayModule(two, num_outputs=2), a=ro.RayModule(ident)).compile()
    assert plan.output_names == ("pos", "neg")
    two_node = plan.call_node("two")
    assert len(two_node.outputs) == 2
    assert plan.ports[plan.output_ports[0]].name == "two.0"


def test_broadcast_into_grandchildren() -> None:
    def forward(self, docs):  # type: ignore[no-untyped-def]
        pages = F.expand(self.split(docs))
        regions = F.expand(self.split(pages))
        meta = F.broadcast(self.a(docs), like=regions)
        return F.reduce(F.reduce(self.pair(regions, meta)))

    plan = make(
        forward, split=ro.RayModule(split), a=ro.RayModule(ident), pair=ro.RayModule(pair)
    ).compile()
    bc = next(n for n in plan.nodes if n.kind is NodeKind.BROADCAST)
    assert bc.domain == "root/0/0"
    assert plan.ports[bc.inputs[0]].domain == "root"


def test_sub_pipeline_modules_get_dotted_names() -> None:
    class Stage(ro.Pipeline):
        def __init__(self) -> None:
            super().__init__()
            self.ocr = ro.RayModule(ident)

        def forward(self, xs):  # type: ignore[no-untyped-def]
            return self.ocr(xs)

    class Outer(ro.Pipeline):
        def __init__(self) -> None:
            super().__init__()
            self.stage = Stage()

        def forward(self, xs):  # type: ignore[no-untyped-def]
            return self.stage(xs)

    plan = Outer().compile()
    assert [m.name for m in plan.modules] == ["stage.ocr"]
    assert plan.calls[0].call is not None and plan.calls[0].call.id == "stage.ocr"


def test_description_round_trip_keeps_the_fingerprint() -> None:
    def forward(self, docs):  # type: ignore[no-untyped-def]
        return F.reduce(self.a(F.expand(self.split(docs))))

    plan = make(forward, split=ro.RayModule(split), a=ro.RayModule(ident)).compile()
    again = Plan.from_description(plan.describe())
    assert again.fingerprint() == plan.fingerprint()
    assert again.consumers == plan.consumers
