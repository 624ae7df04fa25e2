"""When a running batch is said: past the floor and ten times its module's recent batches,
then again each time its run time doubles; never with a shorter timeout_s set."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from rayorch.core.errors import RayorchError
from rayorch.runtime.stall_watch import StallWatch, stall_floor_s


def batch(batch_id: int, started: float | None) -> Any:
    return SimpleNamespace(task=SimpleNamespace(batch_id=batch_id, tags=[("p", 0)]),
                           slot=SimpleNamespace(index=0), started=started)


def pool(running: list[Any], timeout_s: float | None = None) -> Any:
    module = SimpleNamespace(name="ocr", options=SimpleNamespace(timeout_s=timeout_s))
    return SimpleNamespace(module=module, slots=[SimpleNamespace(queue=running)])


def test_limit_follows_the_module_s_recent_batches_and_repeats_at_double() -> None:
    lines: list[str] = []
    watch = StallWatch(lines.append, floor_s=5)
    assert watch.limit_s("ocr") == 5
    for i in range(3):
        watch.finished("ocr", batch(i, started=0.0), now=2.0)  # each ran 2 s
    assert watch.limit_s("ocr") == 20
    hung = batch(9, started=100.0)
    watch.check([pool([hung])], now=119.0)
    assert lines == []
    watch.check([pool([hung])], now=121.0)
    assert len(lines) == 1 and "batch 9 of module 'ocr'" in lines[0]
    assert "has run 21s (its last 3 batches took at most 2.0s)" in lines[0]
    watch.check([pool([hung])], now=140.0)
    assert len(lines) == 1  # said again only once its run time doubles
    watch.check([pool([hung])], now=143.0)
    assert len(lines) == 2 and "has run 43s" in lines[1]
    watch.finished("ocr", hung, now=150.0)
    assert watch.limit_s("ocr") == 500  # the long one joins the history


def test_a_shorter_timeout_or_a_zero_floor_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    StallWatch(lines.append, floor_s=5).check([pool([batch(1, 0.0)], timeout_s=3)], now=60)
    StallWatch(lines.append, floor_s=0).check([pool([batch(1, 0.0)])], now=600)
    assert lines == []
    monkeypatch.setenv("RAYORCH_STALL_WARN_S", "soon")
    with pytest.raises(RayorchError, match="RAYORCH_STALL_WARN_S='soon': give a number"):
        stall_floor_s()
