"""A labelled set for the data-quality stages, made from real text (rayorch.pipelines.quality).

Real documents: the text layers of the PDFs in ``examples/pdfs`` and of the corpus that
``scripts/fetch_corpus.py`` fetches (``.cache/corpus``), each long one split in two halves
(two distinct documents on the same topic). Real text in known languages: the translated
messages of the machine's own programs (``/usr/share/locale/<lang>/LC_MESSAGES/*.mo``),
joined into documents of 200 to 1,500 characters. From these, seeded:

* ``exact``: a copy of an original's text, as is;
* ``byte``: a PDF to copy byte for byte (the byte stage's copies; its originals are every
  distinct PDF of the examples and the corpus);
* ``near``: a near-copy (words replaced, the text reflowed, the header changed, a span cut),
  kept only when its 5-gram Jaccard with its original, computed exactly, is >= 0.8;
* ``original``: the real documents, checked pairwise distinct (5-gram Jaccard < 0.5);
* ``lang``: documents in one language each, the language their file says;
* ``low``: low-quality pages: boilerplate menus, one line repeated, symbol soup, lorem
  ipsum, fragments, tables of numbers.

    from bench.quality_set import build_set
    items = build_set()          # [{"id", "kind", "group", "text", "lang", "pdf"?}], cached

Same seed, same set (``SET_VERSION`` bumps rebuild the cache).
"""

from __future__ import annotations

import gettext
import json
import random
import re
from pathlib import Path
from typing import Any

from rayorch.pipelines.quality.text import document_text, shingles, words

SET_VERSION = 4
CACHE = Path(".cache/quality_set")
CORPUS = Path(".cache/corpus")
EXAMPLES = Path("examples/pdfs")
LANGUAGES = ("en", "de", "fr", "es", "it", "pt", "nl", "ru", "pl", "sv", "cs", "fi", "da",
             "hu", "tr", "ro", "uk", "el", "ca", "ja")
LANG_DOCS = 15
MIN_WORDS = 300
MAX_WORDS = 4000


def jaccard(a: str, b: str, size: int = 5) -> float:
    """The exact Jaccard similarity of two texts' ``size``-word shingle sets."""
    x, y = set(shingles(words(a), size)), set(shingles(words(b), size))
    return len(x & y) / len(x | y) if x | y else 1.0


def pdf_texts() -> list[tuple[str, str]]:
    """``(pdf path, text)`` of every readable PDF's text layer (examples and corpus)."""
    from rayorch.pipelines.pdf import AssembleDocument, RenderPdf

    render, assemble = RenderPdf(ocr_fallback=False), AssembleDocument(page_markers=False)
    paths = sorted(EXAMPLES.glob("*.pdf")) + sorted(CORPUS.glob("*/*.pdf"))
    out = []
    for path in paths:
        try:
            [(_, meta)] = render([str(path)])
            [doc] = assemble([[]], [meta])
        except Exception:  # an unreadable PDF is not part of the set
            continue
        out.append((str(path), document_text(doc)))
    return out


def _cut(text: str, max_words: int) -> str:
    """The text's leading paragraphs, up to ``max_words`` words (at a paragraph end)."""
    out, count = [], 0
    for block in re.split(r"\n\s*\n", text):
        count += len(block.split())
        if out and count > max_words:
            break
        out.append(block)
    return "\n\n".join(out)


def _halves(text: str) -> tuple[str, str]:
    """The text cut at the paragraph break nearest its middle word."""
    blocks = re.split(r"\n\s*\n", text)
    total, seen = len(text.split()), 0
    for n, block in enumerate(blocks):
        seen += len(block.split())
        if seen >= total / 2:
            return "\n\n".join(blocks[:n + 1]), "\n\n".join(blocks[n + 1:])
    return text, ""


