"""Fingerprints for reuse: what a Call is, and what a Grain's inputs are.

No clock, no store; a Call's code digest reads its module's source (``inspect``).

A Grain of a new run may take the outputs of a Grain committed in an earlier run when
both have the same **reuse key**: ``blake2b(call fingerprint, input digest)``
(docs/topics/REUSE.md, "Reuse"). What enters each, and nothing else:

Call fingerprint (:func:`call_fingerprint`)
  * ``FINGERPRINT_VERSION`` (bumped when these rules change: nothing is reused across it);
  * the module target's qualified name (``module.Class`` or ``module.function``);
  * a digest of its code: the source text of the class and of each base class outside
    ``builtins`` (``inspect.getsource``), or of the function. Where the source is not
    available (a class defined in a REPL, a compiled module), the bytecode of every
    function the class defines (``marshal`` of its code objects, with the Python version:
    reuse then holds only between runs of the same Python). Code the target *calls* (a
    helper in another module, a library) is not covered: use ``--no-reuse CALL`` (or
    ``no_reuse=``) after changing it;
  * the constructor arguments (``RayModule(X, *args, **kwargs)`` / ``.pre_init``) and the
    Call site's static keyword arguments, in a canonical encoding (:func:`canonical`);
  * the execution options that change what the UDF returns: ``RESULT_OPTIONS``
    (``batched``, ``num_outputs``, ``output_layout``) and the Call's keyword inputs.
    Batch size, policy, replicas, resources, attempts, timeouts and the recovery policy
    do not enter: schedule invariance says they do not change a result.

Input digest (:func:`input_digest`)
  * the canonical encoding of the Grain's input Items, in the Call's argument order
    (Dropped, Failed and Suppressed inputs by their outcome and cause);
  * for a Call that takes a source of the job (a forward argument), the source's identity
    as its listing gave it (``SourceAdmitted.identity``: size with version, ETag or
    generation on an object store, size and mtime locally): a changed file under the same
    name runs again, and a renamed one too (its name is an input as well). No byte of an
    input is read for it.

The canonical encoding takes ``None``, bools, ints, floats, str, bytes, lists, tuples,
dicts and sets (keys and members sorted by their encoding), enums, frozen dataclasses (by
qualified name and fields), ``pathlib`` paths, numpy arrays, and classes or functions (by
name and code digest). Anything else (a mutable object, an open handle, a lock) is state
that cannot be hashed: the Call gets no fingerprint and is never reused, and
:attr:`CallFingerprint.reason` says why in one line.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import inspect
import marshal
import struct
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from rayorch.core.ast_lock import AST_LOCK
from rayorch.core.facts import pack_value
from rayorch.core.ids import CallId
from rayorch.core.plan import ModuleSpec, Plan
from rayorch.core.propagation import Absent

FINGERPRINT_VERSION = 1
RESULT_OPTIONS = ("batched", "num_outputs", "output_layout")
"""The :class:`~rayorch.core.plan.ModuleOptions` that change what a UDF returns."""


class Unhashable(Exception):
    """A value (or a target's code) has no canonical encoding; the message says why."""


def _digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    update = h.update
    for part in parts:
        update(len(part).to_bytes(8, "little"))
        update(part)
    return h.hexdigest()


# == canonical encoding ====================================================================
_PLAIN = frozenset({int, str, float, bytes, bool, type(None)})


def canonical(value: Any) -> Any:
    """A msgpack-able structure equal for equal values, whatever dict or set order."""
    kind = type(value)
    if kind in _PLAIN:  # the common case first: one set lookup (a Grain's key per dispatch)
        return value
    if kind is list or kind is tuple:
        return ["list" if kind is list else "tuple", [canonical(v) for v in value]]
    if isinstance(value, bool | int | float | str | bytes):
        return value  # subclasses of the plain types (an IntEnum too)
    if isinstance(value, enum.Enum):
        return ["enum", _qualname(type(value)), canonical(value.value)]
    if isinstance(value, list | tuple):
        return ["list" if isinstance(value, list) else "tuple", [canonical(v) for v in value]]
    if isinstance(value, dict):
        items = [(pack_value(canonical(k)), canonical(v)) for k, v in value.items()]
        return ["dict", sorted(items, key=lambda kv: kv[0])]
    if isinstance(value, set | frozenset):
        return ["set", sorted(pack_value(canonical(v)) for v in value)]
    if isinstance(value, PurePath):
        return ["path", str(value)]
    if type(value) is Absent:
        return ["absent", value.outcome.value, value.cause]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        params = getattr(type(value), "__dataclass_params__", None)
        if params is None or not params.frozen:
            raise Unhashable(f"a {type(value).__name__} is a mutable object (state)")
        return ["dataclass", _qualname(type(value)),
                [[f.name, canonical(getattr(value, f.name))] for f in dataclasses.fields(value)]]
    if inspect.isclass(value) or inspect.isfunction(value):
        return ["code", _qualname(value), code_digest(value)]
    if type(value).__module__ == "numpy":
        try:
            return ["numpy", pack_value(value)]
        except TypeError as exc:
            raise Unhashable(str(exc)) from exc
    raise Unhashable(f"a {type(value).__name__} has no canonical encoding (state that "
                     "cannot be hashed)")


def canonical_bytes(value: Any) -> bytes:
    return pack_value(canonical(value))


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


# == code ===================================================================================
def code_digest(target: Any) -> str:
    """A digest of the code of a class (and its bases outside builtins) or a function."""
    owners = [c for c in target.__mro__ if c.__module__ != "builtins"] \
        if inspect.isclass(target) else [target]
    return _digest(*(_code_of(owner) for owner in owners))


@functools.lru_cache(maxsize=4096)
def _code_of(owner: Any) -> bytes:
    """The source of ``owner`` (its code objects when there is none), once per object.

    ``inspect.getsource`` of a class parses its module with ``ast``, which CPython 3.11
    cannot do in two threads at once (``SystemError: AST constructor recursion depth
    mismatch``; runs started from several threads hit it): one at a time.
    """
    with AST_LOCK:
        try:
            return inspect.getsource(owner).encode()
        except (OSError, TypeError):
            return _bytecode(owner)


def _bytecode(owner: Any) -> bytes:
    """The code objects of a function, or of every function a class defines."""
    functions = [owner] if inspect.isfunction(owner) else [
        v for _, v in sorted(vars(owner).items()) if inspect.isfunction(v)]
    codes = [f.__code__ for f in functions if hasattr(f, "__code__")]
    if not codes:
        raise Unhashable(f"the code of {_qualname(owner)} is not available (no source, no "
                         "Python functions)")
    version = f"{sys.implementation.name}-{sys.version_info[:2]}".encode()
    return version + b"".join(marshal.dumps(code) for code in codes)


# == Call fingerprints ======================================================================
@dataclass(frozen=True, slots=True)
class CallFingerprint:
    """A Call's fingerprint (``key``), or why it has none (``reason``: never reused)."""

    call: CallId
    key: str | None
    reason: str | None = None


def call_fingerprint(module: ModuleSpec, call_id: CallId, static_kwargs: Iterable[Any] = (),
                     keywords: Iterable[str] = ()) -> CallFingerprint:
    """The fingerprint of ``call_id``, a Call of ``module`` (see the module docstring)."""
    target = module.target
    if target is None:
        return CallFingerprint(call_id, None, "the plan has no code for its module (it was "
                                              "rebuilt from a description)")
    try:
        options = module.options
        blob = canonical_bytes([
            FINGERPRINT_VERSION, _qualname(target), code_digest(target),
            list(module.args), dict(module.kwargs), list(static_kwargs), list(keywords),
            [getattr(options, name) for name in RESULT_OPTIONS],
        ])
    except Unhashable as exc:
        return CallFingerprint(call_id, None, f"constructor arguments or code: {exc}")
    return CallFingerprint(call_id, _digest(blob))


def plan_fingerprints(plan: Plan) -> dict[CallId, CallFingerprint]:
    """Every Call's fingerprint, in plan order."""
    out: dict[CallId, CallFingerprint] = {}
    for node in plan.calls:
        spec = node.call
        assert spec is not None
        out[spec.id] = call_fingerprint(plan.module(spec.module), spec.id,
                                        spec.static_kwargs, spec.keywords)
    return out


# == inputs =================================================================================
_LENGTH = struct.Struct("<Q").pack  # _digest's length prefix


def _pair_digest(first: bytes, second: bytes) -> str:
    """``_digest(first, second)`` in one call (small parts: a reuse key per dispatch)."""
    return hashlib.blake2b(_LENGTH(len(first)) + first + _LENGTH(len(second)) + second,
                           digest_size=16).hexdigest()


def input_digest(values: Iterable[Any], sources: Iterable[str | None] = ()) -> str | None:
    """The digest of a Grain's input values (None: a value has no canonical encoding).

    ``sources``: the identities of the files the source inputs name (``SourceAdmitted``).
    """
    listed = list(values)
    try:
        if _PLAIN.issuperset(map(type, listed)):  # what canonical() makes of plain values
            blob = pack_value(["list", listed])
        else:
            blob = canonical_bytes(listed)
    except (Unhashable, TypeError, ValueError):
        return None
    files = list(sources)
    return _pair_digest(blob, canonical_bytes(files) if files else _NO_FILES)


_NO_FILES = canonical_bytes([])


def reuse_key(fingerprint: str, digest: str) -> str:
    """The key a Grain is reused by: its Call's fingerprint with its input digest."""
    return _pair_digest(fingerprint.encode(), digest.encode())


def grain_reuse_key(fingerprint: str, values: Sequence[Any],
                    sources: Sequence[str | None] = ()) -> str | None:
    """``reuse_key(fingerprint, input_digest(values, sources))``, None when the inputs have
    no canonical encoding: every dispatch computes one (bench/RESULTS.md)."""
    digest = input_digest(values, sources)
    return None if digest is None else reuse_key(fingerprint, digest)


__all__ = ["FINGERPRINT_VERSION", "RESULT_OPTIONS", "CallFingerprint",
           "Unhashable", "call_fingerprint", "canonical", "canonical_bytes", "code_digest",
           "grain_reuse_key", "input_digest", "plan_fingerprints", "reuse_key"]
