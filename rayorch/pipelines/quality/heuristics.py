"""Heuristic quality rules (Gopher, C4, FineWeb), one measure each, first failure drops.

Each rule measures one number of a document and names the bound it must keep; a verdict
names the first rule a document breaks, its score and the bound. The rules are the
published ones; their bounds are the published ones where extracted PDF text keeps them,
relaxed where PDFs differ from web pages, so that each rule alone passes at least 95% of
the real documents of the texlive corpus that are not lorem ipsum (docs/topics/QUALITY.md,
"Data-quality stages"): no upper word count (a book is long), line rules over paragraphs
(a PDF's lines are wrapped), duplicate n-grams and lines up to what a manual that shows
each example's source and its output repeats.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rayorch.pipelines.quality.text import document_text, paragraphs, words
from rayorch.pipelines.quality.verdict import dropped, kept

BULLETS = ("-", "*", "•", "●", "▪", "‣", "◦")
TERMINAL = (".", "!", "?", '"', "'", "\u201d", "\u2019", ":", ";", ")", "\u3002", "\uff01",
            "\uff1f")
ELLIPSES = ("...", "…")


@dataclass(frozen=True)
class Measures:
    """What the rules read of one document, computed once."""

    text: str
    tokens: list[str]  # whitespace-separated, as Gopher counts words
    words: list[str]  # word characters only, case-folded
    lines: list[str]  # paragraphs: a PDF's text lines are wrapped, a web page's are not

    @classmethod
    def of(cls, text: str) -> Measures:
        blocks = paragraphs(text)
        plain = "\n\n".join(blocks)
        return cls(plain, plain.split(), words(plain), blocks)


def _share(count: int, total: int) -> float:
    return count / total if total else 0.0


def _duplicate_lines(m: Measures) -> float:
    counts = Counter(m.lines)
    return _share(sum(c for c in counts.values() if c > 1), len(m.lines))


def _duplicate_line_chars(m: Measures) -> float:
    counts = Counter(m.lines)
    dup = sum(len(line) * c for line, c in counts.items() if c > 1)
    return _share(dup, sum(len(line) for line in m.lines))


def _top_ngram_chars(n: int) -> Callable[[Measures], float]:
    def measure(m: Measures) -> float:
        grams = Counter(tuple(m.words[i:i + n]) for i in range(len(m.words) - n + 1))
        if not grams:
            return 0.0
        gram, count = grams.most_common(1)[0]
        return _share(sum(len(w) for w in gram) * count, sum(len(w) for w in m.words))
    return measure


def _duplicate_ngram_chars(n: int) -> Callable[[Measures], float]:
    def measure(m: Measures) -> float:
        seen: set[tuple[str, ...]] = set()
        covered = [False] * len(m.words)
        for i in range(len(m.words) - n + 1):
            gram = tuple(m.words[i:i + n])
            if gram in seen:
                covered[i:i + n] = [True] * n
            seen.add(gram)
        return _share(sum(len(w) for w, c in zip(m.words, covered) if c),
                      sum(len(w) for w in m.words))
    return measure


@dataclass(frozen=True)
class Rule:
    """``name``: ``low <= measure(doc) <= high`` (either bound may be None)."""

    name: str
    measure: Callable[[Measures], float]
    low: float | None = None
    high: float | None = None

    def breaks(self, value: float) -> float | None:
        """The bound ``value`` breaks, or None."""
        if self.low is not None and value < self.low:
            return self.low
        if self.high is not None and value > self.high:
            return self.high
        return None


DEFAULT_RULES: tuple[Rule, ...] = (
    # C4
    Rule("lorem_ipsum", lambda m: float("lorem ipsum" in m.text.casefold()), high=0.0),
    # Gopher
    Rule("word_count", lambda m: float(len(m.words)), low=50),
    Rule("mean_word_length", lambda m: _share(sum(len(w) for w in m.words), len(m.words)),
         low=3, high=10),
    Rule("symbol_ratio", lambda m: _share(m.text.count("#") + sum(m.text.count(e)
                                                                 for e in ELLIPSES),
                                          len(m.tokens)), high=0.1),
    Rule("alpha_words", lambda m: _share(sum(any(ch.isalpha() for ch in t)
                                             for t in m.tokens), len(m.tokens)), low=0.4),
    Rule("bullet_lines", lambda m: _share(sum(line.startswith(BULLETS) for line in m.lines),
                                          len(m.lines)), high=0.9),
    Rule("ellipsis_lines", lambda m: _share(sum(line.endswith(ELLIPSES) for line in m.lines),
                                            len(m.lines)), high=0.3),
    Rule("duplicate_lines", _duplicate_lines, high=0.6),
    Rule("duplicate_line_chars", _duplicate_line_chars, high=0.5),
    Rule("top_2gram_chars", _top_ngram_chars(2), high=0.4),
    Rule("top_3gram_chars", _top_ngram_chars(3), high=0.4),
    Rule("top_4gram_chars", _top_ngram_chars(4), high=0.4),
    Rule("duplicate_5gram_chars", _duplicate_ngram_chars(5), high=0.85),
    Rule("duplicate_10gram_chars", _duplicate_ngram_chars(10), high=0.8),
    # FineWeb
    Rule("punctuated_lines", lambda m: _share(sum(line.endswith(TERMINAL) for line in m.lines),
                                              len(m.lines)), low=0.05),
    Rule("short_lines", lambda m: _share(sum(len(line) < 30 for line in m.lines),
                                         len(m.lines)), high=0.75),
)
"""The rules of ``--quality default``, in the order they are checked."""


class QualityFilter:
    """``(docs) -> [(keep, verdict)]``: drop a document at the first rule it breaks."""

    stage = "quality"

    def __init__(self, rules: tuple[Rule, ...] = DEFAULT_RULES) -> None:
        self.rules = rules

    def judge(self, text: str) -> tuple[bool, dict[str, Any]]:
        measures = Measures.of(text)
        for rule in self.rules:
            value = rule.measure(measures)
            bound = rule.breaks(value)
            if bound is not None:
                return dropped(self.stage, rule.name, score=round(value, 4), limit=bound)
        return kept(self.stage, words=len(measures.words))

    def __call__(self, docs: list[Any]) -> list[tuple[bool, dict[str, Any]]]:
        return [self.judge(document_text(doc)) for doc in docs]


__all__ = ["DEFAULT_RULES", "Measures", "QualityFilter", "Rule"]
