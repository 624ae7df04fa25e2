"""Lineage facts: the append-only events every run is made of, and their codec.

Facts are frozen dataclasses named in the past tense. A run's state is the fold
of its facts (see :mod:`rayorch.core.state`). Only *primary* facts are needed to
rebuild state (``OutputEmitted`` among them: a delivery the sink reported, folded to
release the source's output); *announcements* (``ExpansionClosed``, ``RunCompleted``)
are derived by the kernel, written for readers and auditors, and only checked when
folded.

The codec is msgpack with an explicit version field (never pickle), so a run
can be read back without importing user code. Tuples and numpy arrays survive a
round trip through msgpack extension types.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import msgpack

from rayorch.core.errors import RayorchError
from rayorch.core.ids import CallId, DomainId, Path
from rayorch.core.vocabulary import REPORT_GROUP_FAILURE as REPORT_GROUP_FAILURE
from rayorch.core.vocabulary import REPORT_PRESENT as REPORT_PRESENT
from rayorch.core.vocabulary import REPORT_RECORD_FAILURE as REPORT_RECORD_FAILURE
from rayorch.core.vocabulary import Outcome

CODEC_VERSION = 1


@dataclass(frozen=True, slots=True)
class Fact:
    """Base of all facts. ``ts`` is the writer's wall-clock time (the kernel ignores it)."""

    tag: ClassVar[str] = ""
    ts: float = field(default=0.0, compare=False, kw_only=True)


@dataclass(frozen=True, slots=True)
class SourceAdmitted(Fact):
    """Root Entity ``(index,)`` exists; ``values`` holds one value per forward argument.

    ``identity``: what the input listing said of the file or object the values name (size
    with version, ETag or mtime: ``ObjectInfo.identity``), the source's part of its reuse
    keys; None when they name no file.
    """

    tag: ClassVar[str] = "source_admitted"
    index: int
    values: tuple[Any, ...]
    key: str | None = None
    identity: str | None = None


@dataclass(frozen=True, slots=True)
class GrainDispatched(Fact):
    """Grain ``(call, path)`` was sent to an actor as attempt ``generation``."""

    tag: ClassVar[str] = "grain_dispatched"
    call: CallId
    path: Path
    generation: int
    reuse_key: str = ""  # core.fingerprint.reuse_key of the Call and its inputs ("": none)


@dataclass(frozen=True, slots=True)
class GrainCommitted(Fact):
    """An attempt's report passed the commit gate; the Grain is sealed.

    ``outcome`` is one of ``present``, ``record_failure``, ``group_failure``.
    ``outputs`` holds one value per Call output (inline), or ``payload_ref`` points
    to the durable copy written before the commit; ``outline`` (:func:`outline_of`) then
    keeps the outputs' structure, what a fold reads once the payload is freed.
    """

    tag: ClassVar[str] = "grain_committed"
    call: CallId
    path: Path
    generation: int
    outcome: str
    outputs: tuple[Any, ...] | None = None
    cause: str | None = None
    payload_ref: str | None = None
    outline: tuple[Any, ...] | None = None


@dataclass(frozen=True, slots=True)
class GrainReused(Fact):
    """The Grain took the outputs of a Grain sealed in an earlier run; it is sealed.

    The driver writes it instead of dispatching when the Grain's ``reuse_key`` (Call
    fingerprint and input digest, :mod:`rayorch.core.fingerprint`) equals that of
    ``origin_call`` at ``origin_path`` in run ``origin_run``: the fact that sealed that
    Grain there (a ``GrainCommitted``, or a ``GrainReused`` of its own). ``outputs`` are
    inline, or ``payload_ref`` names the earlier run's payload file (referenced, not
    copied). The kernel folds it as an accepted commit of a ready, never-dispatched Grain.
    """

    tag: ClassVar[str] = "grain_reused"
    call: CallId
    path: Path
    generation: int
    reuse_key: str
    origin_run: str
    origin_call: CallId
    origin_path: Path
    outputs: tuple[Any, ...] | None = None
    payload_ref: str | None = None


@dataclass(frozen=True, slots=True)
class BarrierInstalled(Fact):
    """A GroupFailure of a Call under ``parent``: uncommitted siblings are suppressed."""

    tag: ClassVar[str] = "barrier_installed"
    call: CallId
    parent: Path
    cause: str = ""