def originals(texts: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Long enough, capped, split in halves at a paragraph break (two documents on the same
    topic); pairwise distinct (5-gram Jaccard < 0.5); no lorem ipsum (a quality drop)."""
    pieces = []
    for path, text in texts:
        text = _cut(text, MAX_WORDS)
        if len(text.split()) < MIN_WORDS or "lorem ipsum" in text.casefold():
            continue
        first, second = _halves(text)
        if min(len(first.split()), len(second.split())) >= MIN_WORDS:
            pieces += [(path, first, "a"), (path, second, "b")]
        else:
            pieces.append((path, text, ""))
    kept: list[tuple[str, str, str, set[str]]] = []
    for path, text, half in pieces:
        grams = set(shingles(words(text), 5))
        if all(len(grams & g) / len(grams | g) < 0.5 for *_, g in kept):
            kept.append((path, text, half, grams))
    return [{"kind": "original", "text": t, "source": p, "half": h} for p, t, h, _ in kept]


def distinct_pdfs() -> list[str]:
    """The PDFs of the examples and the corpus, the first of any byte-identical ones."""
    import hashlib

    seen: set[str] = set()
    out = []
    for path in sorted(EXAMPLES.glob("*.pdf")) + sorted(CORPUS.glob("*/*.pdf")):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest not in seen:
            seen.add(digest)
            out.append(str(path))
    return out


def near_copy(text: str, rng: random.Random, vocab: list[str]) -> str:
    """One seeded near-copy: words replaced, reflowed, header changed or a span cut."""
    tokens = text.split()
    how = rng.choice(("replace", "reflow", "header", "cut", "mixed"))
    if how in ("replace", "mixed"):  # up to 4%: a 5-gram Jaccard from about 0.8 to 1
        for i in rng.sample(range(len(tokens)), max(1, int(len(tokens) * rng.uniform(0.002,
                                                                                    0.04)))):
            tokens[i] = rng.choice(vocab)
    if how in ("cut", "mixed"):
        start = rng.randrange(len(tokens))
        del tokens[start:start + max(1, int(len(tokens) * rng.uniform(0.01, 0.2)))]
    if how == "header":
        header = ["Draft", "copy", "--", "revised", "edition", str(rng.randrange(1, 20))]
        tokens = [*header, *tokens[rng.randrange(1, 12):]]
    out = []
    for token in tokens:  # reflowed: other line breaks, a hyphen here and there
        out.append(token)
        if how in ("reflow", "mixed") and rng.random() < 0.1:
            out.append("\n")
    return re.sub(r" ?\n ?", "\n", " ".join(out))


def language_docs(rng: random.Random) -> list[dict[str, Any]]:
    """Documents of translated program messages, ``LANG_DOCS`` per language."""
    docs = []
    for lang in LANGUAGES:
        messages: list[str] = []
        # English: the messages' source text (the keys of the German catalogs)
        folder = "de" if lang == "en" else lang
        for mo in sorted(Path(f"/usr/share/locale/{folder}/LC_MESSAGES").glob("*.mo")):
            try:
                with mo.open("rb") as fh:
                    catalog = gettext.GNUTranslations(fh)._catalog  # type: ignore[attr-defined]
            except Exception:
                continue
            for key, value in catalog.items():
                value = key if lang == "en" else value
                if key and isinstance(value, str) and len(value) >= 30 and "%" not in value \
                        and "\\" not in value:
                    messages.append(" ".join(value.split()))
        rng.shuffle(messages)
        for i in range(LANG_DOCS):
            target = rng.randrange(200, 1500)
            text = ""
            while len(text) < target and messages:
                text += messages.pop() + " "
            if len(text) >= 200:
                docs.append({"kind": "lang", "lang": lang, "text": text.strip(),
                             "group": f"lang-{lang}-{i}"})
    return docs


def low_quality(rng: random.Random, vocab: list[str], prose: list[str]) -> list[dict[str, Any]]:
    """Low-quality pages, 20 of each kind, built from real words and sentences."""
    menu = ["Home", "About us", "Contact", "Login", "Sign up", "Privacy policy", "Terms",
            "Cookies", "Share", "Subscribe", "Next page", "Previous page", "Search"]
    docs = []
    for _ in range(20):
        line = rng.choice(prose)
        docs += [
            {"low": "boilerplate", "text": "\n".join(
                " | ".join(rng.sample(menu, 4)) for _ in range(rng.randrange(30, 80)))},
            {"low": "repeated", "text": "\n\n".join([line] * rng.randrange(10, 40))},
            {"low": "symbols", "text": " ".join(
                "".join(rng.choice("#$%&*+=<>|{}[]~^0123456789.,;:") for _ in range(
                    rng.randrange(1, 8))) for _ in range(rng.randrange(200, 600)))},
            {"low": "lorem", "text": "Lorem ipsum dolor sit amet, consectetur adipiscing "
             "elit. " * rng.randrange(5, 30) + line},
            {"low": "fragment", "text": " ".join(rng.sample(vocab, rng.randrange(5, 40)))},
            {"low": "numbers", "text": "\n".join(
                " ".join(str(rng.randrange(10_000)) for _ in range(6))
                for _ in range(rng.randrange(40, 120)))},
        ]
    return [{"kind": "low", "group": f"low-{n}", **d} for n, d in enumerate(docs)]


def build_set(seed: int = 41, cache: Path = CACHE) -> list[dict[str, Any]]:
    """The labelled set (built once, then read from ``cache``)."""
    path = cache / f"set-v{SET_VERSION}-{seed}.json"
    if path.exists():
        return list(json.loads(path.read_text()))
    rng = random.Random(seed)
    texts = pdf_texts()
    if len(texts) < 20:
        raise SystemExit("fetch the corpus first: python scripts/fetch_corpus.py")
    items = originals(texts)
    for n, item in enumerate(items):
        item["group"] = f"doc-{n}"
    vocab = sorted({w for item in items for w in item["text"].split()[:200]})
    copies = []
    for item in rng.sample(items, len(items) // 2):
        copies.append({"kind": "exact", "group": item["group"], "text": item["text"]})
    pdfs = distinct_pdfs()
    copies += [{"kind": "byte", "group": f"pdf-{pdfs.index(p)}", "pdf": p, "text": ""}
               for p in rng.sample(pdfs, len(pdfs) // 2)]
    near = []
    for item in items * 2:
        if len(near) >= len(items):
            break
        text = near_copy(item["text"], rng, vocab)
        similarity = jaccard(item["text"], text)
        if similarity >= 0.8:
            near.append({"kind": "near", "group": item["group"], "text": text,
                         "jaccard": round(similarity, 4)})
    prose = [s.strip() + "." for item in items[:40] for s in item["text"].split(".")
             if 60 < len(s) < 200]
    out = items + copies + near + language_docs(rng) + low_quality(rng, vocab, prose)
    for n, item in enumerate(out):
        item["id"] = n
        item.setdefault("lang", None)
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    return out


if __name__ == "__main__":
    from collections import Counter

    built = build_set()
    print(dict(Counter(item["kind"] for item in built)), "documents in", CACHE)
