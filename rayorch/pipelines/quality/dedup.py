"""Dedup stages: exact (a hash of the input bytes or of the normalised text) and near
(MinHash of word shingles, LSH bands), deciding through the store's content claims.

Each stage is a batched UDF, ``(docs[, ids]) -> [(keep, verdict)]``, that ``F.filter``
drops by. A document claims its content keys in the scope's dedup index
(:class:`~rayorch.store.claims.ContentClaims`); it is kept when it holds them, and a
duplicate of their holder otherwise: the first claim recorded wins, and a retried,
resumed or re-driven document finds its own claim (its id is its source, not an
attempt). ``against`` names earlier scopes (``--dedup-against``) a document must not be in.

The index lives in the lineage store when the store is shared (``redis://``: every actor
and driver of the run, and later runs, see one index). With a ``memory://`` store the
claims live in this process (:data:`LOCAL_CLAIMS`): the stage runs as one actor, and the
index lasts as long as it does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from rayorch.pipelines.quality.text import document_text, normalise, shingles, words
from rayorch.pipelines.quality.verdict import dropped, kept
from rayorch.store.claims import MAX_FIELD, ContentClaims, MemoryClaims

LOCAL_CLAIMS = MemoryClaims()
"""The claims of stages bound to a ``memory://`` store: this process's (one actor's)."""
DEFAULT_THRESHOLD = 0.8
DEFAULT_NUM_PERM = 128
DEFAULT_SHINGLE = 5


def open_claims(url: str) -> ContentClaims:
    """The dedup index of the store at ``url``: the store itself when it is shared
    (``redis://``), else this process's :data:`LOCAL_CLAIMS`."""
    from rayorch.store.registry import is_shared_store, open_store

    if is_shared_store(url):
        return open_store(url)
    return LOCAL_CLAIMS


def document_id(doc: Any) -> str:
    """A document's claimant id: a source path itself, or a document dict's ``path``."""
    value = doc.get("path", doc.get("id")) if isinstance(doc, dict) else doc
    if value is None:
        raise TypeError("a dedup stage needs document ids: pass them as its second input")
    text = str(value)
    if len(text) > MAX_FIELD:
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return text


class ClaimingStage:
    """What the dedup stages share: the index, the claim, the verdict."""

    stage = "dedup"
    reason = "duplicate"

    def __init__(self, *, claims: str = "memory://", scope: str, against: Sequence[str] = ()
                 ) -> None:
        self.claims_url = claims
        self.scope = scope
        self.against = tuple(against)
        self._claims: ContentClaims | None = None

    @property
    def index(self) -> ContentClaims:
        if self._claims is None:
            self._claims = open_claims(self.claims_url)
        return self._claims

    def keys(self, doc: Any) -> tuple[list[str], dict[str, Any]]:
        """The document's content keys and the details its verdict records."""
        raise NotImplementedError

    def __call__(self, docs: list[Any], ids: list[Any] | None = None
                 ) -> list[tuple[bool, dict[str, Any]]]:
        claimants = [str(i) for i in ids] if ids is not None else [document_id(d) for d in docs]
        return [self.decide(doc, claimant) for doc, claimant in zip(docs, claimants,
                                                                    strict=True)]

    def decide(self, doc: Any, claimant: str) -> tuple[bool, dict[str, Any]]:
        """Keep ``doc`` when it holds its keys (first claim wins), else drop it naming the
        holder (the smallest, when several hold its keys: the same on every retry)."""
        keys, details = self.keys(doc)
        details["scope"] = self.scope
        if not keys:
            return kept(self.stage, note="no content to compare", **details)
        for earlier in self.against:
            held = sorted({h for h in self.index.holders(earlier, keys) if h is not None})
            if held:
                return dropped(self.stage, "delivered_before", kept=held[0],
                               **{**details, "scope": earlier})
        answer = self.index.claim(self.scope, keys, claimant)
        others = sorted({h for h in answer if h is not None and h != claimant})
        if others:
            return dropped(self.stage, self.reason_for(answer, claimant), kept=others[0],
                           **details)
        return kept(self.stage, **details)

    def reason_for(self, answer: tuple[str | None, ...], claimant: str) -> str:
        """Why a document whose claim ``answer`` names other holders is dropped."""
        return self.reason


def text_key(text: str) -> str | None:
    """The exact-dedup key of a text: the hash of its normalised words (None: none)."""
    data = normalise(text).encode("utf-8")
    return f"text:sha256:{hashlib.sha256(data).hexdigest()[:32]}" if data else None


