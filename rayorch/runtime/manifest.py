"""What a run carries so that any driver can run it without the one that created it.

At run creation the manifest records the pipeline's import path and constructor
arguments, every source row (so a driver can admit the sources of any shard), the
output sink (directory and format, see :mod:`rayorch.runtime.sinks`) and the driver
knobs. It is msgpack (no pickle), kept in the lineage store beside the run
(``save_manifest``; first writer wins). Version 1 manifests (no format) still decode.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.core.facts import pack_value, unpack_value

MANIFEST_VERSION = 2


class ManifestError(RayorchError):
    """A run cannot be recorded for driver replicas, or its record cannot be used."""


@dataclass(frozen=True)
class RunManifest:
    """The run's pipeline (by import path), its sources and where its outputs go."""

    pipeline: str  # "package.module:QualName"
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    sources: tuple[tuple[Any, ...], ...] = ()
    out_dir: str | None = None
    max_active_sources: int | None = 256
    depth: int | None = None
    out_format: str = "jsonl"  # of the file sink in out_dir: "jsonl" | "parquet"

    def encode(self) -> bytes:
        return pack_value([MANIFEST_VERSION, self.pipeline, list(self.args), self.kwargs,
                           [list(row) for row in self.sources], self.out_dir,
                           self.max_active_sources, self.depth, self.out_format])

    @classmethod
    def decode(cls, blob: bytes) -> RunManifest:
        try:
            version, *fields = unpack_value(blob)
        except Exception as exc:
            raise ManifestError(f"the run's manifest cannot be read ({exc})") from exc
        if version not in (1, MANIFEST_VERSION):
            raise ManifestError(f"run manifest version {version!r} is not supported "
                                f"(this rayorch reads 1 to {MANIFEST_VERSION}); upgrade rayorch")
        if version == 1:
            fields.append("jsonl")
        try:
            pipeline, args, kwargs, sources, out_dir, cap, depth, out_format = fields
        except ValueError:
            raise ManifestError(f"the run's manifest (version {version}) has {len(fields)} "
                                "fields; it is damaged") from None
        shapes = (isinstance(pipeline, str), isinstance(args, list | tuple),
                  isinstance(kwargs, dict) and all(isinstance(k, str) for k in kwargs),
                  isinstance(sources, list | tuple)
                  and all(isinstance(r, list | tuple) for r in sources),
                  out_dir is None or isinstance(out_dir, str),
                  cap is None or type(cap) is int, depth is None or type(depth) is int,
                  isinstance(out_format, str))
        if not all(shapes):
            raise ManifestError("the run's manifest is malformed (a field has the wrong type); "
                                "it was not written by rayorch")
        return cls(pipeline, tuple(args), dict(kwargs), tuple(tuple(r) for r in sources),
                   out_dir, cap, depth, out_format)

    def difference(self, other: RunManifest) -> tuple[str, str, str] | None:
        """The first thing ``other`` records otherwise: ``(what, here, there)``, or None."""
        def digest(value: Any) -> str:
            return hashlib.sha256(pack_value(value)).hexdigest()[:12]

        def sources(m: RunManifest) -> str:
            return f"{len(m.sources)} sources (digest {digest([list(r) for r in m.sources])})"

        checks = [
            ("pipeline", self.pipeline, other.pipeline),
            ("constructor arguments", f"digest {digest([list(self.args), self.kwargs])}",
             f"digest {digest([list(other.args), other.kwargs])}"),
            ("inputs", sources(self), sources(other)),
            ("output directory", repr(self.out_dir), repr(other.out_dir)),
            ("output format", self.out_format, other.out_format),
            ("max_active_sources", repr(self.max_active_sources),
             repr(other.max_active_sources)),
            ("depth", repr(self.depth), repr(other.depth)),
        ]
        for what, here, there in checks:
            if here != there:
                return what, here, there
        return None

    def build_pipeline(self, trusted: tuple[str, ...] | None = None) -> Any:
        """Import the pipeline class and construct it with the recorded arguments.

        The class is checked first (:func:`rayorch.runtime.trust.load_pipeline_class`):
        an ``ro.Pipeline`` subclass, from a ``trusted`` module when an allowlist is given
        (default: ``$RAYORCH_TRUSTED_MODULES``).
        """
        from rayorch.runtime.trust import load_pipeline_class, trusted_modules

        cls = load_pipeline_class(self.pipeline, trusted or trusted_modules())
        try:
            return cls(*self.args, **self.kwargs)
        except Exception as exc:
            raise ManifestError(
                f"constructing the run's pipeline {self.pipeline}(*{self.args!r}, "
                f"**{self.kwargs!r}) failed: {exc}"
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
                    depth: int | None) -> RunManifest:
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
                       max_active_sources, depth)


__all__ = ["ManifestError", "RunManifest", "check_storable", "import_path",
           "manifest_of_run", "pipeline_path", "record_manifest"]
