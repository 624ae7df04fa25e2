"""The PDF pipeline on real Ray over real PDFs: Debian's texlive-humanities-doc corpus,
the shipped ``examples/pdfs`` and bad files generated here.

One Ray instance for the module (``ray_local``), one clean run on the memory store as
the baseline; every other run (an OCR actor SIGKILLed mid-run, the Redis store, the
``rayorch run pdf`` command) must give the same documents and the same causes.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import rayorch as ro
from rayorch.cli import EXIT_OK
from rayorch.cli import main as cli_main
from rayorch.core.facts import GrainRetried
from rayorch.core.machine import item_result
from rayorch.core.outcome import FailedResult, Outcome
from rayorch.core.reference import evaluate
from rayorch.pipelines.document.render import TEXT_FLAGS
from rayorch.pipelines.job.cli import EXIT_FAILED
from rayorch.pipelines.pdf import (
    OcrPage,
    PdfPipeline,
    RenderPages,
    failure_kind,
    find_pdfs,
)
from rayorch.store.registry import open_store
from rayorch.testing import shared_share, text_words

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

pymupdf: Any = pytest.importorskip("pymupdf")  # the [pdf] extra
# Ray workers cannot import this test module by name: ship its classes by value.
ray_cloudpickle = pytest.importorskip("ray.cloudpickle")
ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "pdfs"
CORPUS_PACKAGE = "texlive-humanities-doc"
CORPUS_CACHE = REPO / ".cache" / "corpus"
CORPUS_PICK = 22
CORPUS_MAX_PAGES = 30  # per PDF; the 22 picked hold ~160 pages
BAD_KINDS = {"corrupt.pdf": "damaged", "truncated.pdf": "truncated",
             "notes.pdf": "not a PDF", "zero-pages.pdf": "no pages"}


# -- inputs ---------------------------------------------------------------------------
def corpus_manifest() -> dict[str, Any]:
    """The cached corpus manifest, fetched with ``scripts/fetch_corpus.py`` if missing."""
    manifest = CORPUS_CACHE / CORPUS_PACKAGE / "manifest.json"
    if not manifest.exists():
        if shutil.which("apt-get") is None:
            pytest.skip(f"{CORPUS_PACKAGE} is not cached and apt-get is not available")
        fetch = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "fetch_corpus.py"),
             "--cache-dir", str(CORPUS_CACHE), "--packages", CORPUS_PACKAGE],
            capture_output=True, text=True, timeout=600, check=False,
        )
        assert fetch.returncode == 0, f"fetching the corpus failed: {fetch.stderr[-500:]}"
    loaded: dict[str, Any] = json.loads(manifest.read_text())
    return loaded


def pick_corpus(manifest: dict[str, Any]) -> list[str]:
    """``CORPUS_PICK`` small PDFs spread evenly over the page counts (a stable choice)."""
    small = sorted(
        (e for e in manifest["pdfs"] if 1 <= e["pages"] <= CORPUS_MAX_PAGES),
        key=lambda e: (e["pages"], e["file"]),
    )
    assert len(small) >= CORPUS_PICK, f"only {len(small)} small PDFs in {CORPUS_PACKAGE}"
    step = (len(small) - 1) / (CORPUS_PICK - 1)
    return [small[round(i * step)]["file"] for i in range(CORPUS_PICK)]


def zero_page_pdf() -> bytes:
    """A well-formed PDF (valid xref and trailer) whose page tree has no pages."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [] /Count 0 >>"]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 3\n0000000000 65535 f \n"
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size 3 /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


