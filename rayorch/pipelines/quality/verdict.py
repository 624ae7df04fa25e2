"""A data-quality stage's verdict on one document: kept, or dropped with its reason.

Every stage returns two outputs per document, ``(keep, verdict)``: ``keep`` is the mask
that ``F.filter`` drops the document by, ``verdict`` a small dict that the stage's
``GrainCommitted`` fact records, so the lineage says why a document is not there::

    {"stage": "dedup_text", "keep": False, "reason": "duplicate", "kept": "a.pdf",
     "key": "text:sha256:..."}
    {"stage": "language", "keep": False, "reason": "language", "lang": "fr", "score": 0.99}
    {"stage": "quality", "keep": False, "reason": "word_count", "score": 12.0, "limit": 50}

``rayorch show``, ``status``, the web view and the job read them back from the facts
(:mod:`rayorch.inspect.drops`), never from a side channel.
"""

from __future__ import annotations

from typing import Any

STAGES = ("dedup_bytes", "language", "quality", "dedup_text", "dedup_near")
"""The stages in the order the PDF job runs them: byte copies before any work (as
FinePDFs), text dedup last (``dedup_text`` or ``dedup_near``, which claims the text's hash
and its MinHash bands at once), so that only documents kept by every other stage enter
the text index."""


def kept(stage: str, **details: Any) -> tuple[bool, dict[str, Any]]:
    """A document the stage keeps: ``(True, verdict)``."""
    return True, {"stage": stage, "keep": True, "reason": None, **details}


def dropped(stage: str, reason: str, **details: Any) -> tuple[bool, dict[str, Any]]:
    """A document the stage drops for ``reason``: ``(False, verdict)``."""
    return False, {"stage": stage, "keep": False, "reason": reason, **details}


__all__ = ["STAGES", "dropped", "kept"]
