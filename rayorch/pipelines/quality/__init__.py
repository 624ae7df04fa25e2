"""Data-quality stages: exact and near dedup, language, heuristic quality filters.

Each stage is a batched UDF whose two outputs per document are ``(keep, verdict)``; the
document is dropped by ``F.filter`` where ``keep`` is False, and the verdict (stage,
reason, the kept copy or the score) stays in the stage's committed fact, so every drop
is on record (:mod:`rayorch.pipelines.quality.verdict`, :mod:`rayorch.inspect.drops`).
Compose them in any ``forward``::

    class Clean(ro.Pipeline):
        def __init__(self):
            super().__init__()
            add_stages(self, dedup="near", languages=("en", "de"), quality="default")

        def forward(self, docs):              # docs: text, or dicts with "markdown"/"text"
            return keep_documents(self, docs)  # ids: each dict's "path" (or pass ids=...)

or one by one: ``ro.RayModule(LanguageId, languages=["en"], num_outputs=2)`` then
``keep, why = self.lang(docs); docs = F.filter(docs, keep)``.
"""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Sequence
from typing import Any

import rayorch as ro
from rayorch import F
from rayorch.pipelines.quality.dedup import DEFAULT_THRESHOLD, ExactDedup, NearDedup
from rayorch.pipelines.quality.heuristics import QualityFilter
from rayorch.pipelines.quality.language import LanguageId
from rayorch.pipelines.quality.verdict import STAGES, dropped, kept

DEDUP_MODES = ("exact", "near")
QUALITY_MODES = ("default", "off")


class QualityOptionError(ro.RayorchError, ValueError):
    """A data-quality option that cannot run as given; the message says what to do."""


def new_scope() -> str:
    """A fresh dedup scope (an index of its own)."""
    return f"dedup-{uuid.uuid4().hex[:16]}"


def stage_modules(*, dedup: str | None = None, languages: Sequence[str] = (),
                  quality: str = "off", claims: str = "memory://",
                  dedup_scope: str | None = None, near_threshold: float = DEFAULT_THRESHOLD,
                  dedup_against: Sequence[str] = (), of_files: bool = False
                  ) -> dict[str, Any]:
    """The stage modules the options ask for, by attribute name, in the order they run
    (:data:`~rayorch.pipelines.quality.verdict.STAGES`): ``dedup_bytes`` takes the
    sources (files: only with ``of_files``), the others the documents.

    ``dedup``: ``"exact"`` (input bytes and normalised text) or ``"near"`` (input bytes,
    then the normalised text and MinHash near-duplicates at ``near_threshold`` in one
    claim). Dedup runs last, so only documents that every other stage kept claim text.
    ``claims``: the store URL the dedup index lives in (the run's ``--store``; a
    ``memory://`` index lives in its one actor).
    ``dedup_scope`` names the index (default: a new one; replica drivers and resumed runs
    must share it). ``dedup_against``: earlier scopes a document must not be in.
    """
    from rayorch.store.registry import is_shared_store

    if dedup not in (None, *DEDUP_MODES):
        raise QualityOptionError(f"dedup is one of {', '.join(DEDUP_MODES)}, not {dedup!r}")
    if quality not in QUALITY_MODES:
        raise QualityOptionError(f"quality is one of {', '.join(QUALITY_MODES)}, not "
                                 f"{quality!r}")
    if not 0.0 < near_threshold < 1.0:
        raise QualityOptionError(f"the near-dedup threshold is between 0 and 1, not "
                                 f"{near_threshold}")
    missing = [name for name in ("rensa", "py3langid")
               if importlib.util.find_spec(name) is None]
    if missing and (dedup == "near" or languages):
        raise QualityOptionError(f"{' and '.join(missing)} missing: pip install "
                                 "'rayorch[quality]'")
    modules: dict[str, Any] = {}
    # keep_values: a verdict is why a document is gone, lineage to keep with the run
    light: dict[str, Any] = {"num_outputs": 2, "num_cpus": 0.25, "batch_size": 32,
                             "keep_values": True}
    if dedup is not None:
        index: dict[str, Any] = {"claims": claims, "scope": dedup_scope or new_scope(),
                 "against": list(dedup_against)}
        # A memory:// index lives in its actor's process: one actor holds all of it.
        claiming: dict[str, Any] = {**light, "replicas": "auto" if is_shared_store(claims) else 1}
        if of_files:
            modules["dedup_bytes"] = ro.RayModule(ExactDedup, of="bytes", **index,
                                                  **claiming)
    if languages:
        try:
            LanguageId(languages)  # checked here, before any actor starts
        except ValueError as exc:
            raise QualityOptionError(str(exc)) from None
        modules["language"] = ro.RayModule(LanguageId, languages=list(languages),
                                           replicas="auto", **light)
    if quality == "default":
        modules["quality"] = ro.RayModule(QualityFilter, replicas="auto", **light)
    if dedup == "exact":
        modules["dedup_text"] = ro.RayModule(ExactDedup, of="text", **index, **claiming)
    elif dedup == "near":
        modules["dedup_near"] = ro.RayModule(NearDedup, threshold=near_threshold, **index,
                                             **claiming)
    return modules


def add_stages(pipeline: Any, **options: Any) -> list[str]:
    """Set the stage modules of :func:`stage_modules` on ``pipeline`` (its attributes);
    their names in order, also kept as ``pipeline.quality_stages``."""
    modules = stage_modules(**options)
    for name, module in modules.items():
        setattr(pipeline, name, module)
    names = list(modules)
    pipeline.quality_stages = names
    return names


def keep_sources(pipeline: Any, sources: Any) -> Any:
    """In ``forward``: the sources without byte copies (when ``dedup_bytes`` is set)."""
    if "dedup_bytes" not in getattr(pipeline, "quality_stages", ()):
        return sources
    keep, _ = pipeline.dedup_bytes(sources)
    return F.filter(sources, keep)


def keep_documents(pipeline: Any, docs: Any, ids: Any = None) -> Any:
    """In ``forward``: ``docs`` through every document stage of ``pipeline``, each one
    dropping by ``F.filter`` (``ids``: a Port of document ids, else each dict's ``path``)."""
    for name in getattr(pipeline, "quality_stages", ()):
        if name == "dedup_bytes":
            continue
        stage = getattr(pipeline, name)
        claims = name.startswith("dedup_") and ids is not None
        keep, _ = stage(docs, ids) if claims else stage(docs)
        docs = F.filter(docs, keep)
    return docs


class TextQuality(ro.Pipeline):
    """Documents (text, or dicts with ``markdown``/``text``) and their ids through the
    stages that ``options`` ask for (:func:`stage_modules`); what is left is the output.

    >>> plan = TextQuality(dedup="near", languages=["en"], dedup_scope="s1").compile()
    """

    def __init__(self, **options: Any) -> None:
        super().__init__()
        add_stages(self, **options)

    def forward(self, docs: Any, ids: Any) -> Any:
        return keep_documents(self, docs, ids)


__all__ = ["DEDUP_MODES", "QUALITY_MODES", "STAGES", "ExactDedup", "LanguageId", "NearDedup",
           "QualityFilter", "QualityOptionError", "TextQuality", "add_stages", "dropped",
           "keep_documents", "keep_sources", "kept", "new_scope", "stage_modules"]
