"""Reading a kernel without changing it: stories, snapshots, invariants, stuck runs.

Used by :class:`~rayorch.core.state.Kernel` (``story``, ``snapshot``, ``validate``,
``check_progress``) and by its ``InvalidTransition`` messages (the story of the object).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rayorch.core.errors import KernelError
from rayorch.core.facts import Fact
from rayorch.core.ids import Path, format_grain, format_path
from rayorch.core.plan_tables import PlanTables
from rayorch.core.vocabulary import BARRED, IN_FLIGHT, READY, SEALED

if TYPE_CHECKING:
    from rayorch.core.propagation import ItemPropagation


def snapshot_kernel(kernel: ItemPropagation) -> dict[str, Any]:
    """A kernel's complete fold state (not the pop cursor), for rebuild comparisons."""
    return {
        "items": dict(kernel._items),
        "phase": dict(kernel._phase),
        "gen": dict(kernel._gen),
        "uncharged": dict(kernel._uncharged),
        "sealed_by": dict(kernel._sealed_by),
        "barriers": dict(kernel._barriers),
        "expansions": dict(kernel._expansions),
        "reduce_left": dict(kernel._reduce_left),
        "pending": dict(kernel._pending),
        "sources": dict(kernel._sources),
        "admitted": kernel._admitted,
        "completed": list(kernel._completed),
        "completed_count": kernel._completed_count,
        "outputs": dict(kernel._outputs),
        "emitted": set(kernel._emitted),
        "ready": dict(kernel._ready),
        "suppressed": dict(kernel._suppressed),
        "in_flight": kernel._in_flight,
        "queues": {c: q.live() for c, q in kernel.queues.items()},
        "total": kernel._total,
        "run_completed": kernel._run_completed,
        "log": list(kernel.log),
    }


def story_filter(tables: PlanTables, obj: Any) -> Callable[[Fact], bool]:
    """A predicate selecting the facts that touch ``obj``.

    ``obj`` is a source index, an Entity path ``(i, ...)``, a Grain ``(call, path)`` or an
    Expansion ``(child_domain, parent_path)``.
    """
    if isinstance(obj, int):
        obj = (obj,)
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], str):
        name, path = obj[0], tuple(obj[1])
        if name in tables.calls:
            parent = path[:-1]

            def grain_story(fact: Fact) -> bool:
                call = getattr(fact, "call", None)
                if call != name:
                    return False
                own = getattr(fact, "path", None)
                return own == path or getattr(fact, "parent", None) == parent

            return grain_story
        calls = set(tables.domain_calls.get(name, ()))

        def expansion_story(fact: Fact) -> bool:
            if getattr(fact, "domain", None) == name and getattr(fact, "parent", None) == path:
                return True
            own = getattr(fact, "path", None)
            return getattr(fact, "call", None) in calls and own is not None and own[:-1] == path

        return expansion_story
    if isinstance(obj, tuple) and all(isinstance(p, int) for p in obj) and obj:
        entity: Path = obj

        def entity_story(fact: Fact) -> bool:
            if len(entity) == 1 and getattr(fact, "index", None) == entity[0]:
                return True
            return getattr(fact, "path", None) == entity or getattr(fact, "parent", None) == entity

        return entity_story
    raise KernelError(
        f"story() of {obj!r}: pass a source index, an Entity path (12, 3), a Grain "
        "('ocr', (12, 3)) or an Expansion ('root/0', (12,))"
    )


def story_of(log: list[Fact], tables: PlanTables, obj: Any) -> list[Fact]:
    """The facts of ``log`` that touch ``obj`` (see :func:`story_filter`), in order."""
    keep = story_filter(tables, obj)
    return [fact for fact in log if keep(fact)]


def _fail(problem: str) -> KernelError:
    return KernelError(f"kernel invariant violated: {problem}")


