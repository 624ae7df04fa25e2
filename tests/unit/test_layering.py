"""``rayorch.core`` is pure: it imports neither ray nor redis (checked on the source)."""

from __future__ import annotations

import ast
from pathlib import Path

import rayorch.core

FORBIDDEN = {"ray", "redis", "hiredis", "fitz", "pymupdf"}


def test_core_imports_neither_ray_nor_redis() -> None:
    core = Path(rayorch.core.__file__).parent
    offenders = []
    for path in sorted(core.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in FORBIDDEN or name.startswith(("rayorch.store", "rayorch.actors",
                                                        "rayorch.driver", "rayorch.cli")):
                    offenders.append(f"{path.name}:{node.lineno} imports {name}")
    assert not offenders, offenders
