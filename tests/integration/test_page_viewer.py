"""The page viewer (``rayorch ui``, ``/runs/RUN/pages/SOURCE.PAGE``) over a real run of the
region grain: ``PdfPipeline.regions`` on real Ray with a layout read from the PDF's own text
layer (lines grouped into bands: the layout models are the layout suite's), on a PDF whose
text is hostile markup. The page image is rendered from the source; every region is drawn
with its reading order and links to its lineage; what each read is beside it, inert."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rayorch.store.registry import open_store
from rayorch.testing_pages import TextLayoutPipeline, write_pdf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
pytest.importorskip("pymupdf")
pytest.importorskip("starlette")


def test_the_viewer_draws_each_region_on_the_page_and_links_its_lineage(
        ray_local: None, tmp_path: Path) -> None:
    pdf = write_pdf(tmp_path / "report.pdf")
    url = f"memory://viewer-{id(pdf)}?keep=all"  # regions drawn from values after delivery
    store = open_store(url)
    handle = TextLayoutPipeline().run([str(pdf)], store=url, quiet=True)
    [document] = handle.outputs
    assert "Revenue rose" in document["markdown"]
    from starlette.testclient import TestClient

    from rayorch.ui.app import build_app

    client = TestClient(build_app(store))
    page = client.get(f"/runs/{handle.run_id}/pages/0.1")
    assert page.status_code == 200, page.text
    text = page.text
    assert "<script>alert" not in text and "<img src=x" not in text
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in text  # read, shown inert
    rects = re.findall(r'<rect class="region kind-(\w+)[^"]*" data-order="(\d+)" '
                       r'x="([\d.]+)" y="([\d.]+)"', text)
    assert [(kind, int(order)) for kind, order, _, _ in rects] == [
        ("title", 0), ("text", 1), ("text", 2)]
    assert [float(y) for *_, y in rects] == sorted(float(y) for *_, y in rects)
    assert 0 < float(rects[0][3]) < 200 < float(rects[2][3]) <= 1000  # boxes on 0..1000
    assert "page 2 of 2" in text and 'id="prev-page"' in text and 'id="next-page"' not in text
    assert "3 regions from the facts" in text
    links = re.findall(r'<a href="(/runs/[^"]+/sources/0\.1\.\d)" class="region-link">', text)
    assert len(links) == 3
    lineage = client.get(links[1])
    assert lineage.status_code == 200 and "recognise" in lineage.text
    source = client.get(f"/runs/{handle.run_id}/sources/0").text
    assert f'id="page-viewer" href="/runs/{handle.run_id}/pages/0.0"' in source
    image = client.get(f"/runs/{handle.run_id}/pages/0.1/image.png")
    assert image.status_code == 200 and image.content.startswith(b"\x89PNG")
    assert client.get(f"/runs/{handle.run_id}/pages/0.7/image.png").status_code == 404
    assert client.get(f"/runs/{handle.run_id}/pages/0").status_code == 404  # not a page
    assert "Traceback" not in client.get(f"/runs/{handle.run_id}/pages/x.y").text
    store.close()
