"""Building, recording and running from a run's manifest (the stored record:
:mod:`rayorch.store.records.manifest`)."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from rayorch.core.facts import pack_value
from rayorch.store.records.manifest import ManifestError, RunManifest


def build_pipeline(manifest: RunManifest, trusted: tuple[str, ...] | None = None) -> Any:
    """Import the pipeline class and construct it with the recorded arguments.

    The class is checked first (:func:`rayorch.runtime.trust.load_pipeline_class`):
    an ``ro.Pipeline`` subclass, from a ``trusted`` module when an allowlist is given
    (default: ``$RAYORCH_TRUSTED_MODULES``).
    """
    from rayorch.runtime.trust import load_pipeline_class, trusted_modules

    cls = load_pipeline_class(manifest.pipeline, trusted or trusted_modules())
    try:
        return cls(*manifest.args, **manifest.kwargs)
    except Exception as exc:
        raise ManifestError(
            f"constructing the run's pipeline {manifest.pipeline}(*{manifest.args!r}, "
            f"**{manifest.kwargs!r}) failed: {exc}"
        ) from exc


def record_manifest(lineage: Any, run_id: str, manifest: RunManifest) -> None:
    """Keep ``manifest`` with the run (first writer wins); a run id reopened with another
    pipeline, other inputs or another sink is refused, in one line naming what differs."""
    from rayorch.store.errors import RunMismatchError

    stored = RunManifest.decode(bytes(lineage.save_manifest(run_id, manifest.encode())))
    differs = stored.difference(manifest)
    if differs is not None:
        raise RunMismatchError(run_id, *differs)


def import_path(path: str) -> Any:
    """``"pkg.mod:Qual.Name"`` -> the object; :class:`ManifestError` in plain words if absent."""
    module_name, _, qualname = path.partition(":")
    if not module_name or not qualname:
        raise ManifestError(f"{path!r} is not an import path of the form 'package.module:Class'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ManifestError(
            f"the pipeline module {module_name!r} cannot be imported here ({exc}); install the "
            "code on every driver machine or set PYTHONPATH"
        ) from exc
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ManifestError(f"{module_name!r} has no {qualname!r}: {path!r} names nothing")
    return obj


def pipeline_path(pipeline_cls: type) -> str:
    """The import path of a pipeline class; refuses classes another process cannot import."""
    module, qualname = pipeline_cls.__module__, pipeline_cls.__qualname__
    if module == "__main__":
        raise ManifestError(
            f"the pipeline class {qualname} is defined in __main__ (the running script), which "
            "another driver process cannot import; move it into an importable module"
        )
    if "<locals>" in qualname:
        raise ManifestError(
            f"the pipeline class {qualname} is defined inside a function, which another driver "
            "process cannot import; define it at module level"
        )
    path = f"{module}:{qualname}"
    if import_path(path) is not pipeline_cls:
        raise ManifestError(f"{path} does not import back as the same class; define the "
                            "pipeline class once, at module level")
    return path


def check_storable(rows: Sequence[tuple[Any, ...]], args: Any, kwargs: Any) -> None:
    """Raise :class:`ManifestError` unless sources and constructor arguments are msgpack-able."""
    try:
        pack_value([list(args), dict(kwargs)])
    except TypeError as exc:
        raise ManifestError(f"the pipeline's constructor arguments cannot be recorded: {exc}; "
                            "pass plain values (str, numbers, lists, dicts)") from exc
    for index, row in enumerate(rows):
        try:
            pack_value(list(row))
        except TypeError as exc:
            raise ManifestError(f"source {index} cannot be recorded: {exc}") from exc


def manifest_of_run(pipeline: Any, inputs: Sequence[Any], *, max_active_sources: int | None,
                    depth: int | None,
                    identities: Sequence[str | None] | None = None) -> RunManifest:
    """The manifest of a ``Pipeline.run``; :class:`ManifestError` says why there is none.

    Needs an importable pipeline class, constructor arguments recorded by ``PipelineBase``
    and msgpack-able, and inputs that are sequences (a generator cannot be read twice).
    """
    from rayorch.core.program import constructor_args

    path = pipeline_path(type(pipeline))
    args, kwargs = constructor_args(pipeline)
    for position, values in enumerate(inputs):
        if not isinstance(values, Sequence) or isinstance(values, str | bytes):
            raise ManifestError(
                f"input {position} of run() is a {type(values).__name__}, not a list or tuple, "
                "so its sources cannot be recorded; pass lists to make the run resumable")
    rows = [tuple(row) for row in zip(*inputs, strict=True)]
    check_storable(rows, args, kwargs)
    return RunManifest(path, tuple(args), dict(kwargs), tuple(rows), None,
                       max_active_sources, depth,
                       identities=None if identities is None else tuple(identities))


__all__ = ["build_pipeline", "check_storable", "import_path", "manifest_of_run", "pipeline_path",
           "record_manifest"]
