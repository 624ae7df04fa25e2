"""The trust model: a manifest read from the store names an ro.Pipeline subclass, nothing else.

Measured before (issue 12): a manifest naming ``os:system`` made ``rayorch resume`` run
a shell command as the driver's user.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.faults import FaultPipeline
from rayorch.cli import main as cli_main
from rayorch.runtime.trust import (
    TRUST_ENV,
    UntrustedPipelineError,
    load_pipeline_class,
    trusted_modules,
)
from rayorch.store import open_store
from rayorch.store.records import RunManifest

REPO = Path(__file__).resolve().parents[2]


def _hostile_run(url: str, run_id: str, pipeline: str, args: tuple[object, ...]) -> None:
    """A run whose manifest was written straight into the store by someone hostile."""
    store = open_store(url)
    store.open_run(run_id, FaultPipeline().compile(), shards=1, micro_batch=1)
    store.save_manifest(run_id, RunManifest(pipeline, args, {}, (("doc0",),)).encode())
    store.close()


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_resume_refuses_a_manifest_naming_os_system(redis_url: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    _hostile_run(redis_url, "hostile", "os:system", (f"touch {marker}",))
    proc = subprocess.run(
        [sys.executable, "-m", "rayorch.cli", "resume", "hostile", "--store", redis_url],
        cwd=REPO, capture_output=True, text=True, timeout=50,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "RAY_AUTH_MODE": "disabled"})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused" in lines[0] and "os:system" in lines[0], proc.stderr
    assert "not an ro.Pipeline subclass" in lines[0]
    assert not marker.exists(), "the manifest ran a shell command"


@pytest.mark.integration
@pytest.mark.timeout(30)
@pytest.mark.parametrize("pipeline", ["os:system", "subprocess:Popen", "builtins:eval",
                                      "collections:OrderedDict", "bench.faults:make_docs",
                                      "os:path.join", "os", ":x", "../x:y", "os:__class__"])
def test_driver_refuses_anything_but_a_pipeline_class(
        redis_url: str, pipeline: str, capsys: pytest.CaptureFixture[str]) -> None:
    _hostile_run(redis_url, "hostile", pipeline, ("echo hi",))
    assert cli_main(["driver", "hostile", "--store", redis_url]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "refused" in err, err


def test_the_allowlist_is_checked_before_the_import(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "sideeffect_pipes.py").write_text(textwrap.dedent(f"""
        from pathlib import Path
        Path({str(marker)!r}).touch()
        import rayorch as ro
        class P(ro.Pipeline):
            pass
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(TRUST_ENV, raising=False)
    with pytest.raises(UntrustedPipelineError, match="not trusted") as caught:
        load_pipeline_class("sideeffect_pipes:P", trusted_modules(["bench", "rayorch"]))
    assert "--trust sideeffect_pipes" in str(caught.value)
    assert not marker.exists(), "the module was imported before the allowlist check"
    monkeypatch.setenv(TRUST_ENV, "other, sideeffect_pipes")
    cls = load_pipeline_class("sideeffect_pipes:P", trusted_modules())
    assert cls.__name__ == "P" and marker.exists()


def test_allowlist_entries_cover_submodules_only_by_package(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRUST_ENV, raising=False)
    assert load_pipeline_class("bench.faults:FaultPipeline", ("bench",)) is FaultPipeline
    with pytest.raises(UntrustedPipelineError, match="not trusted"):
        load_pipeline_class("bench.faults:FaultPipeline", ("ben",))
    with pytest.raises(UntrustedPipelineError, match="not a module name"):
        trusted_modules(["../evil"])
    assert trusted_modules() is None


def test_a_malformed_manifest_is_refused_in_one_line() -> None:
    from rayorch.core.facts import pack_value
    from rayorch.store.records import ManifestError

    blob = pack_value([1, "bench.faults:FaultPipeline", [], {"x": 1}, "not rows", None, 1, None])
    with pytest.raises(ManifestError, match="malformed"):
        RunManifest.decode(blob)
