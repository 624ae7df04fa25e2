"""The ``rayorch`` command as tests run it: a subprocess with the repository on its path, a
private local Ray (no inherited ``RAY_ADDRESS``) and Ray's local-test settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cli_env() -> dict[str, str]:
    """This process's environment for a ``rayorch`` subprocess (see the module doc)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return {**env, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0"}


def run_rayorch(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``rayorch ARGV...`` to its end; its exit code, stdout and stderr."""
    return subprocess.run([sys.executable, "-m", "rayorch.cli", *argv], env=cli_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


__all__ = ["cli_env", "run_rayorch"]
