"""Compile errors read as messages, not tracebacks, in a ``python script.py`` run.

``import rayorch`` installs :func:`compile_error_hook` as ``sys.excepthook`` (only when
no other hook was installed): an uncaught :class:`~rayorch.CompileError` prints its
``file:line``, problem and fix first, then one line naming where ``compile()`` was
called; any other exception goes to the hook that was there before. Set
``RAYORCH_TRACEBACK=1`` to see full tracebacks. See docs/ARCHITECTURE.md, "Program,
plan and facts".
"""

from __future__ import annotations

import os
import sys
import traceback
from types import TracebackType

from rayorch.core.errors import CompileError

_previous = sys.excepthook


def _caller_line(tb: TracebackType | None) -> str | None:
    """``file:line`` of the outermost frame outside rayorch (where compile/run was called)."""
    package = os.path.dirname(os.path.abspath(__file__))
    found = None
    for frame in traceback.extract_tb(tb):
        if not os.path.abspath(frame.filename).startswith(package):
            found = f"{frame.filename}:{frame.lineno}"
            break
    return found


def compile_error_hook(exc_type: type[BaseException], exc: BaseException,
                       tb: TracebackType | None) -> None:
    """Print a :class:`CompileError` as its message; hand anything else on."""
    if not issubclass(exc_type, CompileError) or os.environ.get("RAYORCH_TRACEBACK"):
        _previous(exc_type, exc, tb)
        return
    print(f"{exc_type.__name__}: {exc}", file=sys.stderr)
    where = _caller_line(tb)
    if where is not None:
        print(f"(raised by the compile called at {where}; RAYORCH_TRACEBACK=1 shows the "
              "traceback)", file=sys.stderr)


def install() -> None:
    """Install the hook unless someone else's hook is in place."""
    global _previous
    if sys.excepthook is sys.__excepthook__:
        _previous = sys.excepthook
        sys.excepthook = compile_error_hook
