"""Durable payloads: outputs too large to sit inline in a fact are written to files.

An actor writes a large report's outputs (msgpack, via ``core.facts.pack_value``)
to the payload directory *before* its commit; the committed fact holds only the
reference. A file is named by its Grain, generation and content digest
(``<path>.g<generation>.<digest>.msgpack``), so a commit retried after a lost reply
writes the very file the first attempt may have committed, and a read checks the
content against the name. The store deletes a file only when the commit gate
definitely rejected it (docs/ARCHITECTURE.md, "Payload files and uncertain commits");
``rayorch gc`` (:mod:`rayorch.store.retention`) removes files no committed fact refers
to (an actor that died between writing and committing, a commit whose reply was lost).
A reference is a key relative to the payload location, so every process of a run must
use the same location: a directory they all see, or an object store prefix
(``payload_dir=s3://bucket/payloads`` in the store URL), which needs no shared disk.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from rayorch.core.facts import GrainCommitted, GrainReused, pack_value, unpack_value
from rayorch.core.ids import format_path
from rayorch.core.names import check_component, valid_run_id
from rayorch.core.vocabulary import CommitVerdict
from rayorch.storage import Storage, StorageError, check_key, open_storage
from rayorch.store.errors import PayloadError

Sealing = TypeVar("Sealing", bound=GrainCommitted | GrainReused)  # may hold a payload_ref
DEFAULT_THRESHOLD = 64 * 1024
SUFFIX = ".msgpack"
_DIGESTED = re.compile(r"\.g\d+\.([0-9a-f]{32})\.msgpack$")


def content_digest(blob: bytes) -> str:
    """The 128-bit BLAKE2b digest (hex) that names a payload file."""
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


def default_payload_dir() -> Path:
    """``$RAYORCH_PAYLOAD_DIR``, else ``~/.cache/rayorch/payloads``."""
    env = os.environ.get("RAYORCH_PAYLOAD_DIR")
    return Path(env) if env else Path.home() / ".cache" / "rayorch" / "payloads"


OWNER_FILE = ".rayorch-owner"
"""In each run's payload folder: which store wrote it (several stores may share a root)."""