@dataclass(frozen=True, slots=True)
class GrainRetried(Fact):
    """A physical failure sent the Grain back to ready as attempt ``generation``.

    ``limit`` is the largest batch the retry may share, ``charged`` whether the failure
    counts against ``max_attempts`` and ``alone`` whether the retry needs an actor with
    nothing else on it (a crash retry: core/crash_split.py). The defaults are what every
    retry meant before crash splitting (one Grain per batch, charged, any actor).
    """

    tag: ClassVar[str] = "grain_retried"
    call: CallId
    path: Path
    generation: int
    cause: str
    limit: int = 1
    charged: bool = True
    alone: bool = False


@dataclass(frozen=True, slots=True)
class GrainFailed(Fact):
    """The Grain exhausted ``max_attempts`` physical attempts; its outputs are Failed."""

    tag: ClassVar[str] = "grain_failed"
    call: CallId
    path: Path
    generation: int
    cause: str


@dataclass(frozen=True, slots=True)
class ExpansionClosed(Fact):
    """Announcement: the Expansion ``(domain, parent)`` is terminal.

    ``outcome`` is ``succeeded`` (with ``count`` children, ordinals 0..count-1),
    ``dropped`` or ``failed``.
    """

    tag: ClassVar[str] = "expansion_closed"
    domain: DomainId
    parent: Path
    outcome: str
    count: int = 0


@dataclass(frozen=True, slots=True)
class OutputEmitted(Fact):
    """Source item ``index`` was *delivered*: its consumer has it (docs/ARCHITECTURE.md, Delivery).

    ``sink`` says who received it: ``"caller"`` (the ``Pipeline.run`` iterator, written
    when the caller asked for the next item or closed the iterator), or a file sink's
    ``"<format>:<part file name>"`` (written after the atomic write of that file).
    ``digest`` is the hex SHA-256 of the record as the sink wrote it (empty for the
    caller), so an audit can tell a missing or altered file from a delivered one.
    Facts from older writers decode with ``sink=""`` (unknown).
    """

    tag: ClassVar[str] = "output_emitted"
    index: int
    outcome: str = Outcome.PRESENT.value
    sink: str = ""
    digest: str = ""


@dataclass(frozen=True, slots=True)
class LeaseAcquired(Fact):
    """Driver ``driver`` holds the lease of ``shard`` with fencing token ``epoch``."""

    tag: ClassVar[str] = "lease_acquired"
    shard: int
    driver: str
    epoch: int


@dataclass(frozen=True, slots=True)
class RunCompleted(Fact):
    """Announcement: every admitted source item of the shard is terminal."""

    tag: ClassVar[str] = "run_completed"
    sources: int = 0


FACT_TYPES: dict[str, type[Fact]] = {
    cls.tag: cls
    for cls in (
        SourceAdmitted,
        GrainDispatched,
        GrainCommitted,
        GrainReused,
        BarrierInstalled,
        GrainRetried,
        GrainFailed,
        ExpansionClosed,
        OutputEmitted,
        LeaseAcquired,
        RunCompleted,
    )
}

FACT_FIELDS: dict[str, tuple[str, ...]] = {
    tag: tuple(f.name for f in fields(cls) if f.name != "ts") for tag, cls in FACT_TYPES.items()
}
PATH_FIELDS = frozenset({"path", "parent", "origin_path"})


class CodecError(RayorchError):
    """Bytes could not be decoded as a rayorch fact or payload."""


# -- values: msgpack with tuples and numpy arrays ---------------------------------
_EXT_TUPLE = 1
_EXT_NDARRAY = 2
_EXT_FREED = 3
_new_tuple = tuple.__new__
OUTLINE_LEAF = 16
"""Bytes of msgpack up to which a value stays in an outline (a page number, a mask)."""


@dataclass(frozen=True, slots=True)
class FreedValue:
    """A value whose payload was freed once nothing needed it: in an outline, and what a
    reader of a freed payload gets in its place (docs/topics/PAYLOADS.md, "Freeing values")."""

    def __repr__(self) -> str:
        return "<freed>"


