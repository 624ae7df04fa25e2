"""The web view (``rayorch ui``) in a real headless Chromium, driven by Playwright.

A real run on a local Ray (documents -> pages -> regions, a slow region OCR whose pool sizes
itself, one region failing with a cause that holds script and HTML) is served with
``Pipeline.run(ui=True)``. The tests watch its progress change on screen while it runs, then
drill from the failure count to the failed document's cause and attempts, check the hostile
cause renders inert, read the pool sizes' chart and table (a hostile reason inert too), and
follow a document through its pages. Chromium is Debian's (``/usr/bin/chromium``, or
``$RAYORCH_CHROMIUM``); Playwright downloads no browser. ``bash scripts/test_browser.sh``;
``RAYORCH_UI_SCREENSHOTS=docs`` also writes the three pages' screenshots there.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rayorch as ro
from rayorch import F
from rayorch.core.pool_sizing import SizingSettings

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

ray = pytest.importorskip("ray")
playwright_api = pytest.importorskip("playwright.sync_api")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

CHROMIUM = os.environ.get("RAYORCH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
HOSTILE = ('<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
           '"><b>bold</b>')
DOCS = [(f"doc{i}", 3) for i in range(10)]
BAD_REGION = (4, 1, 1)  # doc4, page 1, region 1: its OCR fails with the hostile cause


class Render:
    def __call__(self, docs: list[Any]) -> list[Any]:
        return [[f"{name}/p{p}" for p in range(pages)] for name, pages in docs]


class Layout:
    def __call__(self, pages: list[str]) -> list[Any]:
        return [[f"{page}/r{r}" for r in range(2)] for page in pages]


class Ocr:
    def __call__(self, regions: list[str]) -> list[Any]:
        time.sleep(0.25)  # slow enough to watch
        out: list[Any] = []
        for region in regions:
            doc, page, reg = region.split("/")
            if (int(doc[3:]), int(page[1:]), int(reg[1:])) == BAD_REGION:
                out.append(ro.RecordFailure(HOSTILE))
            else:
                out.append(f"text of {region}")
        return out


class Join:
    def __call__(self, parts: list[list[str]]) -> list[str]:
        return [" | ".join(p) for p in parts]


class Documents(ro.Pipeline):
    def __init__(self) -> None:
        super().__init__()
        self.render = ro.RayModule(Render, batch_size=2)
        self.layout = ro.RayModule(Layout, batch_size=4)
        self.ocr = ro.RayModule(Ocr, batch_size=2, replicas=(1, 2))  # sizes itself
        self.page_text = ro.RayModule(Join)
        self.doc_text = ro.RayModule(Join)

    def forward(self, docs: Any) -> Any:
        pages = F.expand(self.render(docs))
        regions = F.expand(self.layout(pages))
        page_text = self.page_text(F.reduce(self.ocr(regions)))
        return self.doc_text(F.reduce(page_text))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def run(browser: Any) -> Iterator[dict[str, Any]]:
    """The run, started with ``ui=True``; its store held open after it ends."""
    from rayorch.runtime.ray_cluster import ensure_ray
    from rayorch.store import open_store

    # A loaded CI machine may take its time to start five actors (and replace one).
    os.environ.setdefault("RAYORCH_ACTOR_START_TIMEOUT_S", "300")
    ensure_ray("local", num_cpus=8, log_to_driver=False)  # logical CPUs: 5 actors
    url = f"memory://web-view-{os.getpid()}"
    kept = open_store(url)  # the store outlives the run while this holds it
    sizing = SizingSettings(interval_s=1.0, backlog_s=1.0, idle_limit_s=2.0,
                            start_cost_factor=0.0)  # decisions within this short run
    handle = Documents().run(DOCS, store=url, ordered=False, progress=False, ui=True,
                             pool_sizing=sizing)
    results: list[Any] = []
    consumer = threading.Thread(target=lambda: results.extend(handle), daemon=True)
    consumer.start()
    try:
        yield {"handle": handle, "store": kept, "live_url": handle.ui.url,
               "consumer": consumer, "results": results}
    finally:
        consumer.join(timeout=120)
        kept.close()
        import ray

        ray.shutdown()


@pytest.fixture(scope="module")
def after(run: dict[str, Any]) -> Iterator[str]:
    """A web view of the kept store once the run is over: its base URL."""
    from rayorch.store.scripted_run import write_scripted_run
    from rayorch.ui import UiServer

    run["consumer"].join(timeout=120)
    assert len(run["results"]) == len(DOCS)
    write_scripted_run(run["store"], "scripted-earlier")  # more rows for the runs page
    write_scripted_run(run["store"], "scripted-abandoned", complete=False, pages=(4, 2, 7))
    with UiServer(run["store"]) as server:
        yield server.url


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    dialogs: list[str] = []
    tab.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    yield tab
    assert not dialogs, f"a script from the store ran: {dialogs}"
    context.close()


def shot(tab: Any, name: str) -> None:
    target = os.environ.get("RAYORCH_UI_SCREENSHOTS")
    if target:
        tab.screenshot(path=str(Path(target) / name), full_page=True)


def test_a_running_runs_progress_changes_on_screen(run: dict[str, Any], page: Any) -> None:
    handle = run["handle"]
    page.goto(f"{run['live_url']}runs/{handle.run_id}")
    done = page.locator("#sources-done")
    first = done.inner_text().split("/")[0].strip()  # sources done ("N / total")
    assert page.locator("#live").get_attribute("data-live") == "true"
    # No reload: the page's poller swaps in new numbers while the run goes on. (The count
    # done, not the whole text: "0 / 0 admitted" becoming "0 / 10" is no source done.)
    page.wait_for_function(
        "first => document.querySelector('#sources-done').textContent.split('/')[0].trim()"
        " !== first", arg=first, timeout=60_000)
    assert page.locator("#poll-state").inner_text().startswith("live")
    lines = page.locator("#progress-chart polyline.series")
    assert lines.count() == 2 and int(lines.nth(1).get_attribute("data-last") or 0) > 0


def test_from_the_failure_count_to_a_failed_documents_cause_and_attempts(
        after: str, run: dict[str, Any], page: Any) -> None:
    run_id = run["handle"].run_id
    page.goto(f"{after}runs/{run_id}")
    assert page.locator("#run-state").inner_text() == "complete"
    shot(page, "ui-run.png")
    page.locator("a.failure-count").first.click()
    assert page.locator("pre#group-cause").inner_text() == HOSTILE
    page.locator("a.source-link").first.click()  # the document
    assert page.locator("h1 .entity-id").inner_text() == "4"
    assert "suppressed" in page.locator("p.emitted").inner_text()
    page.locator("tr.child.failed a").first.click()  # its failed page
    assert page.locator("h1 .entity-id").inner_text() == "4.1"
    page.locator("tr.child.failed a").first.click()  # its failed region
    assert page.locator("h1 .entity-id").inner_text() == "4.1.1"
    row = page.locator('tr.grain[data-grain="ocr[4.1.1]"]')
    assert row.locator("td.outcome").inner_text() == "record failure"
    assert row.locator("td.cause").inner_text() == HOSTILE
    assert "attempt 0: committed" in row.locator("ol.attempts").inner_text()


def test_a_hostile_cause_renders_inert(after: str, run: dict[str, Any], page: Any) -> None:
    run_id = run["handle"].run_id
    for path in (f"runs/{run_id}", f"runs/{run_id}/sources/4.1.1"):
        page.goto(after + path)
        assert page.evaluate("window.__pwned") is None
        assert page.locator("img").count() == 0 and page.locator("td.cause b").count() == 0
        assert HOSTILE[:30] in page.locator("td.cause").first.inner_text()
    page.locator("a.failure-count").count()  # nothing ran meanwhile
    assert page.evaluate("window.__pwned") is None


def test_follow_a_document_through_its_pages(after: str, run: dict[str, Any],
                                             page: Any) -> None:
    run_id = run["handle"].run_id
    page.goto(after)
    shot(page, "ui-runs.png")
    page.locator(f'tr[data-run="{run_id}"] a').first.click()
    page.locator("p.links a", has_text="sources").click()
    page.locator('tr[data-source="2"] a').click()
    assert page.locator("h1 .entity-id").inner_text() == "2"
    assert "present" in page.locator("p.emitted").inner_text()
    children = page.locator("tr.child")
    assert [children.nth(i).get_attribute("data-entity") for i in range(3)] == \
        ["2.0", "2.1", "2.2"]
    shot(page, "ui-source.png")
    page.locator('tr.child[data-entity="2.1"] a').first.click()
    assert page.locator("h1 .entity-id").inner_text() == "2.1"
    assert page.locator('tr.grain[data-grain="layout[2.1]"] td.outcome').inner_text() \
        == "present"
    page.locator('tr.child[data-entity="2.1.0"] a').first.click()
    assert page.locator('tr.grain[data-grain="ocr[2.1.0]"] td.outcome').inner_text() \
        == "present"
    page.locator("nav.crumbs").get_by_role("link", name="2", exact=True).click()  # back up
    assert page.locator("h1 .entity-id").inner_text() == "2"


def test_the_pool_sizes_chart_and_table_with_a_hostile_reason_inert(
        after: str, run: dict[str, Any], page: Any) -> None:
    """The run page draws the ocr pool's size over time from the run's pool log (what the
    driver recorded, and one more record with a reason that holds script and HTML)."""
    from rayorch.store.records import PoolChange

    handle = run["handle"]
    recorded = list(handle.pool_sizer.history) if handle.pool_sizer else []
    last = recorded[-1].after if recorded else 1
    run["store"].record_pool_sizes(handle.run_id, [PoolChange(
        0.0, "ocr", last, last, HOSTILE, time.time(),
        recorded[-1].driver if recorded else "d").encode()])
    page.goto(f"{after}runs/{handle.run_id}")
    assert page.locator("#pool-chart polyline.series").count() >= 1
    rows = page.locator("#pool-changes tr.pool-change")
    assert rows.count() == len(recorded) + 1
    assert rows.last.locator("td.reason").inner_text() == HOSTILE
    assert page.locator("#pools img").count() == 0
    assert page.locator("#pool-changes b").count() == 0  # HOSTILE's <b> is text
    assert page.locator("#pool-chart circle.dot title").last.text_content() \
        .endswith(f" {last} -> {last}: {HOSTILE}")  # the hover text, as text
    assert page.evaluate("window.__pwned") is None
