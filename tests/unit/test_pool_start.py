"""The actors' start-up limit read from the environment (no Ray needed)."""

from __future__ import annotations

import pytest

from rayorch.actors.pool import START_TIMEOUT_ENV, PoolError, start_timeout_s


def test_the_start_up_limit_comes_from_the_environment_and_is_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(START_TIMEOUT_ENV, raising=False)
    assert start_timeout_s() == 120.0
    monkeypatch.setenv(START_TIMEOUT_ENV, "900")
    assert start_timeout_s() == 900.0
    for bad in ("abc", "0", "-5", "inf", "nan", ""):
        monkeypatch.setenv(START_TIMEOUT_ENV, bad)
        with pytest.raises(PoolError, match=r"RAYORCH_ACTOR_START_TIMEOUT_S=.*seconds > 0"):
            start_timeout_s()
