"""Check that what a document names in backticks exists in the repository.

    python scripts/check_docs.py docs/ARCHITECTURE.md docs/topics/*.md

A backticked path (``core/commit.py``, ``lua/lease.lua``, ``bench/RESULTS.md``) must be a file or
folder of the tree, whole or as the tail of one (``core/x.py`` is ``rayorch/core/x.py``); an
identifier, dotted or called (``ShardDriver.take``, ``open_storage(url)``), must be a name the
code defines or uses (each dotted part); an option (``--shard-size``) or an environment variable
(``$RAYORCH_STORAGE_PATIENCE_S``) must appear in the source. Quoted strings, numbers and
snippets with spaces are not checked. A docs section cited as ``docs/X.md, "Section"`` in the
code must be a heading of that document. Exit status 1 and one line per name not found.
"""

from __future__ import annotations

import ast
import itertools
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("rayorch", "bench", "tests", "scripts", "examples")
TICKED = re.compile(r"`([^`\n]+)`")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
OPTION = re.compile(r"--[a-z][a-z0-9-]*")
ENV = re.compile(r"\$([A-Z][A-Z0-9_]*)")
CITATION = re.compile(r'(docs/[\w/.-]+\.md),?\s+"([^"]+)"')
EXTERNAL = {"GOOGLE_APPLICATION_CREDENTIALS"}
"""Names the documents may cite that belong to another program (a cloud's settings)."""


def repo_files() -> list[str]:
    skip = {".git", ".venv", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache"}
    return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
            if not skip.intersection(p.relative_to(ROOT).parts)]


