"""The page viewer in a real headless Chromium: a region-grain run on real Ray
(rayorch/testing_pages.py: layout from the PDF's text layer, hostile markup in its text),
served by ``rayorch ui``'s server. The page image loads, each region is a box drawn on it
with its reading order, the extracted text beside it is inert, and a click on a region
leads to its lineage."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

playwright_api = pytest.importorskip("playwright.sync_api")
pytest.importorskip("pymupdf")

CHROMIUM = os.environ.get("RAYORCH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``(base URL, run id)`` of a finished region run's web view."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    from rayorch.runtime.ray_cluster import ensure_ray
    from rayorch.store import open_store
    from rayorch.testing_pages import TextLayoutPipeline, write_pdf
    from rayorch.ui import UiServer

    ensure_ray("local", num_cpus=4, log_to_driver=False)
    pdf = write_pdf(tmp_path_factory.mktemp("viewer") / "report.pdf")
    url = f"memory://page-viewer-{os.getpid()}?keep=all"  # regions drawn after delivery
    store = open_store(url)
    handle = TextLayoutPipeline().run([str(pdf)], store=url, quiet=True, progress=False)
    assert len(handle.outputs) == 1
    try:
        with UiServer(store) as server:
            yield server.url.rstrip("/"), handle.run_id
    finally:
        store.close()
        import ray

        ray.shutdown()  # each module starts the Ray it needs (the next one wants 8 CPUs)


def test_a_page_shows_its_regions_on_its_image_and_a_click_leads_to_lineage(
        served: tuple[str, str]) -> None:
    base, run_id = served
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1280, "height": 900})
        dialogs: list[str] = []
        tab.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        tab.goto(f"{base}/runs/{run_id}/sources/0")
        tab.click("#page-viewer")
        tab.wait_for_url(f"**/runs/{run_id}/pages/0.0")
        tab.wait_for_function("document.getElementById('page-image').naturalWidth > 0")
        image = tab.locator("#page-image").bounding_box()
        assert image is not None and image["width"] > 300
        boxes: list[Any] = [tab.locator("rect.region").nth(i).bounding_box() for i in range(3)]
        assert tab.locator("rect.region").count() == 3
        for box in boxes:  # drawn on the page, top to bottom in reading order
            assert box is not None and box["width"] > 10
            assert image["x"] <= box["x"] and box["x"] + box["width"] <= image["x"] + image[
                "width"] + 1
        assert [b["y"] for b in boxes] == sorted(b["y"] for b in boxes)
        assert tab.locator("text.region-order").all_text_contents() == ["0", "1", "2"]
        middle = tab.locator("#region-1 pre.extracted").inner_text()
        assert 'alert("x")' in middle and "<img src=x" in middle  # shown as text, not run
        assert tab.evaluate("document.querySelectorAll('main img').length") == 1
        tab.locator("a.region-link").nth(1).click()
        tab.wait_for_url(f"**/runs/{run_id}/sources/0.0.1")
        shot = os.environ.get("RAYORCH_UI_SCREENSHOTS")
        if shot:
            tab.go_back()
            tab.wait_for_function("document.getElementById('page-image').naturalWidth > 0")
            tab.screenshot(path=str(Path(shot) / "ui-page.png"), full_page=True)
            tab.go_forward()
        assert "recognise" in tab.content()
        assert not dialogs, dialogs
        browser.close()
