"""The web view's routes (``rayorch ui``) over a memory store: pages, escaping, 404s, token.

The browser tests (``tests/browser``, ``bash scripts/test_browser.sh``) drive the same app in
Chromium during a real run; these stay fast for the default suite.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")
from starlette.testclient import TestClient

from rayorch.core.facts import (
    REPORT_PRESENT,
    REPORT_RECORD_FAILURE,
    GrainCommitted,
    GrainDispatched,
    OutputEmitted,
    SourceAdmitted,
)
from rayorch.core.plan import Plan
from rayorch.store import open_store
from rayorch.store.base import LineageStore
from rayorch.store.scripted_run import scripted_plan, write_scripted_run
from rayorch.ui.app import TOKEN_COOKIE, build_app

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


@pytest.fixture
def store() -> Iterator[LineageStore]:
    lineage = open_store("memory://?keep=all")  # drops and pages read values after delivery
    try:
        write_scripted_run(lineage, "done")
        write_scripted_run(lineage, "half", complete=False, pages=(2, 3))
        yield lineage
    finally:
        lineage.close()


def write_hostile(store: LineageStore) -> None:
    """A source whose input, OCR failure cause, driver and sink are HTML and script."""
    store.open_run("evil", scripted_plan())
    epoch = store.acquire_lease("evil", 0, HOSTILE, ttl_s=60)
    store.heartbeat("evil", HOSTILE, ttl_s=60)
    store.append("evil", 0, epoch, [SourceAdmitted(0, (HOSTILE,), key=HOSTILE, ts=1.0),
                                    GrainDispatched("render", (0,), 0, ts=1.5)],
                 driver=HOSTILE)
    store.commit("evil", [GrainCommitted("render", (0,), 0, REPORT_RECORD_FAILURE,
                                         cause=HOSTILE, ts=2.0)])
    store.append("evil", 0, epoch, [OutputEmitted(0, "failed", sink=HOSTILE, ts=2.5)],
                 driver=HOSTILE)


def test_every_page_of_a_run_renders_from_its_view(store: LineageStore) -> None:
    client = TestClient(build_app(store))
    runs = client.get("/")
    assert runs.status_code == 200 and 'href="/runs/done"' in runs.text
    assert "complete" in runs.text and "abandoned" in runs.text  # half: no lease, no driver
    run = client.get("/runs/done")
    assert run.status_code == 200 and 'id="progress-chart"' in run.text
    assert "corrupt document" in run.text and "unreadable page" in run.text  # by cause
    assert re.search(r'<td class="num" title="replicas x batch size[^"]*">1 &times; 64', run.text)
    keys = re.findall(r'href="/runs/done/failures/([0-9a-f]{16})"', run.text)
    group = client.get(f"/runs/done/failures/{keys[0]}")
    assert group.status_code == 200 and 'class="source-link"' in group.text
    source = client.get("/runs/done/sources/3")  # a retry, a GroupFailure, a barrier
    assert "(2 attempts)" in source.text and "suppressed" in source.text
    assert 'href="/runs/done/sources/3.1"' in source.text  # its pages
    page = re.sub(r"\s+", " ", re.sub(r"<[^>]+>|&mdash;", "", client.get(
        "/runs/done/sources/3.0").text))
    assert "attempt 0: lost after" in page and "worker crashed" in page
    assert "attempt 1: barred corrupt document" in page
    page = client.get("/runs/done/sources/0.1")
    assert "record failure" in page.text and "unreadable page" in page.text
    for url in ("/runs/done/sources", "/runs/done/sources?only=failed&page=2",
                "/runs/done/timeline", "/runs/done/audit", "/runs/half"):
        assert client.get(url).status_code == 200, url
    deadline = time.monotonic() + 30  # the audit runs on a thread; the page says so
    while 'id="audit-verdict">running' in (audit := client.get("/runs/done/audit").text) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert 'id="audit-verdict">OK' in audit


def test_values_from_the_store_are_shown_inert(store: LineageStore) -> None:
    write_hostile(store)
    client = TestClient(build_app(store))
    for url in ("/runs/evil", "/runs/evil/sources", "/runs/evil/sources/0"):
        response = client.get(url)
        assert response.status_code == 200
        assert "<script>alert" not in response.text and "<img src=x" not in response.text
        assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in response.text, url
        assert "script-src 'self'" in response.headers["content-security-policy"]


def test_every_page_reachable_from_the_index_shows_store_text_inert(
        store: LineageStore) -> None:
    """Crawl the web view from ``/`` (every link, every page of every run): no page renders
    the hostile input or failure cause as markup, and the pages that show them escape them."""
    write_hostile(store)
    client = TestClient(build_app(store))
    seen: set[str] = set()
    todo = ["/"]
    escaped = "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;"
    shown: set[str] = set()
    while todo and len(seen) < 400:
        url = todo.pop()
        if url in seen:
            continue
        seen.add(url)
        response = client.get(url)
        assert response.status_code == 200, url
        assert "<script>alert" not in response.text and "<img src=x" not in response.text, url
        if escaped in response.text:
            shown.add(url.split("?")[0].rsplit("/", 1)[0])
        for link in re.findall(r'href="(/[^"#]*)"', response.text):
            if not link.startswith("/static/"):
                todo.append(link.replace("&amp;", "&"))
    assert any("/runs/evil/failures/" in u for u in seen), sorted(seen)
    # the cause on its failures page, the input and cause on the run's and source's pages
    assert {"/runs/evil/failures", "/runs/evil/sources", "/runs"} <= shown, shown


def test_a_drop_shows_its_stage_and_reason_inert(store: LineageStore) -> None:
    """A source a data-quality stage dropped: the run page counts drops by reason, the
    source page says which stage dropped it and why (store text escaped)."""
    store.open_run("dedup", scripted_plan())
    epoch = store.acquire_lease("dedup", 0, "d", ttl_s=60)
    store.append("dedup", 0, epoch, [SourceAdmitted(0, ("b.pdf",), ts=1.0),
                                     GrainDispatched("render", (0,), 0, ts=1.5)], driver="d")
    verdict = {"stage": "dedup_text", "keep": False, "reason": "duplicate", "kept": HOSTILE}
    store.commit("dedup", [GrainCommitted("render", (0,), 0, "present",
                                          outputs=(False, verdict), ts=2.0)])
    store.append("dedup", 0, epoch, [OutputEmitted(0, "dropped", ts=2.5)], driver="d")
    client = TestClient(build_app(store))
    run = client.get("/runs/dedup").text
    assert re.search(r'id="dropped-sources">dedup_text: duplicate: 1<', run), run
    source = client.get("/runs/dedup/sources/0").text
    assert "dropped by render (stage dedup_text): duplicate (kept: " in source
    assert HOSTILE not in source and "&lt;script&gt;" in source


def test_a_bad_or_missing_run_is_a_clear_page(store: LineageStore) -> None:
    client = TestClient(build_app(store))
    missing = client.get("/runs/nope")
    assert missing.status_code == 404 and "not found in the lineage store" in missing.text
    hostile = client.get("/runs/%3Cscript%3Ex")
    assert hostile.status_code == 404 and "<script>x" not in hostile.text
    assert client.get("/runs/done/sources/abc").status_code == 404
    assert "has no source 99" in client.get("/runs/done/sources/99").text
    assert client.get("/runs/done/failures/0123456789abcdef").status_code == 404
    assert client.post("/runs/done").status_code == 405  # read-only
    assert "Traceback" not in missing.text


def test_a_token_guards_every_request_when_given(store: LineageStore) -> None:
    client = TestClient(build_app(store, token="s3cret"))
    assert client.get("/").status_code == 401
    assert client.get("/static/ui.css").status_code == 401
    assert client.get("/?token=wrong").status_code == 401
    first = client.get("/?token=s3cret")
    assert first.status_code == 200 and TOKEN_COOKIE in first.headers["set-cookie"]
    assert client.get("/runs/done").status_code == 200  # the cookie carries it now
    other = TestClient(build_app(store, token="s3cret"))
    assert other.get("/", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_a_live_page_shows_facts_written_since_the_last_request() -> None:
    store = open_store("memory://")
    try:
        store.open_run("grow", scripted_plan())
        epoch = store.acquire_lease("grow", 0, "d", ttl_s=60)
        client = TestClient(build_app(store))
        assert 'id="sources-done">0 /' in client.get("/runs/grow").text
        store.append("grow", 0, epoch, [SourceAdmitted(0, ("a",), ts=1.0),
                                        GrainDispatched("render", (0,), 0, ts=1.0)], driver="d")
        store.commit("grow", [GrainCommitted("render", (0,), 0, REPORT_PRESENT, ([],),
                                             ts=2.0)])
        store.append("grow", 0, epoch, [OutputEmitted(0, "present", ts=3.0)], driver="d")
        time.sleep(0.6)  # a LiveRun reads the store at most every half second
        page = client.get("/runs/grow").text
        assert 'id="sources-done">1 /' in page and 'data-live="true"' in page
    finally:
        store.close()


def test_pool_sizes_show_as_a_chart_and_a_table_with_hostile_reasons_inert(
        store: LineageStore) -> None:
    """The run and timeline pages draw each sizing pool's size over time from the pool log
    (read on every request: a change written since shows), its reasons escaped; an unreadable
    record is a note on the page, never an error."""
    from rayorch.store.records import PoolChange

    start = min(v.first_ts for v in store.read_view("done").shards.values() if v.first_ts)
    bad = msgpack.packb([1, [1], 0.0, "ocr", 1, 2, "r", "d"])  # a list for a time
    store.record_pool_sizes("done", [PoolChange(0.1, "ocr", 1, 3, "backlog 12", start + 0.2,
                                                "d").encode(), bad])
    client = TestClient(build_app(store))
    for url in ("/runs/done", "/runs/done/timeline"):
        page = client.get(url)
        assert page.status_code == 200 and 'id="pool-chart"' in page.text, url
        assert '<polyline class="series" data-label="ocr" data-last="3"' in page.text
        assert page.text.count('<tr class="pool-change" data-pool="ocr">') == 1
        assert ("1 pool records could not be read and were skipped: record 2: its times are "
                "not finite numbers of seconds &gt;= 0") in page.text
    store.record_pool_sizes("done", [PoolChange(0.9, "ocr", 3, 2, HOSTILE, start + 1.0,
                                                "d").encode()])
    for url in ("/runs/done", "/runs/done/timeline"):
        page = client.get(url).text
        assert page.count('<tr class="pool-change" data-pool="ocr">') == 2, url
        assert "<script>alert" not in page and "<img src=x" not in page
        assert '<td class="reason">&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;' in page
        assert "s: ocr 3 -&gt; 2: &lt;script&gt;alert" in page  # the chart's hover text
    assert 'id="pool-chart"' not in client.get("/runs/half").text  # no pool log: no section


def test_a_pool_that_sizes_itself_shows_its_range_where_a_fixed_one_shows_its_size() -> None:
    from rayorch.inspect.status import pool_sizes

    plan = scripted_plan().describe()
    for module, (low, high) in zip(plan["modules"], ((1, 1024), (2, 8))):
        module["options"].update(replicas=low, max_replicas=high)
    sizes = {call: size for call, (_, _, size) in pool_sizes(plan).items()}
    names = [m["name"] for m in plan["modules"]]
    assert sizes and set(sizes.values()) <= {"auto", "2-8", None}
    assert "auto" in sizes.values() and ("2-8" in sizes.values() or len(names) == 1)
    lineage = open_store("memory://?keep=all")  # drops and pages read values after delivery
    try:
        write_scripted_run(lineage, "sizing", plan=Plan.from_description(plan))
        page = TestClient(build_app(lineage)).get("/runs/sizing").text
        assert re.search(r'<td class="num" title="replicas x batch size[^"]*">auto &times; \d+',
                         page)
    finally:
        lineage.close()


def test_only_loopback_is_served_without_a_token(store: LineageStore) -> None:
    from rayorch.cli import main
    from rayorch.ui.server import UiServer, is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    assert UiServer(store).token is None
    exposed = UiServer(store, host="0.0.0.0")
    assert exposed.token and exposed.url.endswith(f"?token={exposed.token}")
    assert main(["ui", "--store", "memory://"]) == 2  # lives in its run's process: refused


def test_a_run_is_first_read_on_a_thread_and_pages_show_how_far(
        store: LineageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first request of a large run does not wait for its whole fold."""
    from rayorch.inspect.live import LiveRun

    go = threading.Event()
    fetch = LiveRun._fetch

    def slow(self: LiveRun, *args: Any) -> Any:
        go.wait(10)
        return fetch(self, *args)

    monkeypatch.setattr(LiveRun, "_fetch", slow)
    app = build_app(store)
    app.runs.first_wait_s = 0.0
    client = TestClient(app)
    page = client.get("/runs/done").text
    assert 'id="reading"' in page and 'data-live="true"' in page
    assert client.get("/runs/done/sources/3").status_code == 200  # not read yet: no 404
    go.set()
    deadline = time.monotonic() + 10
    while 'id="reading"' in (page := client.get("/runs/done").text) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert 'id="reading"' not in page and 'id="run-state">complete' in page


