"""One thread at a time through the standard library calls that build ``ast`` objects.

CPython 3.11 keeps the recursion depth of its AST conversion per process, not per thread:
two threads parsing at once fail with ``SystemError: AST constructor recursion depth
mismatch``. ``inspect.getsource`` of a class and ``inspect.signature`` of a builtin (a class
without its own ``__init__``) both parse; runs started from several threads call them.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

AST_LOCK = threading.Lock()


def signature(obj: Any) -> inspect.Signature:
    """``inspect.signature(obj)``, one thread at a time."""
    with AST_LOCK:
        return inspect.signature(obj)


__all__ = ["AST_LOCK", "signature"]
