"""Facts as stored: ``[version, tag, ts, field...]`` as msgpack (never pickle), so any
reader decodes any run without importing user code. The fact types and their fields are
:mod:`rayorch.core.facts` (``FACT_TYPES``, ``FACT_FIELDS``); a record of an older writer with
fewer fields decodes with the later fields' defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from rayorch.core.facts import (
    CODEC_VERSION,
    FACT_FIELDS,
    FACT_TYPES,
    PATH_FIELDS,
    CodecError,
    Fact,
    pack_value,
    unpack_value,
)


def _field_getter(names: tuple[str, ...]) -> Callable[[Fact], tuple[Any, ...]]:
    """One call that returns a fact's field values as a tuple, in ``names`` order."""
    if len(names) == 1:  # attrgetter of one name returns the value itself
        one = attrgetter(names[0])
        return lambda fact: (one(fact),)
    return attrgetter(*names)


_GETTERS: dict[type[Fact], Callable[[Fact], tuple[Any, ...]]] = {
    cls: _field_getter(FACT_FIELDS[tag]) for tag, cls in FACT_TYPES.items()
}
# Positions of Entity paths in a fact's values (stored as tuples; lists from older writers).
_PATH_POSITIONS: dict[str, tuple[int, ...]] = {
    tag: tuple(i for i, name in enumerate(names) if name in PATH_FIELDS)
    for tag, names in FACT_FIELDS.items()
}


def encode_fact(fact: Fact) -> bytes:
    """``[version, tag, ts, field...]`` as msgpack."""
    return pack_value([CODEC_VERSION, fact.tag, fact.ts, *_GETTERS[type(fact)](fact)])


def decode_fact(data: bytes) -> Fact:
    """A fact of :func:`encode_fact`; :class:`CodecError` for anything else."""
    try:
        raw = unpack_value(data)
        version, tag, ts, *values = raw
    except Exception as exc:
        raise CodecError(f"not a rayorch fact ({exc})") from exc
    if version != CODEC_VERSION:
        raise CodecError(f"fact codec version {version} is not supported (this is {CODEC_VERSION})")
    cls = FACT_TYPES.get(tag)
    if cls is None:
        raise CodecError(f"unknown fact type {tag!r}")
    del values[len(FACT_FIELDS[tag]):]
    for i in _PATH_POSITIONS[tag]:
        if i < len(values) and type(values[i]) is not tuple:
            values[i] = tuple(values[i])
    return cls(*values, ts=ts)


def fact_as_dict(fact: Fact) -> dict[str, Any]:
    """A plain dict (for ``--json`` output)."""
    out: dict[str, Any] = {"type": fact.tag, "ts": fact.ts}
    for name in FACT_FIELDS[fact.tag]:
        out[name] = getattr(fact, name)
    return out


__all__ = ["decode_fact", "encode_fact", "fact_as_dict"]
