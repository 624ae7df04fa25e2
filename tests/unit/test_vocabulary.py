"""The Lua scripts speak the vocabulary of ``rayorch.core.vocabulary``: same phases, fact
kinds and verdicts, and no script spells a phase or a verdict as a bare literal."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rayorch.core.vocabulary import PHASE_AFTER, CommitVerdict, FactKind, GrainPhase
from rayorch.store import scripts

LUA = Path(scripts.__file__).parent / "lua"
VOCABULARY = LUA / "includes" / "vocabulary.lua"
TABLES: dict[str, type[GrainPhase] | type[FactKind] | type[CommitVerdict]] = {
    "PHASE": GrainPhase, "KIND": FactKind, "VERDICT": CommitVerdict}
CONSTANT = re.compile(r"^local (PHASE|KIND|VERDICT)_([A-Z_]+) = (-?\d+)$", re.MULTILINE)
# Literals that would spell a phase, a kind or a verdict outside the vocabulary include.
BARE = [
    (re.compile(r"'\d+:"), "a Grain entry spelled as '<digit>:'"),
    (re.compile(r"\b(?:4[89]|5[0-7])\b"), "a phase spelled as a character code"),
    (re.compile(r"\bv = -?\d"), "a verdict spelled as a number"),
    (re.compile(r"kind [~=]= '?\d"), "a fact kind spelled as a number"),
]


def code_of(text: str) -> str:
    """The Lua source without comments (``--[[ ... ]]`` blocks and ``--`` to end of line)."""
    text = re.sub(r"--\[\[.*?\]\]", "", text, flags=re.DOTALL)
    return re.sub(r"--[^\n]*", "", text)


def lua_constants(text: str) -> dict[str, dict[str, int]]:
    found: dict[str, dict[str, int]] = {prefix: {} for prefix in TABLES}
    for prefix, name, value in CONSTANT.findall(code_of(text)):
        found[prefix][name] = int(value)
    return found


def test_lua_constants_are_the_table() -> None:
    declared = lua_constants(VOCABULARY.read_text())
    for prefix, table in TABLES.items():
        for name, value in declared[prefix].items():
            assert name in table.__members__, f"{prefix}_{name}: not in {table.__name__}"
            assert table[name] == value, \
                f"{prefix}_{name} = {value} in Lua, {table[name].value} in {table.__name__}"
    assert set(declared["KIND"]) == set(FactKind.__members__)
    assert set(declared["VERDICT"]) == set(CommitVerdict.__members__)
    # the phases the store keeps: every phase a driver fact or a commit leaves behind
    kept = {p.name for p in PHASE_AFTER.values()} | {"SEALED"}
    assert kept <= set(declared["PHASE"])
    assert all(0 <= p < 10 for p in GrainPhase)  # a Grain entry holds its phase as one digit


def test_lua_phase_after_is_the_table() -> None:
    code = code_of(VOCABULARY.read_text())
    line = re.search(r"^local PHASE_AFTER = \{(.*)\}$", code, re.MULTILINE)
    assert line is not None, "includes/vocabulary.lua declares no PHASE_AFTER"
    pairs = dict(re.findall(r"\[KIND_([A-Z_]+)\] = PHASE_([A-Z_]+)", line[1]))
    assert pairs == {kind.name: phase.name for kind, phase in PHASE_AFTER.items()}


@pytest.mark.parametrize("script", sorted(p.name for p in LUA.glob("*.lua")))
def test_scripts_use_the_names_not_bare_literals(script: str) -> None:
    code = code_of((LUA / script).read_text())
    for pattern, what in BARE:
        match = pattern.search(code)
        assert match is None, f"{script}: {what}: {match and match[0]!r}; use the names " \
                              "of includes/vocabulary.lua"
    uses = re.search(r"\b(?:PHASE|KIND|VERDICT)_[A-Z]|\bentry_phase\b", code)
    if uses:
        assert '--- @include "vocabulary"' in (LUA / script).read_text(), \
            f"{script} uses {uses[0]} without including the vocabulary"


def test_the_loaded_scripts_carry_the_vocabulary() -> None:
    for script in (scripts.COMMIT_BATCH, scripts.APPEND_FENCED):
        assert f"local PHASE_SEALED = {GrainPhase.SEALED.value}" in script.source
        assert "@include" not in script.source
