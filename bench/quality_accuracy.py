"""The data-quality stages on the labelled set (bench/quality_set.py): accuracy, speed, and
the dedup index's memory. Each stage is the UDF the pipeline runs, called in process.

    python scripts/fetch_corpus.py && python bench/quality_accuracy.py [--json]

Accuracy. Dedup sees the originals first (shuffled), then every copy (shuffled): an exact
copy or a near-copy is dropped correctly when it is dropped naming a document of its own
group; an original dropped at all is a distinct document wrongly dropped, and so is a copy
dropped naming another group. A second pass streams everything shuffled and counts the
groups left with exactly one document. Language: the identified language against the
label of each document of 200+ characters. Quality: the share of low-quality pages
dropped, and of real originals kept.

Speed: documents per second of each stage over the originals, one process. Memory: the
dedup index of near dedup (the text hash and 16 LSH bands per kept document) in a real
redis-server (``used_memory`` growth) and in the memory store (tracemalloc), per million
documents, extrapolated from ``--index-docs`` documents.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

from bench.quality_set import build_set
from rayorch.pipelines.quality import ExactDedup, LanguageId, NearDedup, QualityFilter, new_scope
from rayorch.pipelines.quality.language import SAMPLE_CHARS
from rayorch.pipelines.quality.verdict import STAGES
from rayorch.store.claims import MemoryClaims


def dedup_pass(stage: Any, stream: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each item's verdict, the items claimed in stream order (ids: their set ids)."""
    return {item["id"]: stage.decide(item["text"], f"doc-{item['id']}")[1] for item in stream}


