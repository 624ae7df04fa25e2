"""The Redis store's records for driver replicas: the run's manifest and sink, its pool
log, driver heartbeats and done shards (a mixin of ``RedisStore``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rayorch.store.base import POOL_LOG_MAX
from rayorch.store.keys import done_key, drivers_key, manifest_key, meta_key, pools_key
from rayorch.store.layout import RunLayout, decode_sink, encode_sink
from rayorch.store.redis_claims import RedisAccess
from rayorch.store.redis_support import decode_text
from rayorch.store.scripts import DRIVER_REGISTRY, HEARTBEAT


class RedisReplicaRecords(RedisAccess):
    """What replica drivers of a run share besides its facts and leases."""

    _layouts: dict[str, RunLayout]

    def _layout(self, run_id: str) -> RunLayout:
        raise NotImplementedError

    def _schedule(self, run_id: str, shard: int, *, done: bool) -> None:
        """Queue the shard's archiving (``RedisArchiving``)."""
        raise NotImplementedError

    def save_manifest(self, run_id: str, manifest: bytes) -> bytes:
        self._layout(run_id)
        client = self._client()
        with self._errors():
            client.set(manifest_key(run_id), manifest, nx=True)
            stored: Any = client.get(manifest_key(run_id))
        return bytes(stored) if stored is not None else bytes(manifest)

    def record_sink(self, run_id: str, out_dir: str, out_format: str) -> tuple[str, str]:
        self._layout(run_id)
        with self._errors():
            self._client().hsetnx(meta_key(run_id), "sink", encode_sink(out_dir, out_format))
            raw: Any = self._client().hget(meta_key(run_id), "sink")
        self._layouts.pop(run_id, None)  # run_info reads it back
        return decode_sink(raw) or (str(out_dir), str(out_format))

    def load_manifest(self, run_id: str) -> bytes | None:
        self._layout(run_id)
        with self._errors():
            raw: Any = self._client().get(manifest_key(run_id))
        return None if raw is None else bytes(raw)

    def record_pool_sizes(self, run_id: str, records: Sequence[bytes]) -> None:
        self._layout(run_id)
        with self._errors():
            self._client().rpush(pools_key(run_id), *records)
            self._client().ltrim(pools_key(run_id), -POOL_LOG_MAX, -1)

    def pool_sizes(self, run_id: str) -> list[bytes]:
        with self._errors():
            raw: Any = self._client().lrange(pools_key(run_id), 0, -1)
        return [bytes(r) for r in raw]

    def heartbeat(self, run_id: str, driver: str, ttl_s: float) -> None:
        # Server time (TIME in the script): a driver's wrong clock evicts nobody.
        ttl_ms = max(1, int(ttl_s * 1000)) if ttl_s > 0 else 0
        self._eval(HEARTBEAT, [drivers_key(run_id)], [driver, ttl_ms])

    def driver_registry(self, run_id: str) -> tuple[float, dict[str, float]]:
        raw: Any = self._eval(DRIVER_REGISTRY, [drivers_key(run_id)], [])
        entries = {decode_text(raw[i]): int(raw[i + 1]) / 1000 for i in range(1, len(raw) - 1, 2)}
        return int(raw[0]) / 1000, entries

    def mark_shard_done(self, run_id: str, shard: int) -> None:
        self._layout(run_id).check_shard(shard)
        with self._errors():
            self._client().sadd(done_key(run_id), shard)
        self._schedule(run_id, shard, done=True)

    def done_shards(self, run_id: str) -> frozenset[int]:
        with self._errors():
            members = self._client().smembers(done_key(run_id))
        return frozenset(int(m) for m in members)
