"""``rayorch.core`` is pure: it imports neither ray nor redis (checked on the source)."""

from __future__ import annotations

import ast
import functools
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


def _imports_that_run(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at module level or in a function, except type-only ones
    (``if TYPE_CHECKING:``): those never run, so they cannot make an import circle."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """``module -> modules of the package it imports`` (``from pkg import sub`` is ``pkg.sub``)."""
    files = {}
    for path in (root / package).rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        for node in _imports_that_run(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in files)
                continue
            module = node.module or ""
            if node.level:
                here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = here[:len(here) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            for alias in node.names:
                target = f"{module}.{alias.name}"
                deps.add(target if target in files else module)
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``, one path ``a -> b -> ... -> a`` per circle found."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def walk(module: str) -> None:
        state[module] = 1
        path.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep):], dep])
            elif dep not in state:
                walk(dep)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module)
    return cycles


@functools.cache
def rayorch_graph() -> dict[str, set[str]]:
    """:func:`import_graph` of rayorch itself (parsed once for the tests here)."""
    return import_graph(Path(rayorch.core.__file__).parent.parent.parent, "rayorch")


def test_rayorch_has_no_import_circle() -> None:
    cycles = import_cycles(rayorch_graph())
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_circle_finder_sees_circles_through_packages_and_functions(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.b import B\n")
    (pkg / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from ..a import f\nB = 1\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from pkg import a\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.c"] == set()  # type-only imports never run
    assert import_cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.a"]]


def test_storage_sits_between_core_and_the_store() -> None:
    """``rayorch.storage`` imports only the core (and its client library); the store, the
    runtime and the jobs reach bytes through it, never the other way round."""
    graph = rayorch_graph()
    upward = sorted(f"{module} imports {dep}" for module, deps in graph.items()
                    if module.startswith("rayorch.storage") for dep in deps
                    if not dep.startswith(("rayorch.core", "rayorch.storage")))
    assert not upward, upward


def test_runtime_never_imports_inspect() -> None:
    """The runtime runs a run; ``rayorch.inspect`` reads one (audit, status, timeline) and
    may import the runtime, never the other way round, even inside a function. The records
    both read are ``rayorch.store.records``."""
    graph = rayorch_graph()
    assert "rayorch.store.records.manifest" in graph
    upward = sorted(f"{module} imports {dep}" for module, deps in graph.items()
                    if module.startswith("rayorch.runtime") for dep in deps
                    if dep.startswith("rayorch.inspect"))
    assert not upward, upward


def test_the_store_records_import_only_the_core() -> None:
    """Every stored record's codec sits in ``rayorch.store.records`` on the core alone, so
    any reader (an archive reader included) decodes a run without the runtime."""
    graph = rayorch_graph()
    records = [m for m in graph if m.startswith("rayorch.store.records")]
    assert len(records) >= 5
    upward = sorted(f"{module} imports {dep}" for module in records for dep in graph[module]
                    if not dep.startswith(("rayorch.core", "rayorch.store.records")))
    assert not upward, upward


JOB_SIDE = "rayorch.pipelines.job"
PUBLIC_FACES = {"rayorch.pipelines", "rayorch.pipelines.pdf"}
"""The package and the PDF job's public face: they may name both sides (``PDF_WRITER``)."""


def _actor_side(graph: dict[str, set[str]]) -> list[str]:
    """The pipeline modules that run inside actors: all of ``rayorch.pipelines`` but the job
    side and the public faces."""
    return sorted(m for m in graph if m.startswith("rayorch.pipelines.")
                  and m not in PUBLIC_FACES and not m.startswith(JOB_SIDE))


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for dep in graph[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_actor_side_pipeline_modules_never_reach_the_job_side() -> None:
    """What runs inside actors (document/, the video modules, sources) never imports the
    jobs' CLI, output or summary, directly, through another module or inside a function."""
    graph = rayorch_graph()
    actor_side = _actor_side(graph)
    assert "rayorch.pipelines.document.render" in actor_side
    assert "rayorch.pipelines.video" in actor_side
    offenders = sorted(f"{module} reaches {dep}" for module in actor_side
                       for dep in _reaches(graph, module) if dep.startswith(JOB_SIDE))
    assert not offenders, offenders


def test_importing_the_actor_side_loads_no_job_module() -> None:
    """The same rule as loaded: a fresh interpreter imports every actor-side pipeline module
    and finds no ``rayorch.pipelines.job`` module in ``sys.modules``."""
    import subprocess
    import sys

    root = Path(rayorch.core.__file__).parent.parent.parent
    actor_side = _actor_side(rayorch_graph())
    script = ("import importlib, sys\n"
              f"for name in {actor_side!r}:\n"
              "    importlib.import_module(name)\n"
              f"print(sorted(m for m in sys.modules if m.startswith({JOB_SIDE!r})))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True, cwd=root)
    assert done.stdout.strip() == "[]", done.stdout