def dedup_scores(items: list[dict[str, Any]], verdicts: dict[int, dict[str, Any]]
                 ) -> dict[str, Any]:
    group = {f"doc-{i['id']}": i["group"] for i in items}
    out: dict[str, Any] = {}
    near = sorted(i["jaccard"] for i in items if i["kind"] == "near")
    out["near_copies_jaccard_min_median"] = [near[0], near[len(near) // 2]]
    out["near_copies_jaccard_under_0.85"] = sum(j < 0.85 for j in near)
    for kind in ("exact", "near"):
        mine = [i for i in items if i["kind"] == kind]
        right = sum(1 for i in mine if not verdicts[i["id"]]["keep"]
                    and group[verdicts[i["id"]]["kept"]] == i["group"])
        out[f"{kind}_copies_dropped"] = f"{right}/{len(mine)}"
        out[f"{kind}_copies_dropped_pct"] = round(100 * right / len(mine), 2)
    distinct = [i for i in items if i["kind"] == "original"]
    wrong = sum(1 for i in distinct if not verdicts[i["id"]]["keep"])
    wrong += sum(1 for i in items if i["kind"] in ("exact", "near")
                 and not verdicts[i["id"]]["keep"]
                 and group[verdicts[i["id"]]["kept"]] != i["group"])
    out["distinct_wrongly_dropped"] = f"{wrong}/{len(distinct)}"
    out["distinct_wrongly_dropped_pct"] = round(100 * wrong / len(distinct), 2)
    return out


def one_survivor_share(items: list[dict[str, Any]], verdicts: dict[int, dict[str, Any]]
                       ) -> str:
    alive = Counter(i["group"] for i in items if verdicts[i["id"]]["keep"])
    groups = {i["group"] for i in items}
    return f"{sum(alive[g] == 1 for g in groups)}/{len(groups)}"


def byte_scores(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Byte dedup over every distinct PDF, then byte copies of some of them (files)."""
    from bench.quality_set import distinct_pdfs

    originals = distinct_pdfs()
    copies = [i["pdf"] for i in items if i["kind"] == "byte"]
    stage = ExactDedup(of="bytes", scope=new_scope())
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for n, pdf in enumerate(copies):
            target = Path(tmp) / f"copy-{n}.pdf"
            shutil.copyfile(pdf, target)
            paths.append(str(target))
        started = time.perf_counter()
        verdicts = stage(originals + paths)
        seconds = time.perf_counter() - started
    wrong = sum(1 for keep, _ in verdicts[:len(originals)] if not keep)
    dropped = sum(1 for (keep, why), pdf in zip(verdicts[len(originals):], copies)
                  if not keep and why["kept"] == pdf)
    return {"byte_copies_dropped": f"{dropped}/{len(paths)}",
            "byte_distinct_wrongly_dropped": f"{wrong}/{len(originals)}",
            "bytes_docs_per_s": round(len(verdicts) / seconds, 1),
            "mean_pdf_mb": round(sum(Path(p).stat().st_size for p in originals)
                                 / len(originals) / 2**20, 2)}


def language_scores(items: list[dict[str, Any]]) -> dict[str, Any]:
    docs = [i for i in items if i["kind"] == "lang" and len(i["text"]) >= 200]
    stage = LanguageId(sorted({i["lang"] for i in docs}))
    found = [stage.identify(i["text"])[0] for i in docs]
    right = sum(f == i["lang"] for f, i in zip(found, docs))
    misses = Counter(f"{i['lang']}->{f}" for f, i in zip(found, docs) if f != i["lang"])
    return {"language_correct": f"{right}/{len(docs)}",
            "language_correct_pct": round(100 * right / len(docs), 2),
            "languages": len({i["lang"] for i in docs}),
            "language_misses": dict(misses.most_common(8))}


def quality_scores(items: list[dict[str, Any]]) -> dict[str, Any]:
    stage = QualityFilter()
    low = [i for i in items if i["kind"] == "low"]
    real = [i for i in items if i["kind"] == "original"]
    dropped = [stage.judge(i["text"]) for i in low]
    by_kind = Counter(i["low"] for i, (keep, _) in zip(low, dropped) if not keep)
    kept = sum(stage.judge(i["text"])[0] for i in real)
    return {"low_quality_dropped": f"{sum(by_kind.values())}/{len(low)}",
            "low_quality_dropped_by_kind": dict(sorted(by_kind.items())),
            "real_kept": f"{kept}/{len(real)}",
            "real_dropped_by_rule": dict(Counter(
                stage.judge(i["text"])[1]["reason"] for i in real
                if not stage.judge(i["text"])[0]).most_common())}


def rate(fn: Any, docs: list[Any], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn(docs)
        best = min(best, time.perf_counter() - started)
    return round(len(docs) / best, 1)


def speeds(items: list[dict[str, Any]], redis_url: str | None) -> dict[str, Any]:
    docs = [i["text"] for i in items if i["kind"] == "original"]
    words = sum(len(d.split()) for d in docs) / len(docs)
    language = LanguageId(["en"])
    out: dict[str, Any] = {"documents": len(docs), "mean_words": round(words)}
    out["language_docs_per_s"] = rate(language, docs)
    out["quality_docs_per_s"] = rate(QualityFilter(), docs)
    out["minhash_docs_per_s"] = rate(lambda ds: [NearDedup(scope="x").signature(d)
                                                 for d in ds], docs)

    def stage_rate(cls: Any, url: str, **options: Any) -> float:
        def run(ds: list[str]) -> None:
            cls(claims=url, scope=new_scope(), **options)(ds, [f"d{n}" for n in range(len(ds))])
        return rate(run, docs)

    out["exact_text_docs_per_s"] = stage_rate(ExactDedup, "memory://", of="text")
    out["near_docs_per_s"] = stage_rate(NearDedup, "memory://")
    if redis_url:
        out["exact_text_redis_docs_per_s"] = stage_rate(ExactDedup, redis_url, of="text")
        out["near_redis_docs_per_s"] = stage_rate(NearDedup, redis_url)
    out["language_sample_chars"] = SAMPLE_CHARS
    return out


def index_memory(count: int, redis: Any) -> dict[str, Any]:
    """The near-dedup index of ``count`` kept documents, per million documents."""
    stage = NearDedup(scope="mem")
    rng = random.Random(7)
    claimant = "s3://bucket/corpus/some/prefix/document-0000000.pdf"  # a 52-char id
    keys_of = []
    for _ in range(count):
        signature = [rng.getrandbits(32) for _ in range(stage.num_perm)]
        text = f"text:sha256:{rng.getrandbits(128):032x}"
        keys_of.append([text, *stage.band_keys(signature)])
    out: dict[str, Any] = {"keys_per_document": len(keys_of[0]), "documents": count}
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    claims = MemoryClaims()
    for n, keys in enumerate(keys_of):
        claims.claim("mem", keys, claimant[:-7] + f"{n:07d}")
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    out["memory_store_mb_per_million"] = round(grown / count * 1e6 / 2**20)
    if redis is not None:
        store = redis
        client = store._client()
        start = int(client.info("memory")["used_memory"])
        for n, keys in enumerate(keys_of):
            store.claim("memscope", keys, claimant[:-7] + f"{n:07d}")
        used = int(client.info("memory")["used_memory"]) - start
        out["redis_mb_per_million"] = round(used / count * 1e6 / 2**20)
        store.delete_claims("memscope")
    return out


def datasketch_pass(stream: list[dict[str, Any]], threshold: float
                    ) -> tuple[dict[int, dict[str, Any]], float]:
    """The same streaming near dedup with datasketch's MinHash and in-memory MinHashLSH
    (its own band choice at ``threshold``, 128 permutations): query, then insert if new."""
    from datasketch import MinHash, MinHashLSH

    from rayorch.pipelines.quality.text import shingles, words

    lsh = MinHashLSH(threshold=threshold, num_perm=128)
    verdicts: dict[int, dict[str, Any]] = {}
    started = time.perf_counter()
    for item in stream:
        minhash = MinHash(num_perm=128, seed=1)
        minhash.update_batch([g.encode() for g in shingles(words(item["text"]), 5)])
        found = sorted(lsh.query(minhash))
        name = f"doc-{item['id']}"
        if found:
            verdicts[item["id"]] = {"keep": False, "kept": found[0]}
        else:
            lsh.insert(name, minhash)
            verdicts[item["id"]] = {"keep": True}
    return verdicts, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--index-docs", type=int, default=50_000)
    parser.add_argument("--no-redis", action="store_true")
    parser.add_argument("--peers", action="store_true",
                        help="also datasketch's MinHash LSH on the same stream (extra bench)")
    args = parser.parse_args()
    items = build_set()
    rng = random.Random(1)
    originals = [i for i in items if i["kind"] == "original"]
    copies = [i for i in items if i["kind"] in ("exact", "near")]
    rng.shuffle(originals)
    rng.shuffle(copies)
    result: dict[str, Any] = {"set": dict(Counter(i["kind"] for i in items)),
                              "stages": list(STAGES)}
    texts = originals + copies
    exact = dedup_pass(ExactDedup(of="text", scope=new_scope()), texts)
    result["dedup_exact"] = {k: v for k, v in dedup_scores(texts, exact).items()
                             if not k.startswith("near")}
    result["dedup_near"] = dedup_scores(texts, dedup_pass(NearDedup(scope=new_scope()), texts))
    shuffled = texts[:]
    rng.shuffle(shuffled)
    result["dedup_near"]["shuffled_groups_with_one_survivor"] = one_survivor_share(
        shuffled, dedup_pass(NearDedup(scope=new_scope()), shuffled))
    started = time.perf_counter()
    ours = dedup_pass(NearDedup(scope=new_scope()), texts)
    ours_s = time.perf_counter() - started
    if args.peers:
        theirs, theirs_s = datasketch_pass(texts, 0.8)
        result["side_by_side_near"] = {
            "rayorch (rensa, claims)": {**dedup_scores(texts, ours),
                                        "docs_per_s": round(len(texts) / ours_s, 1)},
            "datasketch MinHashLSH": {**dedup_scores(texts, theirs),
                                      "docs_per_s": round(len(texts) / theirs_s, 1)}}
    result["dedup_bytes"] = byte_scores(items)
    result["language"] = language_scores(items)
    result["quality"] = quality_scores(items)
    server = None
    redis_store = None
    if not args.no_redis:
        from rayorch.store import open_store
        from rayorch.testing import RedisServer, redis_server_path

        if redis_server_path() is not None:
            server = RedisServer(Path(tempfile.mkdtemp()))
            server.start()
            redis_store = open_store(server.url)
    try:
        result["speed"] = speeds(items, None if server is None else server.url)
        result["index_memory"] = index_memory(args.index_docs, redis_store)
    finally:
        if redis_store is not None:
            redis_store.close()
        if server is not None:
            server.stop()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