class Scopes:
    """What each class and each module of the Python sources defines, by name."""

    def __init__(self) -> None:
        self.members: dict[str, set[str]] = {}
        self.bases: dict[str, set[str]] = {}
        self.open: set[str] = set()  # classes with a base defined outside the sources

    def add_class(self, node: ast.ClassDef) -> None:
        members = self.members.setdefault(node.name, set())
        for child in ast.walk(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                members.add(child.name)
            elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                members.add(child.id)
            elif isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Store):
                members.add(child.attr)
        for base in node.bases:
            name = ast.unparse(base).split("[")[0].split(".")[-1]
            self.bases.setdefault(node.name, set()).add(name)

    def add_module(self, stem: str, tree: ast.Module) -> None:
        members = self.members.setdefault(stem, set())
        for child in tree.body:
            for node in ast.walk(child) if isinstance(child, ast.If | ast.Try) else [child]:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    members.add(node.name)
                elif isinstance(node, ast.Assign | ast.AnnAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    members.update(t.id for t in targets if isinstance(t, ast.Name))
                elif isinstance(node, ast.ImportFrom | ast.Import):
                    members.update((a.asname or a.name).split(".")[0] for a in node.names)

    def defines(self, owner: str, member: str, seen: frozenset[str] = frozenset()) -> bool:
        """Whether ``owner`` (a class or module of the sources) has ``member``; True for a
        name that is neither, or a class whose bases are not all in the sources."""
        if owner not in self.members or owner in seen:
            return True
        if member in self.members[owner]:
            return True
        bases = self.bases.get(owner, set())
        if any(b not in self.members for b in bases - {"object", "Protocol", "Generic"}):
            return True
        return any(self.defines(b, member, seen | {owner}) for b in bases)


def code_names(files: list[str], scopes: Scopes) -> tuple[set[str], str]:
    """Every name the Python sources define or use, and their text (for options and variables)."""
    names: set[str] = set()
    texts: list[str] = []
    for rel in files:
        if not rel.endswith((".py", ".lua", ".toml", ".html", ".js", ".sh")) or \
                not rel.startswith((*SOURCES, "pyproject")):
            continue
        text = (ROOT / rel).read_text(errors="replace")
        texts.append(text)
        names.add(Path(rel).stem)
        if not rel.endswith(".py"):
            names.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
            continue
        tree = ast.parse(text)
        if rel.startswith("rayorch"):
            package = Path(rel).parent
            member = Path(rel).stem if Path(rel).stem != "__init__" else package.name
            owner = package.name if Path(rel).stem != "__init__" else package.parent.name
            scopes.members.setdefault(owner, set()).add(member)
            scopes.add_module(Path(rel).stem if Path(rel).stem != "__init__"
                              else Path(rel).parent.name, tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and rel.startswith("rayorch"):
                scopes.add_class(node)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.arg | ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.update(node.name.split("."))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", node.value))
    return names, "\n".join(texts)


def is_path(token: str) -> bool:
    return "/" in token or bool(re.search(r"\.(py|lua|md|json|sh|toml|js|html)$", token))


def path_exists(token: str, files: list[str], text: str) -> bool:
    if any(c in token for c in "<*:$") or token.startswith("/"):
        return True  # a pattern, a URL or an absolute path: not a file of the tree
    token = token.rstrip("/")
    if "/" not in token and token in text:
        return True  # a file name the code writes (``_rayorch_sink.json``)
    return any(f == token or f.endswith("/" + token) for f in files)


def problems(doc: Path, files: list[str], names: set[str], text: str,
             scopes: Scopes) -> list[str]:
    found: list[str] = []
    for lineno, line in enumerate(doc.read_text().splitlines(), 1):
        for token in TICKED.findall(line):
            token = token.strip()
            for option in OPTION.findall(token):
                if option not in text:
                    found.append(f"{doc}:{lineno}: option {option} not in the source")
            for env in ENV.findall(token):
                if env not in text:
                    found.append(f"{doc}:{lineno}: variable ${env} not in the source")
            head = token.split(" ")[0] if is_path(token.split(" ")[0]) else token
            if is_path(head) and " " not in head and not head.startswith("-"):
                if not path_exists(head, files, text):
                    found.append(f"{doc}:{lineno}: no file {head}")
                continue
            call = re.sub(r"\(.*\)$", "", token)
            if IDENT.fullmatch(call) and f'"{call}"' not in text:
                missing = [part for part in call.split(".") if part not in names | EXTERNAL]
                if missing:
                    found.append(f"{doc}:{lineno}: {call}: {', '.join(missing)} not in the code")
                parts = call.split(".")
                for owner, member in itertools.pairwise(parts):
                    if not scopes.defines(owner, member):
                        found.append(f"{doc}:{lineno}: {owner} defines no {member}")
    return found


def headings(doc: Path) -> list[str]:
    """The headings of a Markdown document, without their ``#``."""
    return [h.lstrip("#").strip() for h in doc.read_text().splitlines() if h.startswith("#")]


def cites_heading(found: list[str], section: str) -> bool:
    """Whether a cited section names a heading: its text, or the start of it
    (``"Semantics" 4`` cites ``Semantics (what the tests check)``)."""
    return any(h.startswith(section) for h in found)


def citations(files: list[str]) -> list[str]:
    """Every ``docs/X.md, "Section"`` the code and the docs cite must be a heading of X."""
    found: list[str] = []
    for rel in files:
        if not rel.endswith((".py", ".lua", ".md")) or rel == "scripts/check_docs.py":
            continue
        text = (ROOT / rel).read_text(errors="replace")
        for match in CITATION.finditer(re.sub(r"\s*\n\s*(#|--)?\s*", " ", text)):
            target = ROOT / match.group(1)
            if not target.exists():
                found.append(f"{rel}: cites {match.group(1)}, which does not exist")
            elif not cites_heading(headings(target), match.group(2)):
                found.append(f'{rel}: cites {match.group(1)}, "{match.group(2)}": no such heading')
    return found


def main(argv: list[str]) -> int:
    files = repo_files()
    scopes = Scopes()
    names, text = code_names(files, scopes)
    found = [p for doc in argv for p in problems(Path(doc), files, names, text, scopes)]
    found += citations(files)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