def store_identity(url: str) -> str:
    """The store a URL reaches, without its password and options: ``redis://host:6379/0``."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, hosts, parts.path, "", ""))


class PayloadStore:
    """A directory or object store prefix of durable payload files, one per externalized
    report (docs/ARCHITECTURE.md, "Storage is a URL").

    ``owner`` (:func:`store_identity` of the store's URL) is written into each run folder
    it creates, so retention touches only its own store's folders of a shared root.
    """

    def __init__(self, root: Path | str | None = None, threshold: int = DEFAULT_THRESHOLD,
                 owner: str = "") -> None:
        try:
            self.storage: Storage = open_storage(root if root is not None
                                                 else default_payload_dir())
        except StorageError as exc:
            raise PayloadError(str(root), f"cannot use it as the payload directory ({exc})"
                               ) from None
        self.root = self.storage.url
        """Where the payloads are, as printed: a path or ``s3://bucket/prefix``."""
        self.threshold = threshold
        self.owner = owner
        self._claimed: set[str] = set()  # run folders whose owner mark is known written

    def owner_of(self, run_dir: str) -> str | None:
        """Which store wrote the payload folder ``run_dir`` (None: unknown, an older one)."""
        try:
            return self.storage.read(f"{self._run_dir(run_dir)}/{OWNER_FILE}").decode().strip()
        except (OSError, StorageError, UnicodeDecodeError, PayloadError):
            return None

    def _claim(self, run_dir: str) -> None:
        """Write the owner mark of ``run_dir`` once (a conditional create: the first
        writer's mark stands), not a request per payload file."""
        if not self.owner or run_dir in self._claimed:
            return
        self.storage.create(f"{run_dir}/{OWNER_FILE}", self.owner.encode())
        self._claimed.add(run_dir)

    def externalize(self, run_id: str, report: GrainCommitted) -> tuple[GrainCommitted, str]:
        """Write the report's outputs to a file; return the report holding only the ref.

        The same report always goes to the same name (named by its content), written whole
        by a conditional create: a retry finds it there, byte for byte the same.
        """
        blob = pack_value(report.outputs)
        name = check_component(
            "payload file",
            f"{format_path(report.path)}.g{report.generation}.{content_digest(blob)}{SUFFIX}")
        run_dir = self._run_dir(run_id)
        ref = f"{run_dir}/{check_component('Call id', report.call)}/{name}"
        try:
            self._claim(run_dir)
            self.storage.create(self._key(ref), blob)
        except StorageError as exc:
            raise PayloadError(ref, f"cannot write it under {self.root} ({exc})") from exc
        return replace(report, outputs=None, payload_ref=ref), ref

    @staticmethod
    def _run_dir(run_id: str) -> str:
        """The run's directory name: a valid run id, never ``.``/``..`` or a path."""
        if not valid_run_id(run_id):
            raise PayloadError(run_id, "not a valid run id, so it cannot name a payload directory")
        return run_id

    def _key(self, ref: str) -> str:
        """``ref`` as a key; refused unless it lies strictly inside the root (a reference
        read from the store is untrusted)."""
        try:
            key = check_key(ref)
        except StorageError:
            key = ""
        local = self.storage.local_path(key) if key else None
        if local is not None:
            root = Path(self.root).resolve()
            path = local.resolve()
            if path == root or not path.is_relative_to(root):
                key = ""
        if not key:
            raise PayloadError(ref, "the reference points outside the payload directory")
        return key

    def load(self, ref: str) -> tuple[Any, ...]:
        """The outputs stored under ``ref``; :class:`PayloadError` if missing or corrupt."""
        try:
            data = self.storage.read(self._key(ref))
        except (OSError, StorageError) as exc:
            raise PayloadError(ref, f"cannot read it under {self.root} ({exc})") from exc
        named = _DIGESTED.search(ref)
        if named is not None and content_digest(data) != named[1]:
            raise PayloadError(ref, "its content does not match the digest in its name "
                                    "(the file is corrupt or was altered)")
        try:
            value = unpack_value(data)
        except Exception as exc:  # msgpack raises several types on bad bytes
            raise PayloadError(ref, f"cannot decode it ({type(exc).__name__}: {exc})") from exc
        if not isinstance(value, list | tuple):
            raise PayloadError(ref, "it does not hold a list of outputs")
        return tuple(value)

    def resolve(self, fact: Sealing) -> Sealing:
        """The fact with its outputs loaded back (``payload_ref`` kept)."""
        if fact.payload_ref is None or fact.outputs is not None:
            return fact
        return replace(fact, outputs=self.load(fact.payload_ref))

    def delete(self, ref: str) -> None:
        """Remove a payload file (a rejected attempt's); missing files are fine."""
        try:
            self.storage.delete(self._key(ref))
        except StorageError as exc:
            raise PayloadError(ref, f"cannot delete it ({exc})") from exc

    def ref_times(self, run_id: str) -> dict[str, float | None]:
        """Every payload reference stored for a run, with its modification time."""
        folder = self._run_dir(run_id)
        try:
            return {info.key: info.mtime for page in self.storage.walk(folder) for info in page
                    if info.key.endswith(SUFFIX) and not info.key.rpartition("/")[2]
                    .startswith(".")}
        except StorageError as exc:
            raise PayloadError(folder, f"cannot list it under {self.root} ({exc})") from exc

    def refs(self, run_id: str) -> set[str]:
        """Every payload reference stored for a run."""
        return set(self.ref_times(run_id))

    def run_dirs(self) -> dict[str, bool]:
        """The run folders under the root: name -> whether it holds a payload file."""
        found: dict[str, bool] = {}
        try:
            for page in self.storage.walk(""):
                for info in page:
                    folder, sep, rest = info.key.partition("/")
                    if sep and valid_run_id(folder):
                        found[folder] = found.get(folder, False) or rest.endswith(SUFFIX)
        except StorageError as exc:
            raise PayloadError(self.root, f"cannot list it ({exc})") from exc
        return found

    def delete_run(self, run_id: str, keep: set[str] | frozenset[str] = frozenset()) -> None:
        """Remove the run's payload files but ``keep`` (files later runs reuse), then its
        folders once empty (and its owner mark, unless a kept file remains)."""
        held = self.refs(run_id)
        for ref in held - set(keep):
            self.delete(ref)
        if keep & held:
            return
        base = self._run_dir(run_id)
        self._claimed.discard(base)
        try:
            self.storage.delete(f"{base}/{OWNER_FILE}")
            self.storage.remove_empty_dirs(base)
        except StorageError as exc:
            raise PayloadError(base, f"cannot delete it ({exc})") from exc


def deletable_refs(
    refs: Mapping[int, str],
    verdicts: Sequence[CommitVerdict],
    reports: Sequence[GrainCommitted],
    sealed_generations: Callable[[list[int]], list[int | None]],
) -> set[str]:
    """The payload files of one commit call that no committed fact can name.

    ``refs`` maps a report's position to its file. A file is named by Grain,
    generation and content: STALE, NOT_DISPATCHED and BARRED leave the Grain
    unsealed at that generation, so no committed fact names the file; SEALED may be
    this very report committed by an earlier call whose reply was lost, so its file
    goes only if the Grain was sealed at another generation (``sealed_generations``
    reads that, for the positions given). A file an accepted report uses is kept.
    """
    keep = {ref for position, ref in refs.items() if verdicts[position].accepted}
    doomed: set[str] = set()
    sealed: list[int] = []
    for position, ref in refs.items():
        if ref in keep:
            continue
        if verdicts[position] is CommitVerdict.SEALED:
            sealed.append(position)
        else:
            doomed.add(ref)
    if sealed:
        for position, generation in zip(sealed, sealed_generations(sealed)):
            if generation is not None and generation != reports[position].generation:
                doomed.add(refs[position])
    return doomed - keep
