"""Path-safe names: run ids, module attribute names and payload references stay in their place.

Measured before (issue 12): run ids ``.``/``..`` were accepted, payloads of run ``..``
were written outside the payload directory, ``delete_run(".")`` removed another run's
payload files, and a module attribute named like a path wrote a file outside the
directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import rayorch as ro
from rayorch.core.compile_errors import ModuleDefinitionError
from rayorch.core.facts import GrainCommitted, GrainDispatched, SourceAdmitted
from rayorch.core.names import UnsafeNameError, check_component, valid_run_id
from rayorch.store import open_store
from rayorch.store.errors import InvalidRunIdError, PayloadError
from rayorch.store.payload import PayloadStore
from rayorch.testing import Echo, EchoPipeline

BAD_RUN_IDS = [".", "..", "../x", "a/b", "a\\b", "-rf", ".hidden", "", "a\x1b[2J", "a\nb",
               "x" * 129, "a:b", "{x}"]


@pytest.mark.parametrize("run_id", BAD_RUN_IDS)
def test_bad_run_ids_are_refused_by_the_memory_store(run_id: str) -> None:
    store = open_store("memory://")
    with pytest.raises(InvalidRunIdError, match="not a valid run id"):
        store.open_run(run_id, EchoPipeline().compile())
    with pytest.raises(InvalidRunIdError):
        store.delete_run(run_id)


@pytest.mark.integration
def test_bad_run_ids_are_refused_by_redis_and_the_payload_directory(
        redis_url: str, tmp_path: Path) -> None:
    root = tmp_path / "payloads"
    store = open_store(f"{redis_url}?payload_dir={root}&payload_threshold=16")
    for run_id in (".", "..", "../escape"):
        with pytest.raises(InvalidRunIdError):
            store.open_run(run_id, EchoPipeline().compile())
        with pytest.raises(InvalidRunIdError):
            store.delete_run(run_id)
    payloads = PayloadStore(root)
    report = GrainCommitted("echo", (0,), 0, "present", ("x" * 100,))
    for run_id in (".", "..", "../escape", "a/b"):
        with pytest.raises(PayloadError):
            payloads.write_segment(run_id, [report])
        with pytest.raises(PayloadError):
            payloads.delete_run(run_id)
    assert not any(tmp_path.rglob("*.msgpack"))


@pytest.mark.integration
def test_delete_run_dot_leaves_other_runs_payload_files(redis_url: str, tmp_path: Path) -> None:
    root = tmp_path / "payloads"
    store = open_store(f"{redis_url}?payload_dir={root}&payload_threshold=16")
    plan = EchoPipeline().compile()
    store.open_run("keep", plan)
    epoch = store.acquire_lease("keep", 0, "d", 30)
    store.append("keep", 0, epoch, [SourceAdmitted(0, ("a",)), GrainDispatched("echo", (0,), 0)],
                 driver="d")
    store.commit("keep", [GrainCommitted("echo", (0,), 0, "present", ("y" * 200,))])
    files = sorted(root.rglob("*.seg"))
    assert len(files) == 1 and files[0].is_relative_to(root / "keep" / "echo")
    with pytest.raises(InvalidRunIdError):
        store.delete_run(".")
    with pytest.raises(PayloadError):
        store.payloads.delete_run(".")
    assert sorted(root.rglob("*.seg")) == files
    assert store.read("keep", 0)[-1].fact.outputs == ("y" * 200,)


def test_payload_references_read_from_the_store_cannot_leave_the_directory(
        tmp_path: Path) -> None:
    root = tmp_path / "payloads"
    root.mkdir()
    secret = tmp_path / "secret.msgpack"
    secret.write_bytes(b"\x91\x01")
    payloads = PayloadStore(root)
    for ref in ("../secret.msgpack", str(secret), "run/../../secret.msgpack", ".", "",
                "../secret.seg@0+2", "run/../../secret.seg@0+2"):
        with pytest.raises(PayloadError, match="outside the payload directory"):
            payloads.load(ref)
        with pytest.raises(PayloadError):
            payloads.delete(ref)
    assert secret.exists()


@pytest.mark.parametrize("name", ["../../evil", "a/b", "a.b", ".", "..", "x\x1b[2J", "a b",
                                  "ocr@1", "a|b", "a:b", "", "a\\b"])
def test_module_attribute_named_like_a_path_is_a_compile_error(name: str) -> None:
    class Sneaky(ro.Pipeline):
        def __init__(self) -> None:
            super().__init__()
            setattr(self, name, ro.RayModule(Echo))

        def forward(self, xs: Any) -> Any:
            return getattr(self, name)(xs)

    with pytest.raises(ModuleDefinitionError, match="not a Python identifier") as caught:
        Sneaky().compile()
    assert "test_names.py" in str(caught.value)  # points at the user's line


def test_names_rules() -> None:
    assert valid_run_id("run-1.a_b") and valid_run_id("_x") and valid_run_id("7")
    assert not any(valid_run_id(r) for r in BAD_RUN_IDS)
    assert check_component("Call id", "stage.ocr@1") == "stage.ocr@1"
    for bad in (".", "..", "a/b", "a\\b", "a\x00", "a\u202eb", ""):
        with pytest.raises(UnsafeNameError):
            check_component("Call id", bad)
