"""What a primitive is, and what the tracer, compiler, kernel and reference give it.

A primitive is one :class:`Primitive` object (see the package docstring for the
protocol); in the kernel each of its plan nodes becomes one :class:`KernelNode`, whose
handlers the kernel calls as ``handler(kernel, path, value)`` when an input Port of the
node resolves for an Entity. In the reference interpreter its nodes are evaluated by
:meth:`Primitive.evaluate` over an :class:`Evaluation`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rayorch.core.compile_errors import LocatedCompileError
from rayorch.core.ids import DomainId, Path
from rayorch.core.outcome import Item, Outcome

if TYPE_CHECKING:
    from rayorch.core.plan import NodeSpec, Plan
    from rayorch.core.plan_tables import PlanTables
    from rayorch.core.propagation import ItemPropagation


class KernelNode:
    """One plan node of a primitive, as one kernel runs it (its routing facts and handlers).

    A node that keeps a countdown in ``kernel._reduce_left[(node id, parent)]`` answers
    :meth:`countdown` so that ``Kernel.validate`` can check it.
    """

    __slots__ = ()
    kind = ""

    def countdown(self, kernel: ItemPropagation, parent: Path) -> tuple[int, int] | None:
        """``(Items still pending, output Port)`` that a countdown of ``parent`` must match."""
        return None


class Primitive:
    """The meaning of one structural primitive (one node kind), in one object.

    * tracing: the module's ``F.*`` function calls its own ``trace`` method, which makes
      every check that can be made at that line of ``forward`` and adds the node through
      :meth:`rayorch.core.tracer.Trace.add_node`;
    * :meth:`lint`: the checks of a built plan's node (``compiler.lint_plan``);
    * :meth:`route`: the node's part of a kernel: a :class:`KernelNode` whose handlers it
      routes on its input Ports (``tables.route``) or on the Expansions of a child Domain
      (``tables.observe_expansion``);
    * :meth:`evaluate`: the node for every Entity of its Domain, in the reference
      interpreter (``rayorch.core.reference``).
    """

    kind = ""

    def lint(self, plan: Plan, node: NodeSpec) -> None:
        """Raise a located compile error if ``node`` breaks the primitive's rules."""

    def route(self, node: NodeSpec, tables: PlanTables) -> KernelNode:
        raise NotImplementedError

    def evaluate(self, node: NodeSpec, ev: Evaluation) -> None:
        raise NotImplementedError


@dataclass
class Evaluation:
    """The state of one reference evaluation, as the primitives read and extend it."""

    plan: Plan
    items: dict[tuple[int, Path], Item]
    entities: dict[DomainId, list[Path]]
    expansions: dict[tuple[DomainId, Path], tuple[str, int]]
    origin: dict[tuple[int, Path], str] = field(default_factory=dict)
    """Which Grain a Failed Item came from."""
    failed_expansions: dict[tuple[DomainId, Path], Item] = field(default_factory=dict)
    """What the consumers of a failed Expansion's parent get (e.g. its reduces)."""

    def cause_of(self, port: int, path: Path) -> str:
        return self.origin.get((port, path), "an input")

    def suppressed_by(self, item: Item, port: int, path: Path) -> Item:
        """The Suppressed Item that ``item`` (Failed or Suppressed, of ``port``) causes."""
        return suppressed(item, self.cause_of(port, path))

    def parent_domain(self, domain: DomainId) -> DomainId:
        parent = self.plan.domain(domain).parent
        assert parent is not None
        return parent


def malformed(
    error: type[LocatedCompileError], node: NodeSpec, problem: str
) -> LocatedCompileError:
    """The lint error for a node that no tracing of ``forward`` makes (a hand-built plan)."""
    return error(problem, node.location, "rebuild the plan with compile_pipeline")


def bad(item: Item) -> bool:
    """Failed or Suppressed: what makes a consumer's Item Suppressed."""
    return item.outcome is Outcome.FAILED or item.outcome is Outcome.SUPPRESSED


def suppressed(cause_item: Item, origin: str) -> Item:
    """The Suppressed Item a Failed or Suppressed input causes downstream (reference)."""
    if cause_item.outcome is Outcome.SUPPRESSED:
        return cause_item
    return Item(Outcome.SUPPRESSED, None, f"{origin} failed: {cause_item.cause}")




__all__ = ["Evaluation", "KernelNode", "Primitive", "bad", "malformed", "suppressed"]
