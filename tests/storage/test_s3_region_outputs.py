"""The region grain's outputs on an object store: figures and content lists written beside
the ``.md`` through the job's one writer, kept by ``--resume`` only when all there, removed
by ``--overwrite``; the bucket checked from the outside (boto3)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from s3_tools import keys

from rayorch.pipelines.document.region_assemble import AssembleRegionDocument, assemble_page
from rayorch.pipelines.job.output import OutputDir
from rayorch.pipelines.job.pdf_outputs import PDF_WRITER

pytestmark = [pytest.mark.s3, pytest.mark.timeout(300)]

pytest.importorskip("obstore")

SOURCES = ["s3://in/a.pdf", "s3://in/b.pdf"]
PNG = b"\x89PNG\r\n\x1a\nfigure"


def document(index: int) -> dict[str, Any]:
    stem = f"doc{index}-00000000"
    blocks = [{"page": 1, "order": 0, "kind": "title", "bbox": [0.1, 0.1, 0.9, 0.2],
               "engine": "text-layer", "fallback": None, "text": f"Document {index}"},
              {"page": 1, "order": 1, "kind": "figure", "bbox": [0.1, 0.3, 0.9, 0.6],
               "engine": "crop", "fallback": None, "image": PNG}]
    meta = {"path": SOURCES[index], "title": "t", "page_count": 1, "figure_stem": stem}
    [value] = AssembleRegionDocument()([[assemble_page(blocks, 1, stem)]], [meta])
    return value


def deliver(url: str, indexes: list[int], **prepare: Any) -> OutputDir:
    out = OutputDir.prepare(url, job="pdf", sources=SOURCES, options={"ocr": "layout"},
                            **prepare)
    run = f"run-{len(out.marker['runs']) + 1}"
    sink = out.sink_for(run, PDF_WRITER)
    out.note_run(run)
    for index in indexes:
        sink.write_part(0, [(index, document(index))])
    out.finish(complete=True)
    return out


def test_figures_and_content_lists_on_s3_are_resumed_and_overwritten(
        s3_endpoint: str, bucket: str) -> None:
    url = f"s3://{bucket}/out"
    deliver(url, [0, 1])
    stored = sorted(k.removeprefix("out/") for k in keys(s3_endpoint, bucket, "out/"))
    wanted = ["00000-a.content_list.json", "00000-a.md", "00001-b.content_list.json",
              "00001-b.md", "figures/doc0-00000000-p1-1.png", "figures/doc1-00000000-p1-1.png"]
    assert [k for k in stored if k in wanted] == wanted
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    content = json.loads(client.get_object(Bucket=bucket, Key="out/00000-a.content_list.json")
                         ["Body"].read())
    assert [e["type"] for e in content] == ["title", "image"]
    client.delete_object(Bucket=bucket, Key="out/figures/doc1-00000000-p1-1.png")

    out = OutputDir.prepare(url, job="pdf", sources=SOURCES, options={"ocr": "layout"},
                            resume=True)
    assert sorted(out.kept) == [0]  # document 1 lost a figure: it runs again
    assert "out/00001-b.content_list.json" not in keys(s3_endpoint, bucket, "out/")
    out.finish(complete=True)

    deliver(url, [], overwrite=True)
    left = keys(s3_endpoint, bucket, "out/")
    assert not [k for k in left if k.startswith("out/figures/") or "content_list" in k], left
