"""``rayorch run pdf``'s model options for ``--ocr vllm`` and ``--ocr mineru``: ``--prompt
TEXT|@FILE``, ``--max-tokens``, ``--temperature`` reach the engine; a bad one is one line on
stderr and exit 2 before anything runs (no output directory, no Ray, no model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rayorch.cli import build_parser
from rayorch.cli import main as cli_main
from rayorch.pipelines.job.run_command import model_options, pdf_pipeline
from rayorch.pipelines.job.summary import EXIT_USAGE

PDF = Path(__file__).resolve().parents[2] / "examples" / "pdfs" / "qtree-qarrows.pdf"


def parsed(*argv: str) -> Any:
    return build_parser().parse_args(["run", "pdf", "--input", str(PDF), "--output", "out",
                                      *argv])


def options(*argv: str) -> dict[str, Any]:
    return model_options(parsed(*argv))


def refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI with ``argv``: it must exit 2, touch nothing and say why in one line."""
    out = tmp_path / "out"
    code = cli_main(["run", "pdf", "--input", str(PDF), "--output", str(out), *argv])
    err = capsys.readouterr().err.strip()
    assert code == EXIT_USAGE and not out.exists()
    assert len(err.splitlines()) == 1, err
    return err


def test_the_options_reach_the_vllm_engine_and_a_prompt_file_is_read(tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Transcribe this page.\n", encoding="utf-8")
    assert options("--ocr", "vllm", "--prompt", f"@{prompt}", "--max-tokens", "512",
                   "--temperature", "0.2") == {
        "prompt": "Transcribe this page.\n", "max_tokens": 512, "temperature": 0.2}
    assert options("--ocr", "vllm") == {}


def test_for_mineru_the_prompt_is_its_text_prompt_or_a_json_object_of_prompts(
        tmp_path: Path) -> None:
    assert options("--ocr", "mineru", "--prompt", "Read:") == {"prompts": {"text": "Read:"}}
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"layout": "Layout:", "table": "Table:"}))
    assert options("--ocr", "mineru", "--prompt", f"@{prompts}") == {
        "prompts": {"layout": "Layout:", "table": "Table:"}}
    assert set(options("--ocr", "mineru", "--test-regexes")["test_regexes"]) == {
        "layout", "text", "table", "equation"}


def test_the_pipelines_engine_gets_them_with_the_model() -> None:
    from rayorch.pipelines.pdf import PdfPipeline

    mineru = pdf_pipeline(parsed("--ocr", "mineru", "--model", "m", "--max-tokens", "9",
                                 "--temperature", "0.5", "--prompt", "Read:")).compile()
    assert dict(mineru.module("mineru").kwargs) == {
        "model": "m", "max_tokens": 9, "temperature": 0.5, "prompts": {"text": "Read:"}}
    vllm = pdf_pipeline(parsed("--ocr", "vllm", "--model", "v", "--prompt", "Page:")).compile()
    assert dict(vllm.module("ocr").kwargs) == {"model": "v", "prompt": "Page:"}
    with pytest.raises(Exception, match="temperature must be a number >= 0, not -1"):
        PdfPipeline("mineru", engine_options={"temperature": -1})


@pytest.mark.parametrize("argv, said", [
    (["--ocr", "vllm", "--prompt", "@no/such/prompt.txt"],
     "--prompt @no/such/prompt.txt: no such file"),
    (["--ocr", "vllm", "--prompt", "@."], "--prompt @.: a directory, not a file"),
    (["--ocr", "mineru", "--prompt", "   "], "--prompt is empty"),
    (["--ocr", "vllm", "--max-tokens", "-3"], "--max-tokens must be a positive number, not -3"),
    (["--ocr", "mineru", "--max-tokens", "0"], "--max-tokens must be a positive number, not 0"),
    (["--ocr", "vllm", "--temperature", "nan"], "--temperature must be a number >= 0, not nan"),
    (["--ocr", "mineru", "--temperature", "-0.1"],
     "--temperature must be a number >= 0, not -0.1"),
    (["--ocr", "mineru", "--temperature", "inf"], "--temperature must be a number >= 0, not inf"),
    (["--ocr", "auto", "--prompt", "x"], "--prompt goes with --ocr vllm or --ocr mineru, "
                                         "not --ocr auto"),
    (["--ocr", "layout", "--temperature", "0.3"], "--temperature goes with --ocr vllm"),
    (["--ocr", "vllm", "--test-regexes"], "--test-regexes goes with --ocr mineru"),
    (["--ocr", "mineru", "--prompt", '{"chart": "x"}'], "unknown MinerU prompt 'chart'"),
    (["--ocr", "mineru", "--prompt", '{"text": 3}'], "the MinerU prompt 'text' is not a "
                                                      "non-empty text"),
    (["--ocr", "mineru", "--prompt", "{}"], "not a JSON object of prompts"),
    (["--ocr", "mineru", "--prompt", '{"text": '], "not a JSON object of prompts"),
])
def test_a_bad_model_option_is_one_line_and_exit_2_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], said: str) -> None:
    assert said in refused(tmp_path, capsys, *argv)


def test_without_mineru_vl_utils_the_mineru_pipeline_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from rayorch.pipelines.pdf import PdfPipeline

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mineru_vl_utils" else real(name, *a))
    with pytest.raises(Exception, match=r"needs mineru-vl-utils .*pip install 'rayorch\[model\]'"):
        PdfPipeline("mineru", engine_options={"model": "m"})
