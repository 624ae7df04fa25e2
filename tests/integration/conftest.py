"""Fixtures of the integration tests (the session's Ray and redis-server: tests/conftest.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from rayorch.store.registry import open_store


@pytest.fixture(params=["memory", "redis"])
def store_url(request: pytest.FixtureRequest, ray_local: None) -> Iterator[str]:
    """A fresh lineage store URL of each kind (a private redis-server for Redis)."""
    if request.param == "memory":
        url = f"memory://it-{os.getpid()}-{time.monotonic_ns()}"
        held = open_store(url)  # a memory store lives while it is open: hold it for the test
        yield url
        held.close()
    else:
        yield request.getfixturevalue("redis_url")
