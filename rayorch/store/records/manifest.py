"""The run manifest as stored: what a run carries so that any driver can run it without
the one that created it (:mod:`rayorch.runtime.manifest` builds and records it).

At run creation the manifest records the pipeline's import path and constructor
arguments, every source row (so a driver can admit the sources of any shard), the
output sink (directory and format) and the driver knobs. It is msgpack (no pickle), kept
in the lineage store beside the run (``save_manifest``; first writer wins). Version 3
adds each source's identity (``SourceAdmitted.identity``, as the input listing gave it: what
reuse keys it by, so every driver of the run keys it alike); versions 1 (no format) and 2
(no identities) still decode.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.core.facts import pack_value, unpack_value

MANIFEST_VERSION = 3


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
    identities: tuple[str | None, ...] | None = None  # one per source (None: from metadata)

    def encode(self) -> bytes:
        identities = None if self.identities is None else list(self.identities)
        return pack_value([MANIFEST_VERSION, self.pipeline, list(self.args), self.kwargs,
                           [list(row) for row in self.sources], self.out_dir,
                           self.max_active_sources, self.depth, self.out_format, identities])

    @classmethod
    def decode(cls, blob: bytes) -> RunManifest:
        try:
            version, *fields = unpack_value(blob)
        except Exception as exc:
            raise ManifestError(f"the run's manifest cannot be read ({exc})") from exc
        if version not in (1, 2, MANIFEST_VERSION):
            raise ManifestError(f"run manifest version {version!r} is not supported "
                                f"(this rayorch reads 1 to {MANIFEST_VERSION}); upgrade rayorch")
        if version == 1:
            fields.append("jsonl")
        if version < 3:
            fields.append(None)
        try:
            pipeline, args, kwargs, sources, out_dir, cap, depth, out_format, identities = fields
        except ValueError:
            raise ManifestError(f"the run's manifest (version {version}) has {len(fields)} "
                                "fields; it is damaged") from None
        shapes = (isinstance(pipeline, str), isinstance(args, list | tuple),
                  isinstance(kwargs, dict) and all(isinstance(k, str) for k in kwargs),
                  isinstance(sources, list | tuple)
                  and all(isinstance(r, list | tuple) for r in sources),
                  out_dir is None or isinstance(out_dir, str),
                  cap is None or type(cap) is int, depth is None or type(depth) is int,
                  isinstance(out_format, str),
                  identities is None or (isinstance(identities, list | tuple)
                                         and len(identities) == len(sources)
                                         and all(i is None or isinstance(i, str)
                                                 for i in identities)))
        if not all(shapes):
            raise ManifestError("the run's manifest is malformed (a field has the wrong type); "
                                "it was not written by rayorch")
        return cls(pipeline, tuple(args), dict(kwargs), tuple(tuple(r) for r in sources),
                   out_dir, cap, depth, out_format,
                   None if identities is None else tuple(identities))

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
            ("input identities", f"digest {digest(list(self.identities or ()))}",
             f"digest {digest(list(other.identities or ()))}"),
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


__all__ = ["MANIFEST_VERSION", "ManifestError", "RunManifest"]
