"""What a manifest read from the store may make a driver do: import a pipeline class, no more.

The lineage store is shared; whoever can write to it can write a run's manifest. A
driver that resumes a run therefore treats the manifest as data (docs/ARCHITECTURE.md,
"Trust model"):

* the pipeline is named ``package.module:Class``, both parts dotted Python identifiers;
* with an allowlist (``--trust MODULE``, ``$RAYORCH_TRUSTED_MODULES``), the module must be
  one of the listed modules or inside one of the listed packages, checked *before* the
  import (importing runs the module's top-level code);
* the named object must be a class derived from ``ro.Pipeline``'s base, checked with
  ``issubclass`` before anything is called;
* constructor arguments are msgpack data (never pickle).

Any refusal is one line (:class:`UntrustedPipelineError`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from typing import Any

from rayorch.core.errors import RayorchError

TRUST_ENV = "RAYORCH_TRUSTED_MODULES"
"""Comma-separated modules or packages a resumed run may import its pipeline from."""


class UntrustedPipelineError(RayorchError):
    """A run's manifest names something a driver refuses to import or call."""


def trusted_modules(extra: Iterable[str] | None = None) -> tuple[str, ...] | None:
    """The allowlist: ``extra`` (``--trust``) plus ``$RAYORCH_TRUSTED_MODULES``; None: no list."""
    names = [n.strip() for n in (extra or ())]
    names += [n.strip() for n in os.environ.get(TRUST_ENV, "").split(",")]
    names = [n for n in names if n]
    for name in names:
        if not _dotted_identifier(name):
            raise UntrustedPipelineError(
                f"trusted module {name!r} is not a module name like 'mypkg' or 'mypkg.pipelines'")
    return tuple(dict.fromkeys(names)) or None


def _dotted_identifier(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def module_allowed(module: str, allowlist: tuple[str, ...] | None) -> bool:
    """True without an allowlist; else ``module`` is a listed module or inside a listed package."""
    if allowlist is None:
        return True
    return any(module == entry or module.startswith(entry + ".") for entry in allowlist)


def load_pipeline_class(path: str, allowlist: tuple[str, ...] | None = None) -> type:
    """The ``ro.Pipeline`` subclass named by ``"pkg.module:Class"``; refuses anything else.

    Nothing is called: the module is imported (only when the allowlist admits it) and the
    attribute is looked up and checked with ``issubclass``.
    """
    from rayorch.core.program import PipelineBase

    text = path if isinstance(path, str) else repr(path)
    module_name, sep, qualname = text.partition(":")
    if not sep or not _dotted_identifier(module_name) or not _dotted_identifier(qualname):
        raise UntrustedPipelineError(
            f"refused: the run's pipeline {text[:200]!r} is not of the form 'package.module:Class'")
    if not module_allowed(module_name, allowlist):
        listed = ", ".join(allowlist or ())
        raise UntrustedPipelineError(
            f"refused: the run's pipeline {text!r} is in module {module_name!r}, which is not "
            f"trusted (trusted: {listed}); add it with --trust {module_name} or ${TRUST_ENV}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UntrustedPipelineError(
            f"the pipeline module {module_name!r} cannot be imported here ({exc}); install the "
            "code on every driver machine or set PYTHONPATH") from exc
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise UntrustedPipelineError(
                f"{module_name!r} has no {qualname!r}: the run's pipeline {text!r} names nothing")
    if not isinstance(obj, type) or not issubclass(obj, PipelineBase):
        kind = type(obj).__name__
        raise UntrustedPipelineError(
            f"refused: the run's pipeline {text!r} is a {kind}, not an ro.Pipeline subclass; "
            "a run's manifest may only name a pipeline class")
    return obj


__all__ = ["TRUST_ENV", "UntrustedPipelineError", "load_pipeline_class", "module_allowed",
           "trusted_modules"]
