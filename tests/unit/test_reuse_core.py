"""Reuse in the pure core: fingerprints, GrainReused folded by the kernel, the machine's hook."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

import rayorch as ro
from rayorch import F
from rayorch.core.errors import InvalidTransition
from rayorch.core.facts import GrainReused
from rayorch.core.fingerprint import (
    canonical_bytes,
    grain_reuse_key,
    input_digest,
    plan_fingerprints,
    reuse_key,
)
from rayorch.core.reuse import Reuse, ReuseError, ReuseIndex
from rayorch.core.run_view import RunView, fold_shard, numbered
from rayorch.core.state import Kernel
from rayorch.runtime.in_process import ExecutorOptions, execute
from rayorch.store.records import decode_fact, encode_fact


class Split:
    def __call__(self, xs: list[int]) -> list[list[int]]:
        return [[x * 10 + i for i in range(x % 4)] for x in xs]


class Inc:
    def __init__(self, k: int = 1, extra: object = None) -> None:
        self.k = k

    def __call__(self, xs: list[int]) -> list[int]:
        return [x + self.k for x in xs]


class Total:
    def __call__(self, xs: list[list[int]]) -> list[int]:
        return [sum(x) for x in xs]


class Tree(ro.Pipeline):
    def __init__(self, k: int = 1, extra: object = None) -> None:
        super().__init__()
        self.split = ro.RayModule(Split)
        self.inc = ro.RayModule(Inc, k=k, extra=extra)
        self.total = ro.RayModule(Total)

    def forward(self, x: ro.Port) -> ro.Port:
        return self.total(F.reduce(self.inc(F.expand(self.split(x)))))


def run(plan: ro.Plan, values: list[int], reuse: Reuse) -> tuple[dict, list]:
    result = execute(plan, [(v,) for v in values], ExecutorOptions(reuse=reuse))
    return result.outputs, result.log


def index_of(log: list, run_id: str = "first") -> ReuseIndex:
    return ReuseIndex.from_view(RunView(run_id, {}, {0: fold_shard(0, numbered(log))}))


def test_canonical_encoding_ignores_dict_and_set_order() -> None:
    assert canonical_bytes({"a": 1, "b": {2, 3}}) == canonical_bytes({"b": {3, 2}, "a": 1})
    assert canonical_bytes((1, 2)) != canonical_bytes([1, 2])
    assert input_digest([{"x": 1}]) != input_digest([{"x": 2}])


@pytest.mark.parametrize(("values", "files"), [
    ((5,), ()), (("a", 2.5, None, True, b"x"), ()), (([1, [2, (3,)]],), ()),
    (({"k": {1, 2}}, (1, "x")), ()), (("doc.pdf", 3), ("f" * 32, None)), ((True,), ()),
])
def test_the_per_dispatch_key_is_the_key_the_rules_define(values: tuple, files: tuple) -> None:
    """grain_reuse_key (one pass, per dispatch) = reuse_key(fingerprint, input_digest)."""
    digest = input_digest(values, files)
    assert digest is not None
    assert grain_reuse_key("fp", values, files) == reuse_key("fp", digest)
    assert grain_reuse_key("fp", (object(),)) is None  # state: no key
    assert grain_reuse_key("fp", (1,)) != grain_reuse_key("fp", (True,))  # not equal values


def test_fingerprint_covers_code_and_arguments_not_batch_size() -> None:
    base = plan_fingerprints(Tree().compile())
    assert base == plan_fingerprints(Tree().compile())
    changed = plan_fingerprints(Tree(k=2).compile())
    assert changed["inc"] != base["inc"] and changed["split"] == base["split"]
    bigger = Tree()
    bigger.inc = ro.RayModule(Inc, k=1, extra=None, batch_size=64, replicas=3)
    assert plan_fingerprints(bigger.compile())["inc"].key == base["inc"].key


def test_state_that_cannot_be_hashed_is_never_reused_and_says_why() -> None:
    plan = Tree(extra=threading.Lock()).compile()
    reuse = Reuse(plan)
    assert reuse.fingerprints["inc"].key is None
    (note,) = reuse.notes()
    assert note.startswith("Call inc is not reused:") and "lock" in note
    first, log = run(plan, [1, 2, 3], reuse)
    again = Reuse(plan, index_of(log))
    second, _ = run(plan, [1, 2, 3], again)
    assert second == first and again.reused["inc"] == 0 and again.reused["split"] == 3


def test_a_rerun_reuses_what_did_not_change() -> None:
    plan = Tree().compile()
    first, log = run(plan, list(range(6)), Reuse(plan))
    reuse = Reuse(plan, index_of(log))
    second, log2 = run(plan, list(range(8)), reuse)
    assert {i: second[i] for i in range(6)} == first
    # 6 and 7 are new: split of both, inc of their 2 + 3 pages, total of both run
    assert dict(reuse.reused) == {"split": 6, "inc": 7, "total": 6}
    reused = [f for f in log2 if isinstance(f, GrainReused)]
    assert all(f.origin_run == "first" for f in reused) and len(reused) == 19
    assert decode_fact(encode_fact(reused[0])) == reused[0]
    # a changed config runs that Call and what it feeds, nothing upstream
    changed = Tree(k=2).compile()
    reuse = Reuse(changed, index_of(log))
    run(changed, list(range(6)), reuse)
    assert reuse.reused["split"] == 6 and reuse.reused["inc"] == 0
    assert reuse.reused["total"] == 2  # sources 0 and 4 have no children: same input []


def test_no_reuse_forces_a_call_to_run_and_names_unknown_calls() -> None:
    plan = Tree().compile()
    _, log = run(plan, [1, 2, 3], Reuse(plan))
    reuse = Reuse(plan, index_of(log), no_reuse=["inc"])
    run(plan, [1, 2, 3], reuse)
    assert reuse.reused["split"] == 3 and reuse.reused["inc"] == 0
    with pytest.raises(ReuseError, match="no such Call"):
        Reuse(plan, no_reuse=["nope"])


def test_the_kernel_folds_grain_reused_only_on_a_fresh_ready_grain() -> None:
    plan = Tree().compile()
    _, log = run(plan, [1, 2], Reuse(plan, index_of(run(plan, [1, 2], Reuse(plan))[1])))
    kernel = Kernel(plan)
    for fact in log:
        kernel.apply(fact)  # a rebuild folds GrainReused like an accepted commit
    assert kernel.run_completed
    reused = next(f for f in log if isinstance(f, GrainReused))
    assert kernel.apply(reused) == []  # the same fact again: a no-op
    with pytest.raises(InvalidTransition, match="only a ready Grain"):
        kernel.apply(dataclasses.replace(reused, outputs=("other",)))


class Size:
    def __call__(self, paths: list[str]) -> list[int]:
        with_sizes = []
        for path in paths:
            with open(path, "rb") as f:
                with_sizes.append(len(f.read()))
        return with_sizes


class Sizes(ro.Pipeline):
    def __init__(self) -> None:
        super().__init__()
        self.size = ro.RayModule(Size)

    def forward(self, paths: ro.Port) -> ro.Port:
        return self.size(paths)


def test_a_source_file_is_keyed_by_its_listed_identity_not_its_bytes(tmp_path: Any) -> None:
    """A changed file (size, mtime) runs again; the driver keys it by metadata only, so the
    same size and mtime over other bytes is taken as the same file (as a listing says)."""
    import os

    a, b = tmp_path / "a.pdf", tmp_path / "b.pdf"
    a.write_bytes(b"one")
    b.write_bytes(b"two")
    plan = Sizes().compile()
    rows = [str(a), str(b)]
    _, log = run_paths(plan, rows, Reuse(plan))
    b.write_bytes(b"changed!")  # same name, another size: runs again
    reuse = Reuse(plan, index_of(log))
    outputs, log = run_paths(plan, rows, reuse)
    assert reuse.reused["size"] == 1 and outputs[1][0].value == 8
    stat = a.stat()
    a.write_bytes(b"ONE")  # same size, mtime put back: the listing cannot tell
    os.utime(a, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    reuse = Reuse(plan, index_of(log))
    outputs, _ = run_paths(plan, rows, reuse)
    assert reuse.reused["size"] == 2 and outputs[0][0].value == 3


def test_a_source_of_unknown_identity_is_never_reused() -> None:
    """An object store URL admitted without its listing's identity gets no reuse key."""
    from rayorch.core.facts import SourceAdmitted
    from rayorch.core.reuse import UNKNOWN_IDENTITY

    plan = Sizes().compile()
    rows = ["s3://bucket/a.pdf"]
    reuse = Reuse(plan)
    kernel = Kernel(plan)

    kernel.apply(SourceAdmitted(0, tuple(rows), identity=UNKNOWN_IDENTITY))
    assert reuse.key_of(kernel, ("size", (0,))) == ""
    kernel.apply(SourceAdmitted(1, tuple(rows), identity="id1 size=3 etag=x"))
    known = reuse.key_of(kernel, ("size", (1,)))
    kernel.apply(SourceAdmitted(2, tuple(rows), identity="id1 size=3 etag=y"))
    assert known and reuse.key_of(kernel, ("size", (2,))) not in ("", known)


def run_paths(plan: ro.Plan, paths: list[str], reuse: Reuse) -> tuple[dict, list]:
    result = execute(plan, [(p,) for p in paths], ExecutorOptions(reuse=reuse))
    return result.outputs, result.log
