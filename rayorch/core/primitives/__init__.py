"""The structural primitives (``F.*``) and their registry: each primitive owns its meaning.

One module per primitive holds everything that primitive means, as one
:class:`~rayorch.core.primitives.base.Primitive` object (in the way ``torch.fx``
dispatches per node kind):

* its public ``F.*`` function(s) and their trace-time checks (``trace``), which add its
  node through the generic :meth:`rayorch.core.tracer.Trace.add_node`;
* ``lint(plan, node)``: the compile checks of a built plan (``compiler.lint_plan``);
* ``route(node, tables)``: its kernel propagation, a
  :class:`~rayorch.core.primitives.base.KernelNode` whose handlers
  (``handler(kernel, path, value)``) are routed on its input Ports, or told when an
  Expansion of a child Domain closes or creates a child (``tables.observe_expansion``);
* ``evaluate(node, ev)``: its reference semantics (``rayorch.core.reference``).

The tracer, the compiler, the kernel's routing tables (``rayorch.core.plan_tables``)
and the reference interpreter know no primitive by name: they call :func:`primitive`
with a node's kind. The graph's own nodes (input, call, output) stay with them.

**A new primitive touches 3 files:**

1. ``rayorch/core/primitives/<name>.py``: its ``F.*`` function(s) and its ``Primitive``
   (kind: a new name; constants in ``params=`` of ``Trace.add_node``, kept in the plan
   and its description; its own compile error class may subclass
   ``compile_errors.LocatedCompileError``);
2. this file: import it, add it to ``PRIMITIVES`` and its functions to ``__all__``
   (``F``, i.e. ``rayorch.core.functional``, re-exports ``__all__``);
3. its test (``tests/unit/test_primitive_registry.py`` shows one, ``F.fill``, defined and
   registered in the test file alone, run through the tracer, compiler, kernel and
   reference).

Counted against the code (``tests/unit/test_primitive_registry.py`` checks it): each
built-in primitive's kind (``NodeKind.EXPAND`` ...) is named only in its own module, and
the dispatchers (``tracer``, ``compiler.lint_plan``, ``plan_tables``, ``propagation``,
``reference``) call :func:`primitive`. Before this package a new primitive meant
``functional`` (its ``F.*``), ``tracer`` (``add_*`` and its checks), ``plan`` (a ``NodeKind``
member, fields), ``compile_errors``, ``plan_tables`` (its ``*Info`` and route),
``propagation`` (its handler and its name in ``bind``), ``kernel_audit`` (a countdown),
``reference`` (a branch of the ``if kind`` chain) and its tests: 9-10 files.
One reader outside the four concerns still knows two kinds by name: the lineage audit's
``PlanShape`` (``inspect/audit.py``) follows expand and reduce nodes to check Expansions; a
new primitive that creates or collects Domains would teach it too.
"""

from __future__ import annotations

from rayorch.core.errors import PlanLookupError
from rayorch.core.primitives.base import Primitive
from rayorch.core.primitives.broadcast import BROADCAST, broadcast
from rayorch.core.primitives.expand import EXPAND, expand, expand_aligned
from rayorch.core.primitives.filter import FILTER, filter
from rayorch.core.primitives.reduce import REDUCE, reduce, reduce_aligned

PRIMITIVES: dict[str, Primitive] = {p.kind: p for p in (EXPAND, REDUCE, FILTER, BROADCAST)}


def primitive(kind: str) -> Primitive:
    """The primitive of a node kind; a clear error for a kind no primitive registered."""
    found = PRIMITIVES.get(kind)
    if found is None:
        known = ", ".join(sorted(PRIMITIVES))
        raise PlanLookupError(
            f"the plan has a node of kind {kind!r}, which no primitive is registered for "
            f"(registered: {known}); a plan written by a newer rayorch needs that version")
    return found


__all__ = ["broadcast", "expand", "expand_aligned", "filter", "reduce", "reduce_aligned"]
