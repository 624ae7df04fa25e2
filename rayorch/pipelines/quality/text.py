"""The text a quality stage judges, normalised for hashing, and its word shingles."""

from __future__ import annotations

import re
import unicodedata
from typing import Any

_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_WORD = re.compile(r"\w+", re.UNICODE)
_SPACE = re.compile(r"\s+")


def document_text(doc: Any) -> str:
    """The text of a document: a string itself, or a document dict's ``markdown`` (or
    ``text``), without the HTML comments the PDF job puts in (page markers, the source)."""
    if isinstance(doc, dict):
        doc = doc.get("markdown", doc.get("text", ""))
    if not isinstance(doc, str):
        raise TypeError(f"a quality stage takes text or a document dict, not "
                        f"{type(doc).__name__}")
    return _COMMENT.sub("", doc)


def normalise(text: str) -> str:
    """Text as exact dedup compares it: NFKC, case-folded, words only, single spaces (a
    reflowed or re-punctuated copy hashes the same)."""
    return " ".join(words(text))


def words(text: str) -> list[str]:
    """The case-folded words of ``text`` (Unicode word characters)."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def shingles(tokens: list[str], size: int) -> list[str]:
    """The distinct ``size``-word shingles of ``tokens`` (the whole text when shorter)."""
    if len(tokens) <= size:
        return [" ".join(tokens)] if tokens else []
    return list(dict.fromkeys(" ".join(tokens[i:i + size])
                              for i in range(len(tokens) - size + 1)))


def lines(text: str) -> list[str]:
    """The non-blank lines of ``text``, stripped."""
    return [line.strip() for line in text.splitlines() if line.strip()]


_HEADING = re.compile(r"^#{1,6}\s+")
_BLANK = re.compile(r"\n\s*\n")


def paragraphs(text: str) -> list[str]:
    """The paragraphs of ``text`` (blocks between blank lines), each on one line, without
    Markdown heading marks: what a web page's lines are, for the line rules."""
    out = []
    for block in _BLANK.split(text):
        joined = collapse_space(block)
        if joined:
            out.append(_HEADING.sub("", joined))
    return out


def collapse_space(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


__all__ = ["collapse_space", "document_text", "lines", "normalise", "paragraphs", "shingles",
           "words"]
