"""``redis+cluster://`` URLs: seed nodes, AUTH, TLS, store options (no server needed)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from rayorch.store import StoreURLError, open_store
from rayorch.store.redis_cluster import RedisClusterStore, parse_cluster_url
from rayorch.store.redis_support import redact_url


def test_nodes_auth_and_waits() -> None:
    spec = parse_cluster_url(
        "redis+cluster://app:s3cret@10.0.0.1:7000,10.0.0.2,[::1]:7002/0"
        "?wait_replicas=2&wait_timeout_ms=500"
    )
    assert spec.nodes == (("10.0.0.1", 7000), ("10.0.0.2", 6379), ("::1", 7002))
    assert spec.connection["username"] == "app" and spec.connection["password"] == "s3cret"
    assert "ssl" not in spec.connection
    assert (spec.wait_replicas, spec.wait_timeout_ms) == (2, 500)


def test_tls_options_reach_every_node() -> None:
    spec = parse_cluster_url("rediss+cluster://:pw@h:7000?ssl_ca_certs=/ca.pem&ssl_cert_reqs=none")
    assert spec.connection["ssl"] is True
    assert spec.connection["ssl_ca_certs"] == "/ca.pem"
    assert spec.connection["password"] == "pw"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis+cluster://h:7000/3", "only database 0"),
        ("redis+cluster://", "at least one node"),
        ("redis+cluster://h:port", "port must be a number"),
        ("redis+cluster://h:70000", "1-65535"),
        ("redis+cluster://h:1?wait_replicas=x", "must be integers"),
        ("redis+cluster://h:1?wait_replicas=-1", ">= 0"),
    ],
)
def test_bad_urls_say_what_is_wrong(url: str, problem: str) -> None:
    with pytest.raises(StoreURLError, match=problem):
        open_store(url)


def test_store_options_stay_out_of_the_cluster_options(tmp_path: Path) -> None:
    url = f"redis+cluster://:pw@h:1,h:2?payload_dir={tmp_path}&retries=3&wait_replicas=0"
    store = open_store(url)
    assert isinstance(store, RedisClusterStore)
    assert store.retries == 3 and store.wait_replicas == 0
    assert store.payloads.root is not None
    assert "payload_dir" not in store.cluster_url.connection
    clone = pickle.loads(pickle.dumps(store))  # travels to Ray workers as its URL
    assert isinstance(clone, RedisClusterStore) and clone.url == url
    assert redact_url(url) == url.replace(":pw@", ":***@")