def test_metrics_export_the_stores_runs_and_the_token_guards_them(store: LineageStore) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from rayorch.store.records import PoolChange

    store.record_pool_sizes("done", [
        PoolChange(1.0, "ocr", 1, 3, "backlog", ts=1.0).encode(),
        PoolChange(2.0, "ocr", 3, 3, "recycled actor 1: RSS 3.2 GB over max_rss 3.0 GB",
                   ts=2.0).encode()])
    response = TestClient(build_app(store)).get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith(
        "text/plain; version=0.0.4")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(response.text) for s in f.samples}
    assert samples[("rayorch_run_info", (("plan", "ScriptedPdfPipeline"), ("run", "done"),
                                         ("state", "complete")))] == 1
    assert samples[("rayorch_run_sources", (("run", "done"), ("state", "done")))] == 4
    assert samples[("rayorch_run_sources", (("run", "half"), ("state", "failed")))] == 1
    assert samples[("rayorch_run_grains_total", (("call", "ocr"), ("kind", "present"),
                                                 ("run", "done")))] == 3
    assert samples[("rayorch_run_pool_actors", (("module", "ocr"), ("run", "done")))] == 3
    assert samples[("rayorch_run_pool_changes_total", (("kind", "recycle"), ("module", "ocr"),
                                                       ("run", "done")))] == 1
    guarded = TestClient(build_app(store, token="s3cret"))
    assert guarded.get("/metrics").status_code == 401
    assert guarded.get("/metrics", headers={"Authorization": "Bearer s3cret"}).status_code == 200
