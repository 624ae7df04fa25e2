"""Random pipeline programs with deterministic, per-record UDF behaviours.

A program is a nested spec of blocks; :class:`RandomPipeline` turns it into a real
``ro.Pipeline`` (traced and compiled by the real compiler). Every UDF decides a
record's fate from a hash of (module, value): a RecordFailure, a GroupFailure, a
transient exception (fails the first ``TRANSIENT_FAILS`` invocations of that value,
then succeeds), a permanent exception, or a value.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

import rayorch as ro
from rayorch import F

MAX_ATTEMPTS = 5  # >= transient failures (1) + injected faults (1) + poisoned batch (1) + 2
TRANSIENT_FAILS = 1
FANOUT = (0, 1, 1, 2, 2, 2, 3, 3, 4, 6, 9)  # long-tailed children per parent, incl. 0


def mix(*values: Any) -> int:
    return zlib.crc32(repr(values).encode()) % 1_000_003


@dataclass(frozen=True)
class Behaviour:
    """Percent of records (by value hash) with each fate."""

    record_failure: int = 0
    group_failure: int = 0
    transient: int = 0
    permanent: int = 0


@dataclass
class Registry:
    """Invocation counters shared by every actor instance of one run."""

    counts: dict[tuple[str, Any], int] = field(default_factory=dict)

    def clear(self) -> None:
        self.counts.clear()


class Step:
    """One UDF: kind map | fanout | pred | combine, with a per-record fate."""

    def __init__(self, name: str, kind: str, behaviour: Behaviour, registry: Registry,
                 batched: bool, fan_cap: int = 9) -> None:
        self.name, self.kind, self.behaviour = name, kind, behaviour
        self.registry, self.batched, self.fan_cap = registry, batched, fan_cap

    def fate(self, row: tuple[Any, ...]) -> str:
        h = mix(self.name, "fate", row) % 100
        b = self.behaviour
        for fate, pct in (("record", b.record_failure), ("group", b.group_failure),
                          ("transient", b.transient), ("permanent", b.permanent)):
            if h < pct:
                return fate
            h -= pct
        return "ok"

    def value(self, row: tuple[Any, ...]) -> Any:
        if self.kind == "fanout":
            count = min(self.fan_cap, FANOUT[mix(self.name, "n", row) % len(FANOUT)])
            return [mix(self.name, row, i) for i in range(count)]
        if self.kind == "pred":
            return mix(self.name, "p", row) % 3 != 0
        if self.kind == "combine":
            value, children = row
            return mix(self.name, value, tuple(children))
        return mix(self.name, row)

    def one(self, row: tuple[Any, ...]) -> Any:
        """The result for one record; raises for transient/permanent failures."""
        fate = self.fate(row)
        if fate in ("transient", "permanent"):
            key = (self.name, row)
            seen = self.registry.counts.get(key, 0) + 1
            self.registry.counts[key] = seen
            if fate == "permanent" or seen <= TRANSIENT_FAILS:
                raise RuntimeError(f"{fate} failure of {self.name} on {row!r:.40}")
        if fate == "record":
            return ro.RecordFailure(f"{self.name} rejects {row!r:.40}")
        if fate == "group":
            return ro.GroupFailure(f"{self.name} fails the group at {row!r:.40}")
        return self.value(row)

    def __call__(self, *args: Any) -> Any:
        if not self.batched:
            out = self.one(tuple(args))
            if isinstance(out, ro.RecordFailure):
                raise out
            return out
        rows = list(zip(*args))
        outs = []
        error: Exception | None = None
        for row in rows:  # every record of the batch is invoked, like a real batch
            try:
                outs.append(self.one(row))
            except RuntimeError as exc:
                error = error or exc
        if error is not None:
            raise error
        return outs


# -- program specs ----------------------------------------------------------------
# An op is ("map",) | ("filter",) | ("broadcast", ancestor_choice) | ("expand", block);
# a block is a tuple of ops. Modules: ("kind", behaviour, batched) per call site.
Op = tuple[Any, ...]


_SIMPLE = st.one_of(
    st.just(("map",)),
    st.just(("filter",)),
    st.tuples(st.just("broadcast"), st.integers(0, 3)),
)


def _ops(depth: int, spine: bool) -> st.SearchStrategy[tuple[Op, ...]]:
    """A block at ``depth``; the spine always expands, so programs nest 3 levels deep."""
    if depth >= 3:
        return st.lists(_SIMPLE, min_size=1, max_size=2).map(tuple)
    if depth < 2:
        side = st.one_of(_SIMPLE, st.tuples(st.just("expand"), _ops(depth + 1, False)))
    else:
        side = _SIMPLE
    if spine:
        return st.tuples(
            st.lists(_SIMPLE, max_size=1), _ops(depth + 1, True), st.lists(side, max_size=2)
        ).map(lambda t: (*t[0], ("expand", t[1]), *t[2]))
    return st.lists(side, min_size=1, max_size=2).map(tuple)


behaviours = st.one_of(
    st.just(Behaviour()),
    st.builds(Behaviour, st.sampled_from([0, 0, 3, 10]), st.sampled_from([0, 0, 3, 10]),
              st.sampled_from([0, 10, 30]), st.sampled_from([0, 0, 3])),
)


@dataclass(frozen=True)
class ProgramSpec:
    block: tuple[Op, ...]
    side_output: bool
    behaviours: tuple[Behaviour, ...]
    batched: tuple[bool, ...]
    members: bool = False  # reduce with members=the expanded Port (a filtered child suppresses)


programs = st.builds(
    ProgramSpec,
    block=_ops(0, spine=True),
    side_output=st.booleans(),
    behaviours=st.lists(behaviours, min_size=8, max_size=8).map(tuple),
    batched=st.lists(st.booleans(), min_size=8, max_size=8).map(tuple),
    members=st.booleans(),
)


class RandomPipeline(ro.Pipeline):
    """The pipeline a :class:`ProgramSpec` describes; ``registry`` holds the UDFs' counters."""

    def __init__(self, spec: ProgramSpec) -> None:
        super().__init__()
        self.spec = spec
        self.registry = Registry()
        self.kinds: dict[str, str] = {}
        self._count = 0
        self._build(spec.block, 0)  # create one module per call site, in forward order
        self._count = 0

    def _module(self, kind: str) -> ro.RayModule:
        """The module of the next call site (created on the first walk)."""
        name = f"m{self._count}"
        self._count += 1
        module = self.__dict__.get(name)
        if module is None:
            i = len(self.kinds) % len(self.spec.behaviours)
            module = self._make(name, kind, self.spec.behaviours[i], self.spec.batched[i],
                                9 if len(self.kinds) < 2 else 4)
            setattr(self, name, module)
            self.kinds[name] = kind
        return module

    def _make(self, name: str, kind: str, behaviour: Behaviour, batched: bool,
              fan_cap: int) -> ro.RayModule:
        """The module of the call site ``name`` (a subclass may build another Step)."""
        return ro.RayModule(Step, name, kind, behaviour, self.registry, batched,
                            fan_cap=fan_cap, batched=batched, max_attempts=MAX_ATTEMPTS)

    def _build(self, block: tuple[Op, ...], depth: int) -> None:
        for op in block:
            if op[0] == "expand":
                self._module("fanout")
                self._build(op[1], depth + 1)
                self._module("combine")
            elif op[0] == "filter":
                self._module("pred")
            else:
                self._module("map")

    def _run(self, x: Any, block: tuple[Op, ...], ancestors: list[Any]) -> Any:
        for op in block:
            if op[0] == "map":
                x = self._module("map")(x)
            elif op[0] == "filter":
                x = F.filter(x, self._module("pred")(x))
            elif op[0] == "broadcast":
                if ancestors:
                    b = F.broadcast(ancestors[op[1] % len(ancestors)], like=x)
                    x = self._module("map")(x, b)
                else:
                    x = self._module("map")(x)
            else:
                kids = F.expand(self._module("fanout")(x))
                y = self._run(kids, op[1], [*ancestors, x])
                members = kids if self.spec.members else None
                x = self._module("combine")(x, F.reduce(y, members=members))
        return x

    def forward(self, source: Any) -> Any:
        self._count = 0
        main = self._run(source, self.spec.block, [])
        if self.spec.side_output:
            return {"main": main, "source": source}
        return main


# -- a fixed two-level program for the store tests ------------------------------------
class _Same:
    def __call__(self, rows: list[Any]) -> list[Any]:
        return rows


class NestedPdfPipeline(ro.Pipeline):
    """render (root) -> expand -> split (root/0) -> expand -> ocr (root/0/0) -> reduce -> join
    (root/0) -> reduce -> assemble (root): Grains at depth 1, 2 and 3, barriers at two levels."""

    def __init__(self) -> None:
        super().__init__()
        self.render = ro.RayModule(_Same)
        self.split = ro.RayModule(_Same)
        self.ocr = ro.RayModule(_Same)
        self.join = ro.RayModule(_Same)
        self.assemble = ro.RayModule(_Same)

    def forward(self, pdfs: Any) -> Any:
        sections = F.expand(self.render(pdfs))
        lines = F.expand(self.split(sections))
        texts = F.reduce(self.ocr(lines))
        return self.assemble(F.reduce(self.join(texts)))


def nested_plan() -> Any:
    """The compiled plan of :class:`NestedPdfPipeline` (Domains root, root/0, root/0/0)."""
    return NestedPdfPipeline().compile()
