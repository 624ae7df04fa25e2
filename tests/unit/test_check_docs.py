"""The architecture guide and its topic documents name only what exists, and every section
the code cites is there (``scripts/check_docs.py``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "scripts" / "check_docs.py"


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_architecture_guide_and_topics_name_only_what_exists() -> None:
    docs = [ROOT / "docs" / "ARCHITECTURE.md", *sorted((ROOT / "docs" / "topics").glob("*.md"))]
    assert len(docs) > 5
    done = subprocess.run([sys.executable, str(SCRIPT), *map(str, docs)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and not done.stdout, done.stdout + done.stderr


def test_the_checker_reports_names_files_options_and_sections_that_are_not_there(
        tmp_path: Path) -> None:
    checker = _checker()
    # Names built here, so that this file's own text does not define them for the checker.
    thing, method = "NoSuch" + "Thing", "no_such" + "_method"
    option, variable = "--no-such" + "-option", "RAYORCH_NO_SUCH" + "_VARIABLE"
    doc = tmp_path / "doc.md"
    doc.write_text("`core/commit.py` `commit_verdict` `ShardDriver.take` `--shard-size`\n"
                   f"`core/no_such_module.py` `{thing}` `ShardDriver.{method}`\n"
                   f"`{option}` `${variable}`\n")
    files = checker.repo_files()
    scopes = checker.Scopes()
    names, text = checker.code_names(files, scopes)
    found = checker.problems(doc, files, names, text, scopes)
    lines = [line.split(": ", 1)[0].rsplit(":", 1)[1] for line in found]
    assert lines == ["2", "2", "2", "2", "3", "3"], found
    joined = "\n".join(found)
    for missing in ("core/no_such_module.py", thing, method, option, variable):
        assert missing in joined
    headings = checker.headings(ROOT / "docs" / "ARCHITECTURE.md")
    assert "Semantics (what the tests check)" in headings
    assert not checker.cites_heading(headings, "No such section")
    assert checker.cites_heading(headings, "Semantics")