def write_bad_pdfs(target: Path) -> None:
    """Corrupt (bytes overwritten mid-file), truncated, non-PDF and zero-page files."""
    target.mkdir()
    good = (EXAMPLES / "gb4e-doc.pdf").read_bytes()
    corrupt = bytearray(good)
    rng = random.Random(7)
    for i in range(len(good) // 4, len(good) // 2, 53):  # header, xref and %%EOF stay intact
        corrupt[i] = rng.randrange(256)
    (target / "corrupt.pdf").write_bytes(bytes(corrupt))
    (target / "truncated.pdf").write_bytes(good[: len(good) // 2])
    (target / "notes.pdf").write_bytes(b"this is plain text, not a PDF\n" * 40)
    (target / "zero-pages.pdf").write_bytes(zero_page_pdf())


@pytest.fixture(scope="module")
def input_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """corpus/ (22 real PDFs), examples/ (the shipped ones) and bad/ (4 generated)."""
    picked = pick_corpus(corpus_manifest())
    root = tmp_path_factory.mktemp("pdf-inputs")
    (root / "corpus").mkdir()
    for name in picked:
        shutil.copyfile(CORPUS_CACHE / CORPUS_PACKAGE / name, root / "corpus" / name)
    shutil.copytree(EXAMPLES, root / "examples", ignore=shutil.ignore_patterns("*.md"))
    write_bad_pdfs(root / "bad")
    return root


@pytest.fixture(scope="module")
def sources(input_dir: Path) -> list[str]:
    found = find_pdfs(input_dir)
    assert len(found) >= CORPUS_PICK + len(BAD_KINDS) + 1
    return found


def is_bad(path: str) -> bool:
    return Path(path).parent.name == "bad"


# -- the baseline: a clean run on the memory store -------------------------------------
def run_documents(pipeline: ro.Pipeline, sources: list[str], store: str) -> tuple[Any, list[Any]]:
    run = pipeline.run(sources, store=store, progress=False, quiet=True)
    got = list(run)
    assert [i for i, _ in got] == list(range(len(sources)))  # ordered: source order
    return run, [value for _, value in got]


@pytest.fixture(scope="module")
def clean(ray_local: None, sources: list[str]) -> list[Any]:
    _, values = run_documents(
        PdfPipeline("text", replicas=2), sources, f"memory://pdf-clean-{os.getpid()}"
    )
    return values


def page_sections(markdown: str) -> list[tuple[int, str, str]]:
    """``(page number, engine, text)`` per ``<!-- page N engine=E -->`` section."""
    parts = re.split(r"<!-- page (\d+) engine=(\w+) -->", markdown)
    return [(int(n), engine, text)
            for n, engine, text in zip(parts[1::3], parts[2::3], parts[3::3])]


@pytest.mark.long
def test_pages_in_pymupdf_order_and_bad_inputs_fail_alone(
    sources: list[str], clean: list[Any]
) -> None:
    good = 0
    for index, (path, value) in enumerate(zip(sources, clean)):
        if is_bad(path):
            assert isinstance(value, FailedResult), (path, value)
            assert value.outcome is Outcome.SUPPRESSED and value.cause is not None
            # The render failure of this document, on one line, naming this file only.
            assert value.cause.startswith(f"render[{index}] failed: "), value.cause
            assert failure_kind(value.cause) == BAD_KINDS[Path(path).name], value.cause
            assert "\n" not in value.cause and path in value.cause
            assert not any(other in value.cause for other in sources if other != path)
            continue
        assert isinstance(value, dict), (path, value)
        good += 1
        assert value["path"] == path
        with pymupdf.open(path) as doc:
            expected = text_words("\n".join(page.get_text(flags=TEXT_FLAGS) for page in doc))
            count = doc.page_count
        sections = page_sections(value["markdown"])
        assert value["pages"] == count
        assert [n for n, _, _ in sections] == list(range(1, count + 1))
        assert {engine for _, engine, _ in sections} <= {"text", "blank"}
        # PyMuPDF's words, less page numbers and hyphenated halves joined again.
        # The title is the document's "#" (page 1's title lines are not repeated on the page).
        got = text_words("\n".join([value["title"], *(text for _, _, text in sections)]))
        recall, precision = shared_share(expected, got)
        assert recall >= 0.97 and precision >= 0.97, (path, recall, precision)
    assert good == len(sources) - len(BAD_KINDS)


def test_reference_interpreter_gives_the_same_documents_and_causes(
    sources: list[str], clean: list[Any]
) -> None:
    plan = PdfPipeline("text").compile()
    outputs = evaluate(plan, [(p,) for p in sources]).outputs
    expected = [item_result(i, outputs[i], plan.output_names) for i in range(len(sources))]
    assert expected == clean


# -- an OCR actor SIGKILLed mid-run ----------------------------------------------------
class OcrPageKilledOnce(OcrPage):
    """``OcrPage`` whose actor SIGKILLs itself on its ``kill_at``-th batch, once per run
    (a marker file, created atomically, keeps the replacement and the other replica alive)."""

    def __init__(self, engine: str, *, marker_dir: str, kill_at: int = 4) -> None:
        super().__init__(engine)
        self.marker = Path(marker_dir) / "ocr-killed"
        self.kill_at = kill_at
        self.batches = 0

    def __call__(self, pages: list[Any]) -> list[Any]:
        self.batches += 1
        if self.batches == self.kill_at:
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
        return super().__call__(pages)


class EveryPageThroughOcr(PdfPipeline):
    """Every page rendered (a tiny PNG) and read by the text-layer engine in 2 OCR actors,
    so each page is one OCR Grain; with ``marker_dir`` one OCR actor SIGKILLs itself."""

    def __init__(self, marker_dir: str | None = None) -> None:
        super().__init__("text", replicas=2)
        self.render = ro.RayModule(RenderPages, needs_image=True, dpi=8, num_outputs=3,
                                   batch_size=2, num_cpus=1.0)
        if marker_dir is not None:
            self.ocr = ro.RayModule(
                OcrPageKilledOnce, "text", marker_dir=marker_dir, batch_size=16, replicas=2,
                num_cpus=0.25,
            )


@pytest.mark.long
def test_ocr_actor_sigkilled_mid_run_changes_no_output(
    sources: list[str], tmp_path: Path
) -> None:
    plan = EveryPageThroughOcr().compile()
    outputs = evaluate(plan, [(p,) for p in sources]).outputs
    expected = [item_result(i, outputs[i], plan.output_names) for i in range(len(sources))]
    url = f"memory://pdf-kill-{os.getpid()}-{time.monotonic_ns()}"
    held = open_store(url)  # a memory store lives while it is open: read after the run
    run, values = run_documents(EveryPageThroughOcr(str(tmp_path)), sources, url)
    assert (tmp_path / "ocr-killed").exists(), "the OCR actor was never killed"
    assert values == expected
    retried = [s.fact for s in open_store(url).iter_facts(run.run_id, 0)
               if isinstance(s.fact, GrainRetried) and s.fact.call == "ocr"]
    assert retried and all("died" in f.cause for f in retried), retried
    assert run.stats.call("ocr").retried == len(retried)
    held.close()


# -- the Redis store, then ``rayorch audit`` on it -------------------------------------
def test_redis_run_matches_memory_run_and_passes_audit(
    sources: list[str], clean: list[Any], redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run, values = run_documents(PdfPipeline("text", replicas=2), sources, redis_url)
    assert values == clean
    capsys.readouterr()
    assert cli_main(["audit", run.run_id, "--store", redis_url]) == EXIT_OK
    assert f"run {run.run_id}: OK" in capsys.readouterr().out


# -- ``rayorch run pdf`` end to end ----------------------------------------------------
@pytest.mark.long
def test_run_pdf_command_writes_documents_and_counts_failures(
    input_dir: Path, sources: list[str], clean: list[Any], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out"
    capsys.readouterr()
    argv = ["run", "pdf", "--input", str(input_dir), "--output", str(out), "--ocr", "text",
            "--no-progress", "--json"]
    assert cli_main(argv) == EXIT_FAILED  # the bad files failed
    assert cli_main([*argv, "--overwrite", "--allow-failures"]) == EXIT_OK
    first, second = capsys.readouterr().out.split("\n}\n", 1)
    assert json.loads(first + "}")["failed"] == len(BAD_KINDS)
    summary = json.loads(second)
    good = [i for i, p in enumerate(sources) if not is_bad(p)]
    assert summary["documents"] == len(sources)
    assert summary["succeeded"] == len(good)
    assert summary["failed"] == len(BAD_KINDS)
    assert summary["failures"] == {kind: 1 for kind in sorted(BAD_KINDS.values())}
    assert summary["pages"] == sum(clean[i]["pages"] for i in good)

    rows = [json.loads(line) for line in (out / "documents.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == list(range(len(sources)))
    failed = [r for r in rows if r["status"] == "failed"]
    assert len(failed) == len(BAD_KINDS)
    assert all(r["cause"] == clean[r["id"]].cause and r["source"] == sources[r["id"]]
               for r in failed)
    assert sorted(p.name for p in out.glob("*.md")) == sorted(
        r["markdown"] for r in rows if r["status"] == "ok"
    )
    for row in rows:
        if row["status"] == "ok":
            assert (out / row["markdown"]).read_text() == clean[row["id"]]["markdown"]
