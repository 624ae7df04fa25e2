"""Per-Call ready queues and the two reservation policies (DESIGN 4.6).

Each Call has a FIFO of Grains in the order they became ready and a recovery queue
(Grains sent back by a physical failure) that is served first. Entries are removed
lazily, so a dispatch, a suppression or a seal never has to search a queue: a FIFO
entry is live while its Grain is ``READY`` at generation 0 (a retried Grain is never
served from the FIFO again); a recovery entry ``(grain, generation)`` is live while
the Grain is ``READY`` at that generation.

* ``elastic``: up to ``B`` live Grains from the FIFO head, whatever their parent; O(B).
* ``parent_bound``: up to ``B`` live siblings of the head Grain's parent, in ready order
  (a per-parent FIFO makes this O(B) as well).
* A retried Grain is dispatched **alone** (a batch of one): a record that poisons
  every batch it is in can then only exhaust its own attempts, never its batch-mates'.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rayorch.core.errors import KernelError
from rayorch.core.facts import Fact
from rayorch.core.ids import ROOT, CallId, GrainKey, Path, domain_depth, format_grain, format_path
from rayorch.core.outcome import Item, Outcome
from rayorch.core.plan import ModuleOptions, NodeKind, NodeSpec, Plan, Policy

if TYPE_CHECKING:
    from rayorch.core.state import Kernel

READY = 1  # the kernel's phase code for a ready Grain (GrainPhase.READY)


class CallQueue:
    """The ready and recovery queues of one Call."""

    __slots__ = ("by_parent", "call_id", "fifo", "generation", "parent_bound", "phase", "recovery")

    def __init__(
        self,
        call_id: CallId,
        policy: Policy,
        phase: dict[GrainKey, int],
        generation: dict[GrainKey, int],
    ) -> None:
        self.call_id = call_id
        self.parent_bound = policy is Policy.PARENT_BOUND
        # the kernel's tables, shared and only read here; generation holds only values > 0
        self.phase = phase
        self.generation = generation
        self.fifo: deque[GrainKey] = deque()
        self.recovery: deque[tuple[GrainKey, int]] = deque()
        self.by_parent: dict[Path, deque[GrainKey]] = {}

    def push(self, grain: GrainKey) -> None:
        """``grain`` became ready: append it to the FIFO."""
        self.fifo.append(grain)
        if self.parent_bound:
            parent = grain[1][:-1]
            queue = self.by_parent.get(parent)
            if queue is None:
                queue = self.by_parent[parent] = deque()
            queue.append(grain)

    def push_recovery(self, grain: GrainKey, generation: int) -> None:
        """``grain`` is ready again, as attempt ``generation``, after a physical failure."""
        self.recovery.append((grain, generation))

    def take(self, limit: int) -> list[GrainKey]:
        """Pop up to ``limit`` live Grains per the policy (a retried Grain goes alone)."""
        phase = self.phase
        generation = self.generation
        recovery = self.recovery
        while recovery:
            grain, gen = recovery.popleft()
            if phase.get(grain) == READY and generation.get(grain, 0) == gen:
                return [grain]
        fifo = self.fifo
        taken: list[GrainKey] = []
        if not self.parent_bound:
            popleft = fifo.popleft
            while fifo and len(taken) < limit:
                grain = popleft()
                if phase.get(grain) == READY and grain not in generation:
                    taken.append(grain)
            return taken
        while fifo:
            head = fifo[0]
            if phase.get(head) == READY and head not in generation:
                break
            fifo.popleft()
        else:
            return taken
        parent = head[1][:-1]
        siblings = self.by_parent[parent]
        while siblings and len(taken) < limit:
            grain = siblings.popleft()
            if phase.get(grain) == READY and grain not in generation:
                taken.append(grain)
        if not siblings:
            del self.by_parent[parent]
        return taken

    def live(self) -> tuple[list[GrainKey], list[GrainKey]]:
        """The live entries ``(recovery, fifo)`` in serving order (snapshots and checks)."""
        phase = self.phase
        generation = self.generation
        recovery = [
            g for g, gen in self.recovery
            if phase.get(g) == READY and generation.get(g, 0) == gen
        ]
        fifo = [g for g in self.fifo if phase.get(g) == READY and g not in generation]
        return recovery, fifo




# == the item representation ==========================================================
DROPPED_X = -1  # expansion states besides a child count
FAILED_X = -2


class Absent:
    """A terminal Item that is not Present (Dropped, Failed or Suppressed)."""

    __slots__ = ("cause", "origin", "outcome")

    def __init__(self, outcome: Outcome, cause: str | None, origin: str = "") -> None:
        self.outcome = outcome
        self.cause = cause
        self.origin = origin  # the Grain whose failure this is (Failed only)

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is Absent and other.outcome is self.outcome and other.cause == self.cause
        )

    def __hash__(self) -> int:
        return hash((self.outcome, self.cause))

    def __repr__(self) -> str:
        return f"Absent({self.outcome.value}, {self.cause!r})"


def suppressed_by(cause: Absent) -> Absent:
    """The Suppressed Item that a Failed or Suppressed input causes downstream."""
    if cause.outcome is Outcome.SUPPRESSED:
        return cause
    return Absent(Outcome.SUPPRESSED, f"{cause.origin or 'an input'} failed: {cause.cause}")


def as_item(value: Any) -> Item:
    """The public :class:`Item` of an internal value."""
    if type(value) is Absent:
        return Item(value.outcome, None, value.cause)
    return Item(Outcome.PRESENT, value)


# == the plan's routing tables =========================================================
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
    __slots__ = ("domain", "input", "node", "output")

    def __init__(self, node: NodeSpec) -> None:
        assert node.source_domain is not None
        self.node = node.id
        self.domain = node.source_domain  # the child Domain it reads
        self.input = node.inputs[0]
        self.output = node.outputs[0]


class BroadcastInfo:
    __slots__ = ("chain", "output", "source", "source_len")

    def __init__(self, node: NodeSpec, source_domain: str, chain: tuple[str, ...]) -> None:
        self.source = node.inputs[0]
        self.source_len = domain_depth(source_domain) + 1
        self.output = node.outputs[0]
        self.chain = chain  # Domains below the source's, down to the target Domain


class ExpandInfo:
    __slots__ = ("broadcasts", "domain", "output", "ports_per_child", "reduces")

    def __init__(self, node: NodeSpec, ports_per_child: int) -> None:
        self.domain = node.domain  # the child Domain it creates
        self.output = node.outputs[0]
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
                self._routes.append((node.inputs[0], "expand", expand))
            elif kind is NodeKind.REDUCE:
                reduce = ReduceInfo(node)
                reduces.append(reduce)
                self._routes.append((reduce.input, "reduce", reduce))
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


# == audit helpers: stories, invariants, stuck runs ====================================
def expansion_outcome(state: int) -> tuple[str, int]:
    if state == DROPPED_X:
        return "dropped", 0
    if state == FAILED_X:
        return "failed", 0
    return "succeeded", state


def broadcast_item(value: Any) -> Any:
    if type(value) is Absent and value.outcome is not Outcome.DROPPED:
        return suppressed_by(value)
    return value


def snapshot_kernel(kernel: Kernel) -> dict[str, Any]:
    """A kernel's complete fold state (not the pop cursor), for rebuild comparisons."""
    return {
        "items": dict(kernel._items),
        "phase": dict(kernel._phase),
        "gen": dict(kernel._gen),
        "sealed_by": dict(kernel._sealed_by),
        "barriers": dict(kernel._barriers),
        "expansions": dict(kernel._expansions),
        "reduce_left": dict(kernel._reduce_left),
        "pending": dict(kernel._pending),
        "sources": dict(kernel._sources),
        "completed": list(kernel._completed),
        "outputs": dict(kernel._outputs),
        "emitted": set(kernel._emitted),
        "ready": dict(kernel._ready),
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


def _fail(problem: str) -> KernelError:
    return KernelError(f"kernel invariant violated: {problem}")


def validate_kernel(kernel: Kernel) -> None:
    """Check the kernel's invariants; raise :class:`KernelError` naming the first one broken."""
    tables = kernel.tables
    items = kernel._items
    phases = kernel._phase
    counted = {c: 0 for c in tables.calls}
    in_flight = 0
    for grain, phase in phases.items():
        if phase == 1:
            counted[grain[0]] += 1
        elif phase == 2:
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
                if state in (1, 2) and any(decided):
                    raise _fail(f"{format_grain(grain)} is ready/in flight but has outputs")
                if state in (3, 4) and not all(decided):
                    raise _fail(f"{format_grain(grain)} is sealed but has pending outputs")
                if state in (1, 2) and any((p, path) not in items for p in info.inputs):
                    raise _fail(f"{format_grain(grain)} is ready/in flight with pending inputs")
                if state == 1 and not info.root and (call_id, path[:-1]) in kernel._barriers:
                    raise _fail(f"{format_grain(grain)} is ready under a barrier")
        if unresolved != pending:
            raise _fail(f"source {source} has {unresolved} pending items, counter says {pending}")
    for (node_id, parent), left in kernel._reduce_left.items():
        reduce = next(r for e in tables.expands.values() for r in e.reduces if r.node == node_id)
        count = kernel._expansions[(reduce.domain, parent)]
        missing = sum((reduce.input, (*parent, i)) not in items for i in range(count))
        if missing != left or (reduce.output, parent) in items:
            raise _fail(f"reduce node {node_id} at {format_path(parent)}: {missing} members "
                        f"pending but the counter says {left}")
    done = set(kernel._completed)
    if done & set(kernel._pending) or len(done) != len(kernel._completed):
        raise _fail("a source is both complete and pending, or completed twice")
    if set(kernel._sources) != done | set(kernel._pending):
        raise _fail("admitted sources != complete + pending sources")


def describe_stuck(kernel: Kernel) -> str:
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


__all__ = [
    "DROPPED_X",
    "FAILED_X",
    "Absent",
    "BroadcastInfo",
    "CallInfo",
    "CallQueue",
    "ExpandInfo",
    "PlanTables",
    "ReduceInfo",
    "as_item",
    "broadcast_item",
    "describe_stuck",
    "expansion_outcome",
    "snapshot_kernel",
    "story_filter",
    "suppressed_by",
    "validate_kernel",
]