FREED = FreedValue()


def outline_of(outputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The structure of a Grain's outputs that folding the lineage rests on: each output
    as it is when small, a list or tuple as one of its items' outlines (an expand needs
    its length, a filter its masks), anything else :data:`FREED`."""

    def leaf(value: Any) -> Any:
        # Larger than a leaf without packing it (a page image is not copied to say so).
        if isinstance(value, str | bytes | list | tuple | dict) and len(value) > OUTLINE_LEAF:
            return FREED
        nbytes = getattr(value, "nbytes", None)
        if isinstance(nbytes, int) and nbytes > OUTLINE_LEAF:
            return FREED
        try:
            small = len(pack_value(value)) <= OUTLINE_LEAF
        except (TypeError, ValueError, OverflowError):
            small = False
        return value if small else FREED

    def one(value: Any) -> Any:
        if isinstance(value, list):
            return [leaf(v) for v in value]
        if isinstance(value, tuple):  # a named tuple too: stored as a plain tuple
            return tuple(leaf(v) for v in value)
        return leaf(value)

    return tuple(one(v) for v in outputs)


def holds_freed(outputs: tuple[Any, ...]) -> bool:
    """Whether outputs read back hold a freed value (:func:`outline_of`): they are an
    outline, not the values a Grain computed."""
    for value in outputs:
        if isinstance(value, FreedValue):
            return True
        if isinstance(value, list | tuple) and any(isinstance(v, FreedValue) for v in value):
            return True
    return False


def _ext(code: int, data: bytes) -> msgpack.ExtType:
    # ExtType's own __new__ re-checks the types in Python; code and data are right here.
    return _new_tuple(msgpack.ExtType, (code, data))


def _default(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return _ext(_EXT_TUPLE, pack_value(list(obj)))
    if isinstance(obj, FreedValue):
        return _ext(_EXT_FREED, b"")
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        np = None  # type: ignore[assignment]
    if np is not None and isinstance(obj, np.ndarray):
        if obj.dtype.hasobject or obj.dtype.fields is not None:
            # Object arrays would be stored as raw memory addresses, structured arrays
            # without their field names: neither reads back as the same value.
            kind = "object" if obj.dtype.hasobject else "structured"
            raise TypeError(f"cannot store a numpy {kind} array (dtype {obj.dtype}) durably: "
                            "convert it to a list or to a plain numeric dtype")
        arr = np.ascontiguousarray(obj)
        header = [arr.dtype.str, list(arr.shape)]
        return _ext(_EXT_NDARRAY, pack_value([header, arr.tobytes()]))
    if np is not None and isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(
        f"cannot store a {type(obj).__name__} durably: use bytes, str, numbers, "
        "lists, tuples, dicts or numpy arrays"
    )


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_TUPLE:
        return tuple(unpack_value(data))
    if code == _EXT_FREED:
        return FREED
    if code == _EXT_NDARRAY:
        import numpy as np

        (dtype, shape), raw = unpack_value(data)
        return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()
    return msgpack.ExtType(code, data)


# Idle packers, reused: building a Packer per value costs more than packing a small
# fact. list.pop/append are atomic, so each thread (and each nested pack_value, for
# a tuple inside a value) takes a packer of its own.
_idle_packers: list[msgpack.Packer] = []


def pack_value(value: Any) -> bytes:
    """Encode a user value as msgpack (tuples and numpy arrays preserved)."""
    try:
        packer = _idle_packers.pop()
    except IndexError:
        packer = msgpack.Packer(default=_default, strict_types=True, use_bin_type=True)
    try:
        return packer.pack(value)  # type: ignore[no-any-return]
    finally:  # the packer resets its buffer itself when packing fails
        _idle_packers.append(packer)


def storable_problem(value: Any) -> str | None:
    """Why ``value`` cannot be stored and read back faithfully, or None when it can."""
    try:
        pack_value(value)
    except (TypeError, ValueError, OverflowError) as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def unpack_value(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


def barrier_fact(report: GrainCommitted) -> BarrierInstalled:
    """The barrier a GroupFailure commit of a child Grain installs."""
    return BarrierInstalled(
        report.call, report.path[:-1], report.cause or "group failure", ts=report.ts
    )
