"""Language identification: py3langid's naive Bayes model (97 languages, shipped inside
its wheel, no hub), one score per document, a threshold per language."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rayorch.pipelines.quality.text import collapse_space, document_text
from rayorch.pipelines.quality.verdict import dropped, kept

SAMPLE_CHARS = 20_000
"""How much of a document the model reads (its start; the score settles long before)."""
DEFAULT_MIN_SCORE = 0.5


class LanguageId:
    """``(docs) -> [(keep, verdict)]``: keep documents in one of ``languages`` (ISO 639-1
    codes) with a score of at least ``min_score`` (one number, or per language)."""

    stage = "language"

    def __init__(self, languages: Sequence[str], *,
                 min_score: float | Mapping[str, float] = DEFAULT_MIN_SCORE) -> None:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        self.identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        known = set(self.identifier.nb_classes)
        unknown = sorted(set(languages) - known)
        if not languages or unknown:
            raise ValueError(f"languages must be ISO 639-1 codes the model knows "
                             f"({', '.join(sorted(known))}), not {', '.join(unknown) or 'none'}")
        self.languages = tuple(languages)
        self.min_score = min_score

    def identify(self, text: str) -> tuple[str, float]:
        """The language of ``text`` and the model's probability for it."""
        lang, score = self.identifier.classify(collapse_space(text[:SAMPLE_CHARS]))
        return str(lang), round(float(score), 4)

    def threshold(self, lang: str) -> float:
        if isinstance(self.min_score, Mapping):
            return float(self.min_score.get(lang, DEFAULT_MIN_SCORE))
        return float(self.min_score)

    def __call__(self, docs: list[Any]) -> list[tuple[bool, dict[str, Any]]]:
        out = []
        for doc in docs:
            text = document_text(doc)
            if not text.strip():
                out.append(dropped(self.stage, "no_text", lang=None, score=0.0))
                continue
            lang, score = self.identify(text)
            if lang not in self.languages:
                out.append(dropped(self.stage, "language", lang=lang, score=score))
            elif score < self.threshold(lang):
                out.append(dropped(self.stage, "language_score", lang=lang, score=score,
                                   limit=self.threshold(lang)))
            else:
                out.append(kept(self.stage, lang=lang, score=score))
        return out


__all__ = ["DEFAULT_MIN_SCORE", "SAMPLE_CHARS", "LanguageId"]
