"""Logical identifiers: Domains, Entities, Grains and Expansions.

Ids are deterministic and logical, never derived from batches, actors or timing.

* A Domain id is ``"root"`` or ``parent + "/" + k`` (the k-th expand of the plan).
* An Entity is identified by its Domain and its *path*: ``(source_index,)`` in the
  root Domain, ``parent_path + (ordinal,)`` in a child Domain. The Domain fixes the
  depth, so ``len(path) == depth(domain) + 1``.
* A Grain is ``(call_id, path)``: one Call on one Entity (the Call fixes the Domain).
* An Expansion is ``(child_domain, parent_path)``.
"""

from __future__ import annotations

from typing import TypeAlias

from rayorch.core.errors import InvalidPathError

DomainId: TypeAlias = str
CallId: TypeAlias = str
Path: TypeAlias = tuple[int, ...]
GrainKey: TypeAlias = tuple[CallId, Path]
ExpansionKey: TypeAlias = tuple[DomainId, Path]

ROOT: DomainId = "root"


def child_domain_id(parent: DomainId, k: int) -> DomainId:
    """The id of the ``k``-th child Domain of ``parent``."""
    return f"{parent}/{k}"


def domain_depth(domain: DomainId) -> int:
    """0 for the root Domain, 1 for its children, ..."""
    return domain.count("/")


def parent_path(path: Path) -> Path | None:
    """The path of the parent Entity, or None for a root Entity."""
    return path[:-1] if len(path) > 1 else None


def format_path(path: Path) -> str:
    """``(12, 3, 5)`` -> ``"12.3.5"``."""
    return ".".join(str(p) for p in path)


def parse_path(text: str) -> Path:
    """Inverse of :func:`format_path`; ``"12"`` -> ``(12,)``."""
    try:
        return tuple(int(p) for p in text.split("."))
    except ValueError:
        raise InvalidPathError(
            f"not an entity path: {text!r} (expected a source index like '12', or '12.3' "
            "for child 3 of source 12)"
        ) from None


def format_grain(grain: GrainKey) -> str:
    return f"{grain[0]}[{format_path(grain[1])}]"
