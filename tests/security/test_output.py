"""Text from the store is sanitised before the CLI prints it; causes are stored without ANSI.

Measured before (issue 12): ``rayorch show`` and ``status`` printed untrusted text raw
(UDF error messages, driver ids), so an error message could retitle or clear the
operator's terminal; Ray's ANSI colour codes ended up stored in causes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rayorch.cli import main as cli_main
from rayorch.core.facts import (
    GrainCommitted,
    GrainDispatched,
    OutputEmitted,
    RunCompleted,
    SourceAdmitted,
)
from rayorch.core.outcome import RecordFailure
from rayorch.core.sanitize import sanitize, strip_ansi
from rayorch.core.udf import one_line_cause, reports_for
from rayorch.store import open_store
from rayorch.testing import EchoPipeline

EVIL = "\x1b]0;pwned\x07\x1b[2J\x1b[31mboom\x1b[0m\r\n  fake: all good\x9b1m\x07\x08\u202e"
UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]")


def _hostile_run(url: str) -> None:
    store = open_store(url)
    store.open_run("evil", EchoPipeline().compile(), config={"sources": 1})
    epoch = store.acquire_lease("evil", 0, f"drv{EVIL}", 30)
    store.heartbeat("evil", f"drv{EVIL}", 30)
    store.append("evil", 0, epoch, [SourceAdmitted(0, (EVIL,), key=EVIL),
                                    GrainDispatched("echo", (0,), 0)], driver=f"drv{EVIL}")
    store.commit("evil", [GrainCommitted("echo", (0,), 0, "record_failure", None, EVIL)])
    store.append("evil", 0, epoch, [OutputEmitted(0, "failed"), RunCompleted(1)],
                 driver=f"drv{EVIL}")


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_cli_text_output_has_no_terminal_escapes(
        redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _hostile_run(redis_url)
    commands = [["show", "evil", "0"], ["status", "evil"], ["audit", "evil"], ["runs"],
                ["timeline", "evil", "-o", str(tmp_path / "t.png")],
                ["show", "evil", "0", "--json"], ["status", "evil", "--json"]]
    for command in commands:
        cli_main([*command, "--store", redis_url])
        out = capsys.readouterr()
        text = out.out + out.err
        assert not UNSAFE.search(text), (command, text)
        assert "fake: all good" not in "\n".join(line.lstrip() for line in text.splitlines()
                                                 if line.lstrip().startswith("fake")), command
    cli_main(["show", "evil", "0", "--store", redis_url])
    shown = capsys.readouterr().out
    assert "boom" in shown and "\\r\\n  fake: all good" in shown  # visible, escaped


def test_sanitize_strips_ansi_and_escapes_control_characters() -> None:
    assert sanitize(EVIL) == "boom\\r\\n  fake: all good\\x07\\x08\\u202e"
    assert sanitize("two\nlines", newlines=True) == "two\nlines"
    assert sanitize("plain text, ünïcode") == "plain text, ünïcode"
    assert strip_ansi("\x1b[1m\x1b[31mRayActorError\x1b[39m\x1b[22m: died") == (
        "RayActorError: died")


def test_causes_are_stored_without_colour_codes() -> None:
    assert one_line_cause(ValueError("\x1b[31mbad\x1b[0m input")) == "ValueError: bad input"
    reports = reports_for("echo", [((0,), 0), ((1,), 0)],
                          [RecordFailure("\x1b[33mwarn\x1b[0m: x"), ("ok",)])
    assert reports[0].cause == "warn: x" and reports[1].outputs == ("ok",)
