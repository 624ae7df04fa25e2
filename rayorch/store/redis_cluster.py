# mypy: disable-error-code="no-untyped-call"
"""The lineage store on a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``).

Same keys, scripts and facts as :class:`~rayorch.store.redis_store.RedisStore`: every
key of a shard carries the hash tag ``{run:k}`` and every run-level key ``{run}``, so
each script call and each command touches one slot, and the shards of a run spread
over the masters by the CRC16 of their tag (docs/topics/FAILOVER.md, "Redis Cluster").

Replication is asynchronous, so a master that dies can take its last writes with it
when a replica is promoted. Every write that must survive a failover (a lease
acquisition, a fenced append, a commit, a new run) is therefore followed, on the same
connection, by ``WAIT wait_replicas wait_timeout_ms``: the call returns only once that
many replicas hold the write, and raises :class:`StoreUnavailableError` otherwise (the
caller retries; every call carries a token, so running it again answers as the first
run did). A promoted replica therefore holds every epoch a driver was given, so epochs
never repeat, and every commit a worker was told about.

URL: ``redis+cluster://[user:password@]host:port[,host:port...][/0][?options]``; any
reachable node finds the others. Options besides those of ``redis://``:
``wait_replicas=N`` (default 1; 0 turns the wait off) and ``wait_timeout_ms=MS``
(default 2000). TLS: ``rediss+cluster://`` with redis-py's ``ssl_*`` query options.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import SSLConnection, parse_url
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MasterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.retry import Retry

from rayorch.core.errors import StoreError
from rayorch.store.errors import StoreAuthError, StoreUnavailableError, StoreURLError
from rayorch.store.keys import manifest_key
from rayorch.store.redis_store import _STORE_OPTIONS, MAX_BLOCK_S, RedisStore
from rayorch.store.scripts import RENEW_LEASE, LuaScript

DEFAULT_PORT = 6379
_CLUSTER_OPTIONS = ("wait_replicas", "wait_timeout_ms")
# Errors after which the cluster is being reconfigured (failover, resharding): retry.
_RECONFIGURING = (ClusterDownError, MasterDownError, TryAgainError, SlotNotCoveredError)
_AUTH_MARKERS = ("username-password", "NOAUTH", "WRONGPASS", "Authentication required",
                 "invalid password", "NOPERM", "already authenticated")
# Errors after which a call is sent again once the client knows the cluster's new shape.
_REROUTE = (MovedError, redis.ConnectionError, redis.TimeoutError, *_RECONFIGURING)


@dataclass(frozen=True)
class ClusterURL:
    """A parsed ``redis+cluster://`` URL: seed nodes, per-node connection options, waits."""

    nodes: tuple[tuple[str, int], ...]
    connection: dict[str, Any] = field(repr=False)
    wait_replicas: int = 1
    wait_timeout_ms: int = 2000


def _parse_host(url: str, text: str) -> tuple[str, int]:
    if text.startswith("["):  # [v6]:port
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = text.rpartition(":") if ":" in text else (text, "", "")
    if not host:
        raise StoreURLError(url, f"node {text!r} has no host")
    try:
        port = int(port_text) if port_text else DEFAULT_PORT
    except ValueError:
        raise StoreURLError(url, f"node {text!r}: the port must be a number") from None
    if not 0 < port < 65536:
        raise StoreURLError(url, f"node {text!r}: the port must be 1-65535")
    return host, port


