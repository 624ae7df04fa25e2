"""Content claims: the shared state of dedup stages, recorded in the lineage store.

A dedup stage keeps one document of each duplicate group. Which one is decided by the
store: the first document to *claim* a content key (a hash of its bytes or text, an LSH
band of its MinHash) holds it for good, and every later claimant of a held key is a
duplicate of its holder. A claim names a document by a logical id (its source), never by
an attempt, so a retried, resumed or re-driven document finds its own claim and keeps the
verdict it had: the survivor of a group is the same after any retry, kill, ``--resume``
or replica driver.

A claim is all or none: a document claims every key of its set, or (when any key is held
by another document) none, and learns the holders. Only documents that are kept enter
the index, so a near-duplicate chain never drops a document for resembling a dropped one.

Keys live in a *scope* (a dedup index: one per job output or per pipeline object), not in
a run, so a later run can dedup against an earlier scope (``holders``) without a pass
over its outputs. Backends: memory (this module's :class:`MemoryClaims`, one process)
and Redis (:mod:`rayorch.store.redis_claims`, one Lua script, all keys in one hash slot).

>>> from rayorch.store import open_store
>>> store = open_store("memory://")
>>> store.claim("scope-1", ["sha:ab"], "a.pdf")
('a.pdf',)
>>> store.claim("scope-1", ["sha:ab", "sha:cd"], "b.pdf")      # held by a.pdf: nothing taken
('a.pdf', None)
>>> store.claim("scope-1", ["sha:ab"], "a.pdf")                  # a retry finds its own claim
('a.pdf',)
"""

from __future__ import annotations

import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence

from rayorch.core.errors import StoreError

MAX_CLAIM_KEYS = 1024
"""Keys one claim may name (a MinHash's bands are a few dozen)."""
MAX_FIELD = 512
"""The longest key or claimant (characters)."""
_SCOPE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class ClaimError(StoreError):
    """A claim that cannot be recorded as asked (a bad scope, key or claimant)."""


def check_claim(scope: str, keys: Sequence[str], claimant: str) -> None:
    """Raise :class:`ClaimError` unless the claim is well formed (checked before any write)."""
    check_scope(scope)
    if not keys or len(keys) > MAX_CLAIM_KEYS:
        raise ClaimError(f"a claim names 1 to {MAX_CLAIM_KEYS} keys, not {len(keys)}")
    for text, what in [(claimant, "claimant"), *((k, "key") for k in keys)]:
        if not isinstance(text, str) or not text or len(text) > MAX_FIELD:
            raise ClaimError(f"a claim's {what} is a string of 1 to {MAX_FIELD} characters")


def check_scope(scope: str) -> None:
    if not isinstance(scope, str) or not _SCOPE.match(scope):
        raise ClaimError(f"a claim scope is 1 to 128 letters, digits, '.', '_' or '-', not "
                         f"{scope!r:.80}")


class ContentClaims(ABC):
    """The dedup index of a scope: content key -> the document that claimed it first."""

    @abstractmethod
    def claim(self, scope: str, keys: Sequence[str], claimant: str) -> tuple[str | None, ...]:
        """Claim every key of ``keys`` for ``claimant``, or none of them.

        When no key is held by another claimant, all become ``claimant``'s (those it held
        already stay so) and the answer is ``claimant`` for each key. Otherwise nothing is
        written and the answer is each key's holder (None: free). Atomic per call.
        """

    @abstractmethod
    def holders(self, scope: str, keys: Sequence[str]) -> tuple[str | None, ...]:
        """Each key's holder in ``scope`` (None: free); writes nothing."""

    @abstractmethod
    def claims_of(self, scope: str) -> dict[str, str]:
        """Every claim of the scope, key -> holder (for the audit; small scopes)."""

    @abstractmethod
    def delete_claims(self, scope: str) -> None:
        """Forget the scope's claims (no-op when it has none)."""


def claim_answer(held: Sequence[str | None], claimant: str) -> tuple[bool, tuple[str | None, ...]]:
    """The all-or-none rule on the keys' current holders: ``(take them, answer)``."""
    if all(h is None or h == claimant for h in held):
        return True, tuple(claimant for _ in held)
    return False, tuple(held)


class MemoryClaims(ContentClaims):
    """Claims in this process's memory (the memory store's; one process shares them)."""

    def __init__(self) -> None:
        self._claims_lock = threading.Lock()
        self._claims: dict[str, dict[str, str]] = {}

    def claim(self, scope: str, keys: Sequence[str], claimant: str) -> tuple[str | None, ...]:
        check_claim(scope, keys, claimant)
        with self._claims_lock:
            table = self._claims.setdefault(scope, {})
            take, answer = claim_answer([table.get(k) for k in keys], claimant)
            if take:
                for key in keys:
                    table[key] = claimant
            return answer

    def holders(self, scope: str, keys: Sequence[str]) -> tuple[str | None, ...]:
        check_scope(scope)
        with self._claims_lock:
            table = self._claims.get(scope, {})
            return tuple(table.get(k) for k in keys)

    def claims_of(self, scope: str) -> dict[str, str]:
        check_scope(scope)
        with self._claims_lock:
            return dict(self._claims.get(scope, {}))

    def delete_claims(self, scope: str) -> None:
        with self._claims_lock:
            self._claims.pop(scope, None)


__all__ = ["MAX_CLAIM_KEYS", "ClaimError", "ContentClaims", "MemoryClaims", "check_claim",
           "check_scope", "claim_answer"]
