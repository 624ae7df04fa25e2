"""The driver's Prometheus endpoint during a real run (``Pipeline.run(metrics_port=0)``, as
``--metrics-port`` does): scraped between outputs, its counters move, its gauges show the
pools and the actors' memory, a failure is counted by its cause's kind, never its text."""

from __future__ import annotations

import sys
import time
import urllib.request
from typing import Any

import pytest

import rayorch as ro

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ray = pytest.importorskip("ray")
pytest.importorskip("prometheus_client")

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def slow_square(xs: list[int]) -> list[int]:
    time.sleep(0.1)
    if 7 in xs:
        raise ValueError("seven is <b>not</b> welcome")
    return [x * x for x in xs]


class Slow(ro.Pipeline):
    def __init__(self) -> None:
        self.square = ro.RayModule(slow_square, batch_size=1, num_cpus=0.25)

    def forward(self, xs: Any) -> Any:
        return self.square(xs)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items()
               if n == name and all((k, labels[k]) in ls for k in labels))


def test_a_scrape_during_a_run_shows_the_stages_moving(ray_local: None) -> None:
    handle = Slow().run(list(range(24)), metrics_port=0, quiet=True, ordered=True)
    url = handle.metrics_url
    assert url is not None and url.startswith("http://127.0.0.1:")
    seen = []
    for i, _ in enumerate(handle):
        if i in (2, 20):
            seen.append(scrape(url))
    early, late = seen
    done_early = value(early, "rayorch_grains_total", call="square", outcome="present")
    done_late = value(late, "rayorch_grains_total", call="square", outcome="present")
    assert 0 < done_early < done_late
    assert value(late, "rayorch_sources_total", state="done") > value(
        early, "rayorch_sources_total", state="done")
    assert value(late, "rayorch_pool_actors", module="square", state="live") >= 1
    assert value(late, "rayorch_actor_rss_bytes", module="square") > 10 << 20
    assert value(late, "rayorch_store_commit_seconds_count") >= done_late
    assert value(late, "rayorch_batch_seconds_count", module="square") >= done_late
    assert value(late, "rayorch_failures_total", call="square", cause="ValueError") == 1
    assert not any("welcome" in str(labels) for _, labels in late)  # a cause is not a label
    assert not any(name.startswith("rayorch_gpu") for name, _ in late)  # no GPU here
    handle.close()
    with pytest.raises(OSError):  # the endpoint leaves with the run
        urllib.request.urlopen(url, timeout=2)


def tiny_model(prompts: list[str]) -> list[str]:
    """A model module of a user's own: it says what its engine read and wrote."""
    ro.add_tokens(sum(len(p.split()) for p in prompts), 7 * len(prompts))
    return [("answer to " + p + " ") * 20 for p in prompts]  # over the payload threshold


class Ask(ro.Pipeline):
    def __init__(self) -> None:
        self.ask = ro.RayModule(tiny_model, batch_size=2, num_cpus=0.25)

    def forward(self, prompts: Any) -> Any:
        return self.ask(prompts)


def test_model_tokens_and_payload_bytes_are_counted_per_call(
        ray_local: None, redis_url: str, tmp_path: Any) -> None:
    prompts = [f"question number {i} please" for i in range(10)]  # 4 words each
    store = f"{redis_url}?payload_dir={tmp_path / 'payloads'}"
    handle = Ask().run(prompts, store=store, metrics_port=0, quiet=True, ordered=True)
    url = handle.metrics_url
    assert url is not None
    seen = None
    for i, _ in enumerate(handle):
        if i == 8:
            seen = scrape(url)
    assert seen is not None
    assert value(seen, "rayorch_tokens_total", call="ask", direction="in") >= 4 * 2
    assert value(seen, "rayorch_payload_bytes_total", call="ask") > 0
    stats = handle.stats.calls["ask"]
    assert (stats.tokens_in, stats.tokens_out) == (4 * 10, 7 * 10)  # each batch once
    written = sum(p.stat().st_size for p in (tmp_path / "payloads").rglob("*.seg"))
    assert stats.payload_bytes == written > 10 * 20 * 20
    handle.close()
