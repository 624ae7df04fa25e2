"""The input files of a job: finding them, the first checks on each, and failure causes.

Shared by the PDF and video jobs (and run inside their actors): a bad file becomes
``ro.RecordFailure("<kind>: <detail>")`` for that source only, and ``failure_kind``
counts causes by kind (docs/ARCHITECTURE.md, "PDF pipeline" and "Video pipeline").
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.core.outcome import RecordFailure


def refuse(kind: str, detail: str) -> RecordFailure:
    """A per-source failure whose cause reads ``"<kind>: <detail>"`` on one line."""
    return RecordFailure(f"{kind}: {' '.join(detail.split())}")


_PROPAGATED = re.compile(r"^[\w.@]+\[[\d.]+\] failed: ")


def failure_kind(cause: str | None) -> str:
    """The stable part of a cause, for counting failures by kind.

    ``"encrypted: x.pdf needs ..."`` -> ``"encrypted"``; a cause propagated by the
    runtime (``"render[3] failed: encrypted: ..."``) counts as its origin's kind.

    >>> failure_kind("probe[0] failed: empty: a.mp4 is an empty file (0 bytes)")
    'empty'
    """
    if not cause:
        return "unknown"
    while _PROPAGATED.match(cause):
        cause = _PROPAGATED.sub("", cause, count=1)
    return cause.split(":", 1)[0].strip()[:60]


def check_file(source: Any, what: str, head_bytes: int) -> tuple[Path, bytes]:
    """``source`` as a path to a non-empty regular file, and its first ``head_bytes``.

    Raises ``RecordFailure`` (kinds: bad input, missing, not a file, empty); ``what``
    names the expected file in the message (``"PDF"``, ``"video"``).
    """
    if not isinstance(source, (str, Path)):
        raise refuse("bad input", f"expected a {what} path (str), got {type(source).__name__}")
    path = Path(source)
    if not path.exists():
        raise refuse("missing", f"{path} does not exist")
    if not path.is_file():
        raise refuse("not a file", f"{path} is a directory or special file")
    with path.open("rb") as fh:
        head = fh.read(head_bytes)
    if not head:
        raise refuse("empty", f"{path} is an empty file (0 bytes)")
    return path, head


def find_files(source: str | Path, suffixes: Collection[str], what: str) -> list[str]:
    """The files under a directory whose suffix is one of ``suffixes`` (recursive, sorted),
    or ``source`` itself when it is a file; ``what`` names them in the error."""
    root = Path(source)
    if root.is_dir():
        return [str(p) for p in sorted(root.rglob("*"))
                if p.suffix.lower() in suffixes and not p.is_dir()]
    if root.exists():
        return [str(root)]
    raise RayorchError(f"input {root} does not exist: pass a {what} file or a directory "
                       f"of {what}s")


__all__ = ["check_file", "failure_kind", "find_files", "refuse"]