class ExactDedup(ClaimingStage):
    """Exact dedup: the SHA-256 of the input's bytes (``of="bytes"``: documents are paths
    or URLs, read where the actor runs) or of the normalised text (``of="text"``)."""

    def __init__(self, of: str = "text", **options: Any) -> None:
        if of not in ("text", "bytes"):
            raise ValueError(f"ExactDedup of 'text' or 'bytes', not {of!r}")
        super().__init__(**options)
        self.of = of
        self.stage = f"dedup_{of}"

    def keys(self, doc: Any) -> tuple[list[str], dict[str, Any]]:
        if self.of == "bytes":
            from rayorch.pipelines.input_files import check_file

            source = check_file(doc, "input", 1, whole=True)
            if source.path is not None:  # a local file is hashed as it is read, not held
                with source.path.open("rb") as fh:
                    digest = hashlib.file_digest(fh, "sha256").hexdigest()
            else:
                digest = hashlib.sha256(source.read()).hexdigest()
            key = f"bytes:sha256:{digest[:32]}"
        else:
            found = text_key(document_text(doc))
            if found is None:
                return [], {}
            key = found
        return [key], {"key": key}


@lru_cache(maxsize=64)
def lsh_bands(threshold: float, num_perm: int, recall: float = 0.9) -> tuple[int, int]:
    """``(bands, rows)`` with ``bands * rows <= num_perm`` whose S-curve ``1 - (1 -
    s**rows)**bands`` finds a pair of Jaccard ``threshold`` with probability ``recall`` or
    more, with the fewest false positives below it (their area under the curve)."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"a near-dedup threshold is between 0 and 1, not {threshold}")
    grid = np.linspace(0.0, threshold, 1001)
    best: tuple[float, int, int] | None = None
    for rows in range(1, num_perm + 1):
        bands = num_perm // rows
        if 1 - (1 - threshold ** rows) ** bands < recall:
            continue
        false_positives = float(np.trapezoid(1.0 - (1.0 - grid ** rows) ** bands, grid))
        if best is None or false_positives < best[0]:
            best = (false_positives, bands, rows)
    return (num_perm, 1) if best is None else (best[1], best[2])


class NearDedup(ClaimingStage):
    """Near dedup: a MinHash (rensa) of the text's ``shingle``-word shingles, cut into LSH
    bands; a document sharing a band with a kept one is its near-duplicate (estimated
    Jaccard at or above ``threshold``, by the bands' S-curve). It claims the exact text
    key too (first): an exact copy is a ``duplicate``, with that ``key`` in its verdict."""

    stage = "dedup_near"
    reason = "near_duplicate"

    def __init__(self, *, threshold: float = DEFAULT_THRESHOLD,
                 num_perm: int = DEFAULT_NUM_PERM, shingle: int = DEFAULT_SHINGLE,
                 seed: int = 1, **options: Any) -> None:
        super().__init__(**options)
        if shingle < 1 or num_perm < 2:
            raise ValueError("near dedup needs shingle >= 1 and num_perm >= 2")
        self.threshold, self.num_perm, self.shingle, self.seed = (threshold, num_perm,
                                                                  shingle, seed)
        self.bands, self.rows = lsh_bands(threshold, num_perm)

    def signature(self, text: str) -> list[int] | None:
        """The MinHash of the text's shingles (None: no words)."""
        import rensa

        grams = shingles(words(text), self.shingle)
        if not grams:
            return None
        minhash = rensa.RMinHash(num_perm=self.num_perm, seed=self.seed)
        minhash.update(grams)
        return [int(v) for v in minhash.digest()]

    def band_keys(self, signature: list[int]) -> list[str]:
        values = np.asarray(signature, dtype=np.uint32)
        prefix = f"near{self.num_perm}.{self.rows}.{self.shingle}.{self.seed}"
        return [f"{prefix}:{b}:" + hashlib.blake2b(
                    values[b * self.rows:(b + 1) * self.rows].tobytes(),
                    digest_size=8).hexdigest()
                for b in range(self.bands)]

    def keys(self, doc: Any) -> tuple[list[str], dict[str, Any]]:
        text = document_text(doc)
        signature = self.signature(text)
        key = text_key(text)
        if signature is None or key is None:
            return [], {}
        return [key, *self.band_keys(signature)], {"key": key, "threshold": self.threshold}

    def reason_for(self, answer: tuple[str | None, ...], claimant: str) -> str:
        exact = answer[0] is not None and answer[0] != claimant
        return "duplicate" if exact else self.reason


__all__ = ["DEFAULT_NUM_PERM", "DEFAULT_SHINGLE", "DEFAULT_THRESHOLD", "LOCAL_CLAIMS",
           "ClaimingStage", "ExactDedup", "NearDedup", "document_id", "lsh_bands", "text_key",
           "open_claims"]
