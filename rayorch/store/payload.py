"""Durable payloads: outputs too large to sit inline in a fact are written to files.

An actor writes a large report's outputs (msgpack, via ``core.facts.pack_value``)
to the payload directory *before* its commit; the committed fact holds only the
reference. If the commit gate rejects the report, the file is deleted at once;
:meth:`PayloadStore.collect_garbage` removes files an actor left behind when it
died between writing and committing. A reference is a path relative to the
payload directory, so every process of a run must use the same directory.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from rayorch.core.facts import GrainCommitted, pack_value, unpack_value
from rayorch.core.ids import format_path
from rayorch.core.names import check_component, valid_run_id
from rayorch.store.errors import PayloadError

DEFAULT_THRESHOLD = 64 * 1024
SUFFIX = ".msgpack"


def default_payload_dir() -> Path:
    """``$RAYORCH_PAYLOAD_DIR``, else ``~/.cache/rayorch/payloads``."""
    env = os.environ.get("RAYORCH_PAYLOAD_DIR")
    return Path(env) if env else Path.home() / ".cache" / "rayorch" / "payloads"


class PayloadStore:
    """A directory of durable payload files, one per externalized report."""

    def __init__(self, root: Path | str | None = None, threshold: int = DEFAULT_THRESHOLD) -> None:
        self.root = Path(root) if root is not None else default_payload_dir()
        self.threshold = threshold

    def externalize(
        self, run_id: str, report: GrainCommitted, token: str
    ) -> tuple[GrainCommitted, str]:
        """Write the report's outputs to a file; return the report holding only the ref."""
        blob = pack_value(report.outputs)
        name = check_component(
            "payload file", f"{format_path(report.path)}.g{report.generation}.{token}{SUFFIX}")
        ref = f"{self._run_dir(run_id)}/{check_component('Call id', report.call)}/{name}"
        path = self._path(ref)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            raise PayloadError(ref, f"cannot write it under {self.root} ({exc})") from exc
        return replace(report, outputs=None, payload_ref=ref), ref

    @staticmethod
    def _run_dir(run_id: str) -> str:
        """The run's directory name: a valid run id, never ``.``/``..`` or a path."""
        if not valid_run_id(run_id):
            raise PayloadError(run_id, "not a valid run id, so it cannot name a payload directory")
        return run_id

    def _path(self, ref: str) -> Path:
        """The file of ``ref``, resolved; refused unless it lies strictly inside the root."""
        root = self.root.resolve()
        path = (root / ref).resolve()
        if path == root or not path.is_relative_to(root):
            raise PayloadError(ref, "the reference points outside the payload directory")
        return path

    def load(self, ref: str) -> tuple[Any, ...]:
        """The outputs stored under ``ref``."""
        try:
            data = self._path(ref).read_bytes()
        except OSError as exc:
            raise PayloadError(ref, f"cannot read it under {self.root} ({exc})") from exc
        return tuple(unpack_value(data))

    def resolve(self, fact: GrainCommitted) -> GrainCommitted:
        """The fact with its outputs loaded back (``payload_ref`` kept)."""
        if fact.payload_ref is None or fact.outputs is not None:
            return fact
        return replace(fact, outputs=self.load(fact.payload_ref))

    def delete(self, ref: str) -> None:
        """Remove a payload file (a rejected attempt's); missing files are fine."""
        try:
            self._path(ref).unlink(missing_ok=True)
        except OSError as exc:
            raise PayloadError(ref, f"cannot delete it ({exc})") from exc

    def refs(self, run_id: str) -> set[str]:
        """Every payload reference on disk for a run."""
        base = self._path(self._run_dir(run_id))
        if not base.is_dir() or base.is_symlink():
            return set()
        root = self.root.resolve()
        return {
            p.relative_to(root).as_posix()
            for p in base.rglob(f"*{SUFFIX}")
            if not p.name.startswith(".tmp-") and not p.is_symlink()
        }

    def collect_garbage(self, run_id: str, referenced: set[str]) -> list[str]:
        """Delete the run's payload files no committed fact refers to; returns them."""
        orphans = sorted(self.refs(run_id) - referenced)
        for ref in orphans:
            self.delete(ref)
        return orphans

    def delete_run(self, run_id: str) -> None:
        for ref in self.refs(run_id):
            self.delete(ref)
