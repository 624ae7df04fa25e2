"""The data-quality stages alone and in a pipeline run in process (no Ray): exact and near
dedup decided by the store's claims, language, quality rules, and every drop read back
from the facts with its reason."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

import rayorch as ro
from rayorch.core.outcome import Outcome
from rayorch.core.run_view import RunView, fold_shard, numbered
from rayorch.inspect.drops import drops_by_reason, run_drops
from rayorch.inspect.show import lineage, lineage_lines
from rayorch.pipelines.quality import (
    ExactDedup,
    LanguageId,
    NearDedup,
    QualityFilter,
    QualityOptionError,
    add_stages,
    keep_documents,
    new_scope,
)
from rayorch.pipelines.quality.dedup import lsh_bands
from rayorch.pipelines.quality.text import shingles, words
from rayorch.runtime.in_process import execute

PROSE = (
    "The committee met on Tuesday to review the budget for the coming year. After a long "
    "discussion of the road repairs, the library hours and the new bus line, the members "
    "agreed to postpone the vote until the auditors had finished their report. Several "
    "residents spoke about the noise from the quarry and asked for a public hearing. The "
    "chair promised to put the question on the agenda of the next meeting, which will be "
    "held in the school hall. Coffee and sandwiches were served before the session closed."
)
GERMAN = ("Der Ausschuss traf sich am Dienstag, um den Haushalt für das kommende Jahr zu "
          "prüfen. Nach einer langen Diskussion über die Straßenreparaturen und die neuen "
          "Öffnungszeiten der Bibliothek beschlossen die Mitglieder, die Abstimmung zu "
          "verschieben, bis die Prüfer ihren Bericht vorgelegt hatten.")
FRENCH = ("Le comité s'est réuni mardi pour examiner le budget de l'année prochaine. Après "
          "une longue discussion sur la réparation des routes et les nouveaux horaires de la "
          "bibliothèque, les membres ont décidé de reporter le vote jusqu'au rapport des "
          "auditeurs.")


def long_text(seed: int, n: int = 400) -> str:
    rng = random.Random(seed)
    vocab = words(PROSE + " " + " ".join(f"term{i}" for i in range(300)))
    return " ".join(rng.choice(vocab) for _ in range(n)) + "."


def test_exact_text_dedup_keeps_the_first_claim_and_names_it() -> None:
    stage = ExactDedup(of="text", scope=new_scope())
    reflowed = PROSE.upper().replace(". ", ".\n\n")
    [(keep_a, why_a), (keep_b, why_b)] = stage([PROSE, reflowed], ["a.pdf", "b.pdf"])
    assert keep_a and why_a["reason"] is None
    assert not keep_b and why_b["reason"] == "duplicate" and why_b["kept"] == "a.pdf"
    assert why_b["key"] == why_a["key"]
    # a retried or resumed document finds its own claim and keeps its verdict
    assert stage([PROSE], ["a.pdf"])[0][0] is True
    assert stage([reflowed], ["b.pdf"])[0] == (keep_b, why_b)
    # another scope is another index
    assert ExactDedup(of="text", scope=new_scope())([reflowed], ["b.pdf"])[0][0] is True


def test_exact_bytes_dedup_reads_the_files(tmp_path: Path) -> None:
    a, b, c = (tmp_path / n for n in ("a.pdf", "b.pdf", "c.pdf"))
    a.write_bytes(b"%PDF-1.4 same bytes")
    b.write_bytes(b"%PDF-1.4 same bytes")
    c.write_bytes(b"%PDF-1.4 other bytes")
    out = ExactDedup(of="bytes", scope=new_scope())([str(a), str(b), str(c)])
    assert [keep for keep, _ in out] == [True, False, True]
    assert out[1][1]["kept"] == str(a) and out[1][1]["stage"] == "dedup_bytes"


def test_near_dedup_drops_near_copies_and_keeps_distinct_documents() -> None:
    stage = NearDedup(scope=new_scope())
    original = long_text(1)
    tokens = original.split()
    edited = " ".join(t if i % 60 else "CHANGED" for i, t in enumerate(tokens))  # ~2% edits
    grams_a, grams_b = set(shingles(words(original), 5)), set(shingles(words(edited), 5))
    assert len(grams_a & grams_b) / len(grams_a | grams_b) >= 0.8
    out = stage([original, edited, long_text(2)], ["a", "b", "c"])
    assert [keep for keep, _ in out] == [True, False, True]
    assert out[1][1] | {"kept": "a"} == out[1][1] and out[1][1]["reason"] == "near_duplicate"
    # a dropped document entered no band: a copy of it alone is kept... by nobody but "a"
    assert stage([edited], ["d"])[0][1]["kept"] == "a"


def test_lsh_bands_split_at_the_threshold() -> None:
    bands, rows = lsh_bands(0.8, 128)
    assert bands * rows <= 128
    chance = [1 - (1 - s ** rows) ** bands for s in (0.5, 0.8, 0.9)]
    assert chance[0] < 0.1 and chance[1] >= 0.9 and chance[2] > 0.99


def test_language_id_keeps_the_languages_asked_for_with_their_scores() -> None:
    out = LanguageId(["en", "de"])([PROSE, GERMAN, FRENCH, ""])
    assert [keep for keep, _ in out] == [True, True, False, False]
    assert out[2][1]["lang"] == "fr" and out[2][1]["reason"] == "language"
    assert out[2][1]["score"] > 0.9
    assert out[3][1]["reason"] == "no_text"
    with pytest.raises(ValueError, match="xx"):
        LanguageId(["en", "xx"])


def test_quality_rules_drop_boilerplate_repetition_and_symbol_soup() -> None:
    stage = QualityFilter()
    good = "\n\n".join([PROSE, GERMAN.replace("Der", "The"), long_text(3)])
    boiler = "\n\n".join(["Home | About | Contact | Login", "Accept cookies"] * 40)
    soup = " ".join(["#$%^ &*() {{}} ~~ |||| 1234 ::"] * 60)
    lorem = "Lorem ipsum dolor sit amet. " * 30 + PROSE
    verdicts = [why for _, why in stage([good, boiler, soup, lorem, "too short."])]
    assert verdicts[0]["keep"] is True
    assert verdicts[1]["reason"] in ("duplicate_lines", "top_2gram_chars", "duplicate_5gram_chars")
    assert verdicts[2]["reason"] in ("alpha_words", "symbol_ratio", "mean_word_length")
    assert verdicts[3]["reason"] == "lorem_ipsum"
    assert verdicts[4]["reason"] == "word_count" and verdicts[4]["score"] == 2.0


def test_bad_options_are_refused_before_anything_runs() -> None:
    class P(ro.Pipeline):
        pass

    for options in ({"dedup": "fuzzy"}, {"quality": "strict"}, {"languages": ["english"]},
                    {"dedup": "near", "near_threshold": 1.5}):
        with pytest.raises(QualityOptionError):
            add_stages(P(), **options)


class Clean(ro.Pipeline):
    """Every document stage over text documents with ids."""

    def __init__(self, scope: str) -> None:
        super().__init__()
        add_stages(self, dedup="near", languages=["en"], quality="default", dedup_scope=scope)

    def forward(self, docs: Any, ids: Any) -> Any:
        return keep_documents(self, docs, ids)


def test_a_pipeline_drops_through_f_filter_and_the_facts_say_why() -> None:
    """Each drop is the stage's committed verdict: ``show`` and the drops reader find the
    stage, the reason, the kept copy or the score."""
    a = long_text(5, 600)
    docs = [(a, "a"), (a.upper(), "b"), (FRENCH * 8, "c"),
            ("\n\n".join(["Click here to subscribe to the newsletter of the committee."] * 80),
             "d"),
            (long_text(6, 600), "e"),
            (a.replace("term1 ", "term2 ", 3), "f")]
    result = execute(Clean(new_scope()).compile(), docs)
    outcomes = [result.outputs[i][0].outcome for i in range(len(docs))]
    assert outcomes == [Outcome.PRESENT, Outcome.DROPPED, Outcome.DROPPED, Outcome.DROPPED,
                        Outcome.PRESENT, Outcome.DROPPED]
    shard = fold_shard(0, numbered(result.log))
    drops = run_drops(RunView("r", {}, {0: shard}))
    assert {i: (d.stage, d.reason) for i, d in drops.items()} == {
        1: ("dedup_near", "duplicate"), 2: ("language", "language"),
        3: ("quality", drops[3].reason), 5: ("dedup_near", "near_duplicate")}
    assert drops[1].verdict["kept"] == "a" and drops[5].verdict["kept"] == "a"
    assert drops[2].verdict["lang"] == "fr"
    assert drops_by_reason(drops)["dedup_near: duplicate"] == 1
    text = "\n".join(lineage_lines(lineage(shard, (1,))))
    assert "dropped by dedup_near: duplicate (" in text and "kept: a" in text


@pytest.mark.parametrize("seed", range(6))
def test_the_survivor_of_each_group_is_delivered_across_retries_and_restarts(seed: int) -> None:
    """Faults after the claim (a lost report, a timeout), duplicate reports and driver
    restarts retry dedup Grains whose claims are already recorded: a retried document
    finds its own claim, so each group delivers exactly one copy and every dropped copy
    names a delivered one."""
    from rayorch.core.plan import Policy
    from rayorch.runtime.in_process import ExecutorOptions

    groups = [long_text(10 + g, 300) for g in range(4)]
    docs = [(text if copy == 0 else text.upper(), f"g{g}-c{copy}")
            for copy in range(3) for g, text in enumerate(groups)]
    options = ExecutorOptions(batch_size=2, policy=Policy.ELASTIC, actors=2, seed=seed,
                              random_order=True, fault_rate=0.5, max_faults_per_grain=2,
                              bogus_report_rate=0.2, restart_rate=0.05, fence_on_restart=True)
    result = execute(Clean(new_scope()).compile(), docs, options)
    present = {docs[i][1] for i, (item,) in result.outputs.items()
               if item.outcome is Outcome.PRESENT}
    assert sorted(name.split("-")[0] for name in present) == ["g0", "g1", "g2", "g3"]
    drops = run_drops(RunView("r", {}, {0: fold_shard(0, numbered(result.log))}))
    assert len(drops) == 8
    for index, drop in drops.items():
        assert drop.verdict["kept"] in present
        assert drop.verdict["kept"].split("-")[0] == docs[index][1].split("-")[0]


def test_the_stages_verdicts_are_kept_with_the_run() -> None:
    """A verdict is why a document is gone: the stages declare ``keep_values``, so the
    store never frees their values once a source is delivered (issue 37's release)."""
    from rayorch.core.plan import Plan
    from rayorch.core.run_view import delivered_calls
    from rayorch.pipelines.quality import TextQuality

    desc = TextQuality(dedup="near", languages=["en"], quality="default",
                       dedup_scope="s").compile().describe()
    assert delivered_calls(desc) >= {"language", "quality", "dedup_near"}
    again = Plan.from_description(desc)
    assert all(m.options.keep_values for m in again.modules)
