"""Durable payloads: outputs larger than a reference leave the facts for segment objects.

An actor's commit writes the outputs of every report over the threshold (msgpack, via
``core.facts.pack_value``) to ONE *segment* per shard of the call *before* the commit:
a committed batch of B values costs one PUT. A segment is named by its batch's Call and
a digest of its Grains, generations and bytes (``<run>/<call>/<digest>.seg``) and
written whole by a conditional create, so a commit retried after a lost reply writes the
very object the first attempt may have committed, and none is ever overwritten or seen
in part. A value's reference is its
segment, offset and length (``<run>/<call>/<digest>.seg@<offset>+<length>``), read back by
one ranged read; each value in a segment starts with the digest of its bytes, checked on
load. The store deletes a segment only when the commit gate definitely rejected every
value in it (docs/topics/PAYLOADS.md, "Payload segments and uncertain commits"); ``rayorch
gc`` (:mod:`rayorch.store.retention`) removes objects no committed fact refers to (an
actor that died between writing and committing, a commit whose reply was lost).
References of older runs (one file per report, ``<path>.g<gen>.<digest>.msgpack``)
still resolve. A reference is a key relative to the payload location, so every process
of a run must use the same location: a directory they all see, or an object store prefix
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

from rayorch.core.facts import GrainCommitted, GrainReused, outline_of, pack_value, unpack_value
from rayorch.core.names import check_component, valid_run_id
from rayorch.core.vocabulary import CommitVerdict
from rayorch.storage import Storage, StorageError, check_key, open_storage, parse_location
from rayorch.store.errors import PayloadError, PayloadMissingError

Sealing = TypeVar("Sealing", bound=GrainCommitted | GrainReused)  # may hold a payload_ref
DEFAULT_THRESHOLD = 128
"""Outputs whose msgpack bytes are at most this stay inline in the fact: about the size of
a segment reference (~70 bytes with the run id), so a fact never holds more than a
reference would cost (docs/topics/PAYLOADS.md, "Payload segments and uncertain commits")."""
SUFFIX = ".msgpack"
SEGMENT_SUFFIX = ".seg"
SEGMENT_DIR = "seg"  # the folder of a segment with no report (never written)
VALUE_DIGEST = 16  # bytes of BLAKE2b before each value in a segment
_DIGESTED = re.compile(r"\.g\d+\.([0-9a-f]{32})\.msgpack$")
_SEGMENT_REF = re.compile(r"^(?P<key>[^@]+\.seg)@(?P<offset>\d{1,15})\+(?P<length>\d{1,15})$")


def object_of(ref: str) -> str:
    """The object a reference lives in: its segment, or (older runs) its own file."""
    match = _SEGMENT_REF.match(ref)
    return match["key"] if match else ref


def run_of_ref(ref: str) -> str:
    """The run whose payload folder a reference lies in (its first component)."""
    return ref.partition("/")[0]


def is_payload_object(key: str) -> bool:
    """A key that names a payload object (a segment or an older run's file)."""
    name = key.rpartition("/")[2]
    return key.endswith((SUFFIX, SEGMENT_SUFFIX)) and not name.startswith(".")


def pack_segment(blobs: Sequence[bytes]) -> tuple[bytes, list[tuple[int, int]]]:
    """The bytes of a segment holding ``blobs`` (each a report's packed outputs), and each
    value's (offset, length): its digest, then its msgpack bytes."""
    parts: list[bytes] = []
    spans: list[tuple[int, int]] = []
    offset = 0
    for blob in blobs:
        record = hashlib.blake2b(blob, digest_size=VALUE_DIGEST).digest() + blob
        parts.append(record)
        spans.append((offset, len(record)))
        offset += len(record)
    return b"".join(parts), spans


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
    report (docs/topics/STORAGE.md, "Storage is a URL").

    ``owner`` (:func:`store_identity` of the store's URL) is written into each run folder
    it creates, so retention touches only its own store's folders of a shared root.
    """

    def __init__(self, root: Path | str | None = None, threshold: int = DEFAULT_THRESHOLD,
                 owner: str = "") -> None:
        if root is None:
            root = default_payload_dir()
        try:
            if parse_location(str(root)).is_local:  # recorded with each run: one place for all
                root = Path(root).expanduser().resolve()
            self.storage: Storage = open_storage(root)
        except StorageError as exc:
            raise PayloadError(str(root), f"cannot use it as the payload directory ({exc})"
                               ) from None
        self.root = self.storage.url
        """Where the payloads are, as printed: a path or ``s3://bucket/prefix``."""
        self.threshold = threshold
        self.owner = owner
        self._claimed: set[str] = set()  # run folders whose owner mark is known written
        self.written = 0
        """Bytes of the segments this client wrote (a retry that found its own counts too)."""

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

    def write_segment(self, run_id: str, reports: Sequence[GrainCommitted],
                      packed: Sequence[bytes] | None = None
                      ) -> tuple[list[GrainCommitted], list[str]]:
        """Write the reports' outputs (``packed``: their ``pack_value`` bytes, if known) to
        one segment; return the reports holding only their references, and the references.

        The same reports always make the same segment (named by their Grains,
        generations and content), written
        whole by a conditional create: a retry finds it there, byte for byte the same.
        """
        if packed is None:
            packed = [pack_value(report.outputs or ()) for report in reports]
        blob, spans = pack_segment(packed)
        run_dir = self._run_dir(run_id)
        call = check_component("Call id", reports[0].call) if reports else SEGMENT_DIR
        # Named by its Grains and generations as well as its bytes: two batches of equal
        # values never share an object, so deleting a rejected batch's segment never takes
        # another batch's values; only a retry of the same reports finds its own segment.
        grains = pack_value([[r.call, list(r.path), r.generation] for r in reports])
        key = f"{run_dir}/{call}/{content_digest(grains + blob)}{SEGMENT_SUFFIX}"
        try:
            self._claim(run_dir)
            self.storage.create(self._key(key), blob)
            self.written += len(blob)
        except StorageError as exc:
            raise PayloadError(key, f"cannot write it under {self.root} ({exc})") from exc
        refs = [f"{key}@{offset}+{length}" for offset, length in spans]
        return [replace(r, outputs=None, payload_ref=ref, outline=outline_of(r.outputs or ()))
                for r, ref in zip(reports, refs)], refs

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
        segment = _SEGMENT_REF.match(ref)
        try:
            if segment is None:
                data = self.storage.read(self._key(ref))
            else:
                start = int(segment["offset"])
                record = self.storage.read_range(self._key(segment["key"]), start,
                                                 start + int(segment["length"]))
        except FileNotFoundError:  # local and object stores alike
            raise PayloadMissingError(ref, f"it is not under {self.root}") from None
        except (OSError, StorageError) as exc:
            raise PayloadError(ref, f"cannot read it under {self.root} ({exc})") from exc
        if segment is not None:
            digest, data = record[:VALUE_DIGEST], record[VALUE_DIGEST:]
            if len(record) != int(segment["length"]) or \
                    hashlib.blake2b(data, digest_size=VALUE_DIGEST).digest() != digest:
                raise PayloadError(ref, "its bytes do not match their digest (the segment is "
                                        "corrupt, altered or shorter than the reference)")
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
        """The fact with its outputs loaded back (``payload_ref`` kept). A value whose
        segment was freed (deleted once its source was delivered) reads as its outline:
        :func:`is_freed` says so (docs/topics/PAYLOADS.md, "Freeing values")."""
        if fact.payload_ref is None or fact.outputs is not None:
            return fact
        try:
            return replace(fact, outputs=self.load(fact.payload_ref))
        except PayloadMissingError:
            outline = getattr(fact, "outline", None)
            if outline is None:
                raise
            return replace(fact, outputs=outline)

    def delete(self, ref: str) -> None:
        """Remove the object holding ``ref`` (a whole segment); missing ones are fine."""
        try:
            self.storage.delete(self._key(object_of(ref)))
        except StorageError as exc:
            raise PayloadError(ref, f"cannot delete it ({exc})") from exc

    def ref_times(self, run_id: str) -> dict[str, float | None]:
        """Every payload object stored for a run (segments, older runs' files), with its
        modification time."""
        folder = self._run_dir(run_id)
        try:
            return {info.key: info.mtime for page in self.storage.walk(folder) for info in page
                    if is_payload_object(info.key)}
        except StorageError as exc:
            raise PayloadError(folder, f"cannot list it under {self.root} ({exc})") from exc

    def refs(self, run_id: str) -> set[str]:
        """Every payload object stored for a run."""
        return set(self.ref_times(run_id))

    def run_dirs(self) -> dict[str, bool]:
        """The run folders under the root: name -> whether it holds a payload file."""
        found: dict[str, bool] = {}
        try:
            for page in self.storage.walk(""):
                for info in page:
                    folder, sep, rest = info.key.partition("/")
                    if sep and valid_run_id(folder):
                        found[folder] = found.get(folder, False) or is_payload_object(rest)
        except StorageError as exc:
            raise PayloadError(self.root, f"cannot list it ({exc})") from exc
        return found

    def delete_run(self, run_id: str, keep: set[str] | frozenset[str] = frozenset()) -> None:
        """Remove the run's payload objects but those holding ``keep`` (references later
        runs reuse), then its folders once empty (and its owner mark, unless one remains)."""
        held = self.refs(run_id)
        kept = {object_of(ref) for ref in keep}
        for key in held - kept:
            self.delete(key)
        if kept & held:
            return
        base = self._run_dir(run_id)
        self._claimed.discard(base)
        try:
            self.storage.delete(f"{base}/{OWNER_FILE}")
            self.storage.remove_empty_dirs(base)
        except StorageError as exc:
            raise PayloadError(base, f"cannot delete it ({exc})") from exc


class PayloadRoots:
    """The payload stores a client reaches: its own, and the roots runs recorded.

    A run records the root of its first opener (``RunInfo.payloads``), so its driver, its
    actors and any later reader (audit, reuse, the web view) read and write one place,
    whatever their home directory, ``$RAYORCH_PAYLOAD_DIR`` or store URL says."""

    def __init__(self, own: PayloadStore) -> None:
        self.own = own
        self._others: dict[str, PayloadStore] = {}

    def of(self, root: str) -> PayloadStore:
        """The store of a recorded ``root`` ("" for a run recorded before roots were: the
        client's own)."""
        if not root or root == self.own.root:
            return self.own
        found = self._others.get(root)
        if found is None:
            found = self._others[root] = PayloadStore(root, self.own.threshold,
                                                      owner=self.own.owner)
        return found

    def written(self) -> int:
        """Bytes written to payload segments through every root."""
        return self.own.written + sum(p.written for p in self._others.values())


def is_freed(fact: object) -> bool:
    """A resolved fact whose outputs are its outline: its payload was freed."""
    outline = getattr(fact, "outline", None)
    return outline is not None and getattr(fact, "outputs", None) is outline


def deletable_refs(
    refs: Mapping[int, str],
    verdicts: Sequence[CommitVerdict],
    reports: Sequence[GrainCommitted],
    sealed_generations: Callable[[list[int]], list[int | None]],
) -> set[str]:
    """The payload objects of one commit call that no committed fact can name.

    ``refs`` maps a report's position to its reference. A value is named by its segment
    (the content of the call's reports): STALE, NOT_DISPATCHED and BARRED leave the Grain
    unsealed at that generation, so no committed fact names it; SEALED may be this very
    report committed by an earlier call whose reply was lost, so it is dead only if the
    Grain was sealed at another generation (``sealed_generations`` reads that, for the
    positions given). A segment goes only when every value in it is dead.
    """
    live = {object_of(ref) for position, ref in refs.items() if verdicts[position].accepted}
    doomed: set[str] = set()
    sealed: list[int] = []
    for position, ref in refs.items():
        if verdicts[position].accepted:
            continue
        if verdicts[position] is CommitVerdict.SEALED:
            sealed.append(position)
        else:
            doomed.add(object_of(ref))
    if sealed:
        for position, generation in zip(sealed, sealed_generations(sealed)):
            if generation is not None and generation != reports[position].generation:
                doomed.add(object_of(refs[position]))
            else:
                live.add(object_of(refs[position]))
    return doomed - live
