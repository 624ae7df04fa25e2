"""What a Ray error says, on one line: the cause of a dead actor or of a constructor that
raised, for the pool's messages (``actors/pool.py``)."""

from __future__ import annotations

import re

from rayorch.core.sanitize import strip_ansi


def first_line(exc: BaseException) -> str:
    text = strip_ansi(str(exc)).strip().splitlines()
    return text[0] if text else ""


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure)?: \S")


def raised_line(exc: BaseException) -> str:
    """``SomeError: message`` of the exception a remote constructor raised, on one line.

    That exception ends Ray's report, after the traceback's last frame; all its lines are
    kept (a pydantic ``ValidationError`` says what is wrong on the lines after its first),
    joined with spaces. Without a traceback: the report's last ``SomeError: ...`` line,
    else its first line.
    """
    lines = strip_ansi(str(exc)).splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    if frames:
        rest = lines[frames[-1] + 1:]
        while rest and (not rest[0].strip() or rest[0][0].isspace()):  # its code, carets
            rest = rest[1:]
        if rest and _EXCEPTION_LINE.match(rest[0]):
            return shorten(" ".join(line.strip() for line in rest if line.strip()))
    raised = [line for line in lines if _EXCEPTION_LINE.match(line)]
    return shorten(raised[-1].strip() if raised else first_line(exc))


def shorten(cause: str, limit: int = 1000) -> str:
    return cause if len(cause) <= limit else cause[: limit - 3] + "..."


def first_line_with(exc: BaseException, needle: str) -> str:
    for line in strip_ansi(str(exc)).splitlines():
        if needle in line:
            return line.strip().removeprefix("ModuleNotFoundError: ")
    return first_line(exc)


__all__ = ["first_line", "first_line_with", "raised_line", "shorten"]