def parse_cluster_url(url: str) -> ClusterURL:
    """Split ``redis+cluster://[user:password@]h1:p1,h2:p2[/0][?opts]`` (store options ignored)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in RedisClusterStore.SCHEMES:
        raise StoreURLError(url, "a Redis Cluster URL starts with redis+cluster:// or "
                                 "rediss+cluster://")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    if path not in ("", "0"):
        raise StoreURLError(url, "a Redis Cluster has only database 0 (end the URL with /0 "
                                 "or nothing)")
    userinfo, _, hosts = netloc.rpartition("@")
    nodes = tuple(_parse_host(url, h) for h in hosts.split(",") if h)
    if not nodes:
        raise StoreURLError(url, "name at least one node: redis+cluster://host:port[,host:port]")
    pairs = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True)
             if k not in _STORE_OPTIONS]
    waits = {k: v for k, v in pairs if k in _CLUSTER_OPTIONS}
    try:
        wait_replicas = int(waits.get("wait_replicas", 1))
        wait_timeout_ms = int(waits.get("wait_timeout_ms", 2000))
    except ValueError:
        raise StoreURLError(url, "wait_replicas and wait_timeout_ms must be integers") from None
    if wait_replicas < 0 or wait_timeout_ms < 1:
        raise StoreURLError(url, "wait_replicas must be >= 0 and wait_timeout_ms >= 1")
    # redis-py parses AUTH and TLS options of one node; every node gets the same ones.
    single = "rediss" if scheme.lower().startswith("rediss") else "redis"
    passthrough = urlencode([(k, v) for k, v in pairs if k not in _CLUSTER_OPTIONS])
    auth = f"{userinfo}@" if userinfo else ""
    try:
        options = parse_url(f"{single}://{auth}localhost/0?{passthrough}")
    except ValueError as exc:
        raise StoreURLError(url, str(exc)) from exc
    for key in ("host", "port", "db"):
        options.pop(key, None)
    if options.pop("connection_class", None) is SSLConnection:
        options["ssl"] = True
    return ClusterURL(nodes, options, wait_replicas, wait_timeout_ms)


def _per_node(answer: Any) -> dict[str, dict[str, Any]]:
    """A cluster command's answer by node (redis-py gives one node's answer unkeyed)."""
    if answer and all(isinstance(v, dict) for v in answer.values()):
        return dict(answer)
    return {"": dict(answer or {})}


class RedisClusterStore(RedisStore):
    """:class:`RedisStore` over a Redis Cluster (redis-py's ``RedisCluster`` client)."""

    SCHEMES = ("redis+cluster", "rediss+cluster")

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.cluster_url = parse_cluster_url(url)

    @property
    def wait_replicas(self) -> int:
        return self.cluster_url.wait_replicas

    # -- connection ----------------------------------------------------------------
    def _connect(self) -> redis.Redis:
        spec = self.cluster_url
        retry = Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), self.retries)
        with self._errors():
            try:
                client = RedisCluster(
                    startup_nodes=[ClusterNode(host, port) for host, port in spec.nodes],
                    retry=retry,
                    require_full_coverage=False,  # serve the slots that are up in a failover
                    socket_connect_timeout=2.0,
                    socket_timeout=MAX_BLOCK_S + 10.0,
                    **spec.connection,
                )
            except IndexError:  # redis-py: no node serves a slot, so it finds no primary
                raise StoreUnavailableError(
                    self.safe_url, "the cluster serves no hash slots yet (its nodes are up but "
                    "hold no slots): wait until `redis-cli --cluster create` has finished"
                ) from None
        # RedisCluster offers the commands RedisStore uses, routed by key slot.
        return cast(redis.Redis, client)

    def _cluster(self) -> RedisCluster:
        return cast(RedisCluster, self._client())

    def check(self) -> None:
        """Reachable and recent enough (every primary answered), every slot served, and as
        many replicas per master as ``wait_replicas`` waits for: else every write would
        time out, and the cause would be hidden behind "cannot reach the store"."""
        client = self._cluster()
        with self._errors():
            states = _per_node(client.cluster_info(target_nodes=RedisCluster.PRIMARIES))
            replication = _per_node(client.info("replication", target_nodes=RedisCluster.PRIMARIES))
        for node, info in sorted(states.items()):
            if info.get("cluster_state") != "ok":
                raise StoreUnavailableError(
                    self.safe_url, f"the cluster does not serve all its slots yet "
                    f"(cluster_state {info.get('cluster_state')!r} on {node}): wait until "
                    "`redis-cli --cluster create` or a failover has finished")
        for node, info in sorted(replication.items()):
            replicas = int(info.get("connected_slaves", 0))
            if replicas < self.wait_replicas:
                raise StoreError(
                    f"the Redis Cluster at {self.safe_url} cannot acknowledge writes: each waits "
                    f"for {self.wait_replicas} replica(s) (wait_replicas), but master {node} has "
                    f"{replicas} connected. Add replicas, or add ?wait_replicas=0 to the URL for "
                    "a cluster without replicas (a write only its master holds is lost if that "
                    "master fails)")

    def _server_version(self, client: redis.Redis) -> str:
        infos = _per_node(cast(RedisCluster, client).info("server",
                                                          target_nodes=RedisCluster.PRIMARIES))
        versions = [str(i.get("redis_version", "0")) for i in infos.values()] or ["0"]
        return min(versions, key=lambda v: tuple(int(p) for p in v.split(".") if p.isdigit()))

    def _scan(self, pattern: str, *, near: str | None = None) -> list[str]:
        """SCAN every master, or only the one that serves ``near``'s slot."""
        if near is None:
            return super()._scan(pattern)
        client = self._cluster()
        with self._errors():
            node = client.get_node_from_key(near)
            return [k.decode() if isinstance(k, bytes) else k
                    for k in client.scan_iter(match=pattern, count=1000, target_nodes=node)]

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        with super()._errors():
            try:
                yield
            except _RECONFIGURING as exc:
                raise StoreUnavailableError(self.safe_url, f"cluster: {exc}") from exc
            except RedisClusterException as exc:
                text = str(exc)  # redis-py wraps a refused login found while connecting
                if any(m in text for m in _AUTH_MARKERS):
                    raise StoreAuthError(self.safe_url, text.rpartition(": ")[2]) from exc
                if "cannot be connected" in text or "not covered" in text:
                    raise StoreUnavailableError(self.safe_url, text) from exc
                raise StoreError(
                    f"the Redis Cluster at {self.safe_url} answered: {text}"
                ) from exc

    # -- writes that must survive a failover ------------------------------------------
    def _eval(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if script is RENEW_LEASE or self.wait_replicas == 0:
            return super()._eval(script, keys, args)  # a lost renewal only shortens a lease
        return self._eval_many([(script, list(keys), list(args))])[0]

    def _eval_many(self, calls: list[tuple[LuaScript, list[str], list[Any]]]) -> list[Any]:
        """Run the calls, one pipeline per master, each ended by ``WAIT`` on its connection.

        A call a pipeline could not run (NOSCRIPT, MOVED, ASK, a lost node, a cluster
        being reconfigured) runs again, until the retries are spent; its token makes a
        second run of a call that did run answer as the first one did.
        """
        client = self._cluster()
        out: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        use_source: set[int] = set()  # NOSCRIPT: send the source (EVAL caches it)
        asking: dict[int, str] = {}  # ASK: send ASKING first, to that node
        backoff = ExponentialWithJitterBackoff(cap=1.0, base=0.05)
        error: Exception = StoreUnavailableError(self.safe_url, "retries spent")
        for attempt in range(self.retries + 3):  # + a NOSCRIPT and an ASK hop
            groups: dict[str, list[int]] = {}
            for i in pending:
                with self._errors():
                    name = asking.get(i) or client.get_node_from_key(calls[i][1][0]).name
                groups.setdefault(name, []).append(i)
            pending, refresh = [], False
            for name, members in groups.items():
                results = self._run_on_node(client, name, calls, members, use_source, asking)
                for i, result in zip(members, results):
                    if not isinstance(result, NoScriptError):
                        asking.pop(i, None)  # an ASK holds for the one next call only
                    if not isinstance(result, Exception):
                        out[i] = result
                        continue
                    pending.append(i)
                    error = result
                    if isinstance(result, NoScriptError):
                        use_source.add(i)
                    elif isinstance(result, AskError) and not isinstance(result, MovedError):
                        asking[i] = f"{result.host}:{result.port}"
                    elif isinstance(result, _REROUTE):
                        refresh = True
                    else:
                        with self._errors():
                            raise result
            if not pending:
                return out
            if refresh:
                with contextlib.suppress(RedisClusterException, redis.RedisError):
                    client.nodes_manager.initialize()  # learn who serves which slot now
                time.sleep(backoff.compute(attempt + 1))
        if isinstance(error, AskError):  # still moving (resharding): as unavailable as TRYAGAIN
            raise StoreUnavailableError(self.safe_url, f"cluster: {error}") from error
        with self._errors():
            raise error

    def _run_on_node(self, client: RedisCluster, name: str,
                     calls: list[tuple[LuaScript, list[str], list[Any]]], members: list[int],
                     use_source: set[int], asking: dict[int, str]) -> list[Any]:
        """One round trip to one node: the calls, then ``WAIT`` (errors come back as values)."""
        node = client.get_node(node_name=name)
        if node is None:
            return [redis.ConnectionError(f"node {name} is not known yet")] * len(members)
        pipe = client.get_redis_connection(node).pipeline(transaction=False)
        answers: list[bool] = []  # which replies answer a call (not ASKING, not WAIT)
        for i in members:
            script, keys, args = calls[i]
            if i in asking:
                pipe.execute_command("ASKING")
                answers.append(False)
            if i in use_source:
                pipe.eval(script.source, len(keys), *keys, *args)
            else:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            answers.append(True)
        wait = self.cluster_url.wait_timeout_ms
        pipe.execute_command("WAIT", self.wait_replicas, wait)
        try:
            raw = pipe.execute(raise_on_error=False)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            return [exc] * len(members)
        acked = raw[-1]
        if not isinstance(acked, Exception) and int(acked) < self.wait_replicas:
            raise StoreUnavailableError(
                self.safe_url,
                f"{int(acked)} of {self.wait_replicas} replicas of {name} acknowledged a "
                f"write within {wait} ms (the write may or may not survive a failover)",
            )
        return [r for r, keep in zip(raw, answers) if keep]

    def _sync_to_disk(self, key: str) -> None:
        """Nothing more to wait for: the lease script's call already waited for the replicas."""

    def save_manifest(self, run_id: str, manifest: bytes) -> bytes:
        """First writer wins; returns once ``wait_replicas`` replicas hold the manifest."""
        if self.wait_replicas == 0:
            return super().save_manifest(run_id, manifest)
        self._layout(run_id)
        client = self._cluster()
        key = manifest_key(run_id)
        with self._errors():  # one connection for the write and its WAIT
            pipe = client.get_redis_connection(client.get_node_from_key(key)).pipeline(
                transaction=False)
            pipe.set(key, manifest, nx=True)
            pipe.get(key)
            pipe.execute_command("WAIT", self.wait_replicas, self.cluster_url.wait_timeout_ms)
            _, stored, acked = pipe.execute()
        if int(acked) < self.wait_replicas:
            raise StoreUnavailableError(
                self.safe_url, f"{int(acked)} of {self.wait_replicas} replicas acknowledged "
                               f"the manifest of run {run_id}")
        return bytes(stored) if stored is not None else bytes(manifest)