def validate_kernel(kernel: ItemPropagation) -> None:
    """Check the kernel's invariants; raise :class:`KernelError` naming the first one broken."""
    tables = kernel.tables
    items = kernel._items
    phases = kernel._phase
    counted = {c: 0 for c in tables.calls}
    in_flight = 0
    for grain, phase in phases.items():
        if phase == READY:
            counted[grain[0]] += 1
        elif phase == IN_FLIGHT:
            in_flight += 1
    if in_flight != kernel._in_flight:
        raise _fail(f"{in_flight} grains are in flight but the counter says {kernel._in_flight}")
    if counted != kernel._ready:
        raise _fail(f"ready grains per Call {counted} but the counters say {kernel._ready}")
    for call_id, queue in kernel.queues.items():
        recovery, fifo = queue.live()
        live = recovery + fifo
        if len(live) != len(set(live)) or len(live) != counted[call_id]:
            raise _fail(f"the queues of {call_id} hold {len(live)} live entries for "
                        f"{counted[call_id]} ready grains (every ready grain is queued once)")
    for source, pending in kernel._pending.items():
        unresolved = 0
        for domain, path in tables.entities(kernel._expansions, source):
            for port in tables.domain_ports[domain]:
                if (port, path) not in items:
                    unresolved += 1
            for call_id in tables.domain_calls[domain]:
                info = tables.calls[call_id]
                grain = (call_id, path)
                state = phases.get(grain)
                decided = [(port, path) in items for port in info.outputs]
                if state in (READY, IN_FLIGHT) and any(decided):
                    raise _fail(f"{format_grain(grain)} is ready/in flight but has outputs")
                if state in (SEALED, BARRED) and not all(decided):
                    raise _fail(f"{format_grain(grain)} is sealed but has pending outputs")
                if state in (READY, IN_FLIGHT) and any((p, path) not in items for p in info.inputs):
                    raise _fail(f"{format_grain(grain)} is ready/in flight with pending inputs")
                if state == READY and not info.root and (call_id, path[:-1]) in kernel._barriers:
                    raise _fail(f"{format_grain(grain)} is ready under a barrier")
        if unresolved != pending:
            raise _fail(f"source {source} has {unresolved} pending items, counter says {pending}")
    for (node_id, parent), left in kernel._reduce_left.items():
        node = tables.nodes[node_id]
        expected = node.countdown(kernel, parent)
        if expected is None:
            raise _fail(f"{node.kind} node {node_id} at {format_path(parent)} has a countdown")
        missing, output = expected
        if missing != left or (output, parent) in items:
            raise _fail(f"{node.kind} node {node_id} at {format_path(parent)}: {missing} members "
                        f"pending but the counter says {left}")
    if kernel._admitted != kernel._completed_count + len(kernel._pending):
        raise _fail(f"{kernel._admitted} sources admitted but {kernel._completed_count} "
                    f"complete and {len(kernel._pending)} pending")
    if kernel.keep_history:
        done = set(kernel._completed)
        if done & set(kernel._pending) or len(done) != len(kernel._completed):
            raise _fail("a source is both complete and pending, or completed twice")
        if set(kernel._sources) != done | set(kernel._pending):
            raise _fail("admitted sources != complete + pending sources")
        return
    active = set(kernel._sources)
    if not set(kernel._pending) <= active or any(s in kernel._emitted for s in active):
        raise _fail("a pending source is not admitted, or a delivered source was not forgotten")
    if kernel._admitted != len(active) + len(kernel._emitted):
        raise _fail(f"{kernel._admitted} sources admitted but {len(active)} active and "
                    f"{len(kernel._emitted)} delivered (forgotten)")


def describe_stuck(kernel: ItemPropagation) -> str:
    """Plain words on why unfinished sources cannot progress (for NoProgressError)."""
    tables = kernel.tables
    lines = [
        f"no grain is ready or in flight, but {len(kernel._pending)} admitted source(s) are "
        "unfinished; this is a kernel bug or facts were lost. Pending items:"
    ]
    for source in list(kernel._pending)[:5]:
        shown = 0
        for domain, path in tables.entities(kernel._expansions, source):
            for port in tables.domain_ports[domain]:
                if (port, path) not in kernel._items and shown < 8:
                    lines.append(f"  {tables.port_names[port]}[{format_path(path)}] ({domain})")
                    shown += 1
    lines.append("fix: run Kernel.validate() and audit the run's facts (rayorch audit)")
    return "\n".join(lines)


__all__ = ["describe_stuck", "snapshot_kernel", "story_filter", "story_of", "validate_kernel"]
