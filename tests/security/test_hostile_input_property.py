"""Random ids, module names and values through compile, run and audit: nothing escapes.

Each example builds a pipeline whose one module sits under a random attribute name and
returns random values (including sets, object arrays, custom classes, huge ints, escape
sequences), runs it with the in-process executor, writes the run into a Redis store
under a random run id (payloads to files, with a tiny threshold), audits it, shows it
with the CLI, and deletes it. Invalid names and ids must be refused with a RayorchError;
every accepted value must read back byte-identical; no file may appear outside the
payload directory; no control character may reach the terminal.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rayorch as ro
from rayorch.cli import main as cli_main
from rayorch.core.compile_errors import ModuleDefinitionError
from rayorch.core.errors import RayorchError
from rayorch.core.facts import BarrierInstalled, Fact, GrainCommitted, LeaseAcquired, pack_value
from rayorch.core.names import valid_run_id
from rayorch.core.program import PipelineBase
from rayorch.inspect.audit import audit_run
from rayorch.runtime.in_process import execute
from rayorch.store import open_store
from rayorch.store.base import LineageStore
from rayorch.store.errors import InvalidRunIdError
from rayorch.store.retention import delete_run
from rayorch.testing import RedisServer, redis_server_path

pytestmark = [pytest.mark.integration]

UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
RESERVED = set(dir(PipelineBase)) | {"run"}


class Opaque:
    def __repr__(self) -> str:
        return "\x1b]0;pwned\x07Opaque"


VALUES: list[Any] = []  # what the module returns per source index (set per example)


def emit(i: int) -> Any:
    return VALUES[i]


leaves = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True), st.text(max_size=20), st.binary(max_size=20),
    st.sampled_from(["\x1b[2J\x1b]0;t\x07", "..", "../../etc/passwd", "\u202e"]),
    st.builds(Opaque), st.frozensets(st.integers(), max_size=3),
    st.sampled_from([np.arange(3, dtype=np.int16), np.array([1, None], dtype=object),
                     np.zeros(2, dtype=[("a", "i4")]), np.float32(1.5), bytearray(b"x")]),
)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner, inner),
                            st.sets(st.integers(), max_size=2),
                            st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=6,
)
names = st.one_of(st.from_regex(r"\A[a-z_][a-z0-9_]{0,8}\Z"), st.text(max_size=10),
                  st.sampled_from(["..", ".", "../../x", "a/b", "a.b", "x\x1b[2J", "a:b"]))
run_ids = st.one_of(st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9_.\-]{0,20}\Z"),
                    st.text(max_size=12),
                    st.sampled_from([".", "..", "../up", "a/b", "-rf", ".hidden"]))


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


def _pipeline_with_module_named(name: str) -> PipelineBase:
    class Hostile(ro.Pipeline):
        def __init__(self) -> None:
            super().__init__()
            setattr(self, name, ro.RayModule(emit, batched=False))

        def forward(self, xs: Any) -> Any:
            return getattr(self, name)(xs)

    return Hostile()


def _write(store: LineageStore, run_id: str, log: list[Fact]) -> None:
    epoch = store.acquire_lease(run_id, 0, "prop", 30)
    pending: list[Fact] = []
    for fact in log:
        if isinstance(fact, GrainCommitted):
            if pending:
                store.append(run_id, 0, epoch, pending, driver="prop")
                pending = []
            store.commit(run_id, [fact])
        elif not isinstance(fact, BarrierInstalled | LeaseAcquired):
            pending.append(fact)
    if pending:
        store.append(run_id, 0, epoch, pending, driver="prop")


def _files(base: Path) -> set[Path]:
    return {p for p in base.rglob("*") if p.is_file()}


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
          deadline=None)
@given(run_id=run_ids, name=names, outputs=st.lists(values, min_size=1, max_size=4))
def test_hostile_ids_names_and_values(
        redis_server: RedisServer, tmp_path: Path, run_id: str, name: str,
        outputs: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "area"
    root = base / "payloads"
    root.mkdir(parents=True, exist_ok=True)
    outside_before = _files(base) - _files(root)
    url = f"{redis_server.url}?payload_dir={root}&payload_threshold=8"
    if name in RESERVED:
        return  # shadows the pipeline's own methods: the user's own bug, not input
    try:
        plan = _pipeline_with_module_named(name).compile()
    except ModuleDefinitionError:
        assert not name.isidentifier()
        return
    assert name.isidentifier()
    VALUES[:] = outputs
    result = execute(plan, [(i,) for i in range(len(outputs))])
    store = open_store(url)
    try:
        store.open_run(run_id, plan, shards=1, micro_batch=1)
    except InvalidRunIdError:
        assert not valid_run_id(run_id)
        return
    assert valid_run_id(run_id)
    try:
        _write(store, run_id, result.log)
        report = audit_run(store, run_id)
        assert report.ok, report.violations
        stored = {s.fact.path: s.fact for s in store.read(run_id, 0)
                  if isinstance(s.fact, GrainCommitted)}
        for i, value in enumerate(outputs):
            fact = stored[(i,)]
            if fact.outcome == "present":
                assert fact.outputs is not None
                assert pack_value(fact.outputs[0]) == pack_value(value)  # faithful
            else:
                assert fact.cause is not None and fact.cause.startswith("UnstorableValue")
        capsys.readouterr()
        for command in (["show", run_id, "0"], ["status", run_id], ["audit", run_id]):
            assert cli_main([*command, "--store", url]) in (0, 1)
            out = capsys.readouterr()
            assert not UNSAFE.search(out.out + out.err)
        assert all(p.resolve().is_relative_to(root.resolve()) for p in _files(root))
        assert _files(base) - _files(root) == outside_before, "a file escaped the payload dir"
    except RayorchError as exc:  # pragma: no cover - a refusal must be explained, not crash
        pytest.fail(f"an accepted run failed: {exc}")
    finally:
        delete_run(store, run_id)
        store.close()
    assert not list((root / run_id).rglob("*.msgpack")) if (root / run_id).exists() else True
