"""Names that become path components: run ids, Call ids, module attribute names.

A run id and a Call id name a directory under the payload directory, part of a Redis
key and of a Ray actor name, so each must be one harmless path component: not ``.``
or ``..``, no separator, no control character (docs/ARCHITECTURE.md, "Trust model").
"""

from __future__ import annotations

import re
import unicodedata

from rayorch.core.errors import RayorchError

_RUN_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
_SEPARATORS = frozenset("/\\")


class UnsafeNameError(RayorchError, ValueError):
    """A name that would be used as a path component is not a single, plain component."""


def _has_control(text: str) -> bool:
    return any(unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") for ch in text)


def component_problem(text: object) -> str | None:
    """Why ``text`` is not a single safe path component, or None when it is."""
    if not isinstance(text, str):
        return f"it is a {type(text).__name__}, not a str"
    if not text:
        return "it is empty"
    if text in (".", ".."):
        return f"{text!r} names a directory, not a file"
    if any(ch in _SEPARATORS for ch in text):
        return "it contains a path separator"
    if _has_control(text):
        return "it contains control characters"
    if len(text) > 200:
        return "it is longer than 200 characters"
    return None


def check_component(kind: str, text: object) -> str:
    """``text`` if it is a single safe path component; :class:`UnsafeNameError` otherwise."""
    problem = component_problem(text)
    if problem is not None:
        raise UnsafeNameError(f"{kind} {text!r} cannot be used as a file or key name: {problem}")
    assert isinstance(text, str)
    return text


def valid_run_id(run_id: object) -> bool:
    """Run ids: 1-128 letters, digits, ``_``, ``.``, ``-``, starting with a letter, digit or ``_``.

    So ``.``/``..`` (directories), ``-x`` (a command-line option) and hidden names are refused.
    """
    return isinstance(run_id, str) and bool(_RUN_ID.match(run_id))


def module_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a module attribute name, or None when it can.

    It becomes part of Call ids, payload directories, Redis keys and Ray actor names, so
    it must be a Python identifier: no ``.`` (dotted names join attributes), no
    separators, ``|``, ``:``, ``@`` or control characters.
    """
    if not isinstance(name, str) or not name.isidentifier():
        return (f"module attribute {name!r} is not a Python identifier, so it cannot name a "
                "Call, a payload directory or a store key")
    return None


__all__ = ["UnsafeNameError", "check_component", "component_problem", "module_name_problem",
           "valid_run_id"]
