"""The Redis Streams lineage store (``redis://``, ``rediss://``).

Per shard, one stream per Domain holds the shard's facts; a sequence counter gives
every fact its place in the shard's total order (it is also the entry id,
``<seq>-0``), so a reader merges the Domain streams back into one order. The
commit gate, fenced driver appends and leases are Lua scripts (``lua/*.lua``),
run with EVALSHA and reloaded on NOSCRIPT (after a server restart). Every call
carries a unique token, so a call retried after a lost reply answers as the
first one did instead of applying twice. Every key comes from :mod:`.keys`.

URL options (removed before the URL reaches redis-py): ``payload_dir=PATH``,
``payload_threshold=BYTES`` (default 128: larger outputs go to payload segments),
``keep=outputs|all|none`` (which values outlive their source's delivery,
:mod:`.payload_release`), ``retries=N`` (reconnect attempts), ``archive=URL`` (finished
lineage goes to compressed segments there and leaves Redis, :mod:`.redis_archive`) and
``archive_every=N`` (facts a driver appends to a shard between two archives of it).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson
import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    AuthorizationError,
    NoPermissionError,
    NoScriptError,
    ResponseError,
)

from rayorch.core.errors import StoreError
from rayorch.core.facts import (
    Fact,
    GrainCommitted,
    GrainReused,
    barrier_fact,
)
from rayorch.core.ids import ROOT, CallId, DomainId, domain_depth
from rayorch.core.ids import Path as EntityPath
from rayorch.core.vocabulary import CommitVerdict, GrainPhase
from rayorch.store.base import (
    DEFAULT_READ_LIMIT,
    LeaseHolder,
    LineageStore,
    StoredFact,
)
from rayorch.store.errors import (
    LeaseHeldError,
    RunMismatchError,
    RunNotFoundError,
    StoreAuthError,
    StoreTLSError,
    StoreUnavailableError,
    StoreURLError,
    StoreVersionError,
)
from rayorch.store.gate import split_field
from rayorch.store.keys import (
    RUNS_KEY,
    GrainKeys,
    KeyIndex,
    ShardKeys,
    done_key,
    drivers_key,
    grain_buckets_of_run,
    grain_field,
    grain_table_for,
    manifest_key,
    meta_key,
    pools_key,
)
from rayorch.store.layout import (
    AppendBasis,
    RunInfo,
    RunLayout,
    check_run_id,
    decode_sink,
    prepare_driver_facts,
    prepare_reports,
)
from rayorch.store.payload import (
    DEFAULT_THRESHOLD,
    PayloadRoots,
    PayloadStore,
    Sealing,
    run_of_ref,
    store_identity,
)
from rayorch.store.payload_release import KEEP_MODES, SegmentRelease
from rayorch.store.records.facts import decode_fact, encode_fact
from rayorch.store.redis_archive import DEFAULT_EVERY, RedisArchiving
from rayorch.store.redis_claims import RedisClaims
from rayorch.store.redis_replicas import RedisReplicaRecords
from rayorch.store.redis_support import (
    ReconnectRetry,
    decode_phase,
    decode_text,
    grain_table_of,
    is_tls_failure,
    merge_streams,
    one_line,
    parse_version,
    redact_url,
)
from rayorch.store.reuse_audit import refs_held_elsewhere
from rayorch.store.scripts import (
    ACQUIRE_LEASE,
    APPEND_FENCED,
    COMMIT_BATCH,
    CONFIG_MISMATCH,
    FINGERPRINT_MISMATCH,
    LEASE_HELD,
    OPEN_RUN,
    RENEW_LEASE,
    VERDICTS,
    LuaScript,
    append_refusal,
    lease_refusal,
    next_token,
    parse_lease_value,
)

MIN_REDIS_VERSION = (7, 0)
MAX_BLOCK_S = 20.0  # one XREAD BLOCK; longer waits loop (keeps under the socket timeout)
_STORE_OPTIONS = ("payload_dir", "payload_threshold", "retries", "keep", "archive",
                  "archive_every")


class RedisStore(RedisClaims, RedisArchiving, RedisReplicaRecords, LineageStore):
    """Lineage facts in Redis Streams; cheap to open (connects on first use), pickles as its URL."""

    SCHEMES: tuple[str, ...] = ("redis", "rediss")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in self.SCHEMES:
            starts = " or ".join(f"{s}://" for s in self.SCHEMES)
            raise StoreURLError(url, f"a {type(self).__name__} URL starts with {starts}")
        query = parse_qsl(parts.query, keep_blank_values=True)
        options = {k: v for k, v in query if k in _STORE_OPTIONS}
        passthrough = [(k, v) for k, v in query if k not in _STORE_OPTIONS]
        try:
            threshold = int(options.get("payload_threshold", DEFAULT_THRESHOLD))
            self.retries = int(options.get("retries", 10))
            every = int(options.get("archive_every", DEFAULT_EVERY))
        except ValueError:
            raise StoreURLError(url, "payload_threshold, retries and archive_every must be "
                                "integers") from None
        keep = options.get("keep", KEEP_MODES[0])
        if keep not in KEEP_MODES:
            raise StoreURLError(url, f"keep= takes {' or '.join(KEEP_MODES)}, not {keep[:20]!r}")
        self.url = url
        self.safe_url = redact_url(url)
        self._redis_url = urlunsplit(parts._replace(query=urlencode(passthrough)))
        payload_dir = options.get("payload_dir")
        self.payloads = PayloadStore(payload_dir or None, threshold, owner=store_identity(url))
        self.roots = PayloadRoots(self.payloads)
        self.release = SegmentRelease(self.payloads_of, keep, self._eval, self._sync_to_disk)
        self._init_archive(options.get("archive") or None, max(1, every))
        self._redis: redis.Redis | None = None
        self._layouts: dict[str, RunLayout] = {}
        self._grain_tables: dict[str, str | None] = {}  # run -> its buckets (None: one hash)
        self._waitaof = True
        # (run, shard, driver, epoch) -> the token of this client's acquisition
        self._holder_tokens: dict[tuple[str, int, str, int], str] = {}

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.url,))

    # -- connection ----------------------------------------------------------------
    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Translate redis-py errors into StoreError subclasses with plain messages."""
        try:
            yield
        except StoreError:
            raise
        except (AuthenticationError, AuthenticationWrongNumberOfArgsError, AuthorizationError,
                NoPermissionError) as exc:
            raise StoreAuthError(self.safe_url, str(exc)) from exc
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if is_tls_failure(exc):
                raise StoreTLSError(self.safe_url, one_line(exc)) from exc
            raise StoreUnavailableError(self.safe_url, str(exc)) from exc
        except ResponseError as exc:
            text = str(exc)
            if text.startswith(("NOAUTH", "WRONGPASS", "NOPERM")):
                raise StoreAuthError(self.safe_url, text) from exc
            raise StoreError(f"the lineage store at {self.safe_url} answered: {text}") from exc

    def _client(self) -> redis.Redis:
        if self._redis is None:
            client = self._connect()
            with self._errors():
                version = self._server_version(client)
            if parse_version(version) < MIN_REDIS_VERSION:
                client.close()
                raise StoreVersionError(self.safe_url, version)
            self._redis = client
        return self._redis

    def _connect(self) -> redis.Redis:
        """A new client for the URL (the Redis Cluster store returns a cluster client)."""
        retry = ReconnectRetry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), self.retries)
        try:
            return redis.Redis.from_url(
                self._redis_url,
                retry=retry,
                socket_connect_timeout=2.0,
                socket_timeout=MAX_BLOCK_S + 10.0,
            )
        except ValueError as exc:
            raise StoreURLError(self.safe_url, str(exc)) from exc

    def check(self) -> None:
        """Reachable, recent enough (see ``_client``), and a master: a replica refuses writes."""
        client = self._client()
        with self._errors():
            role = client.info("replication").get("role")
        if role not in (None, "master"):
            raise StoreError(f"the lineage store at {self.safe_url} is a read-only {role}: "
                             "give the URL of its master")

    def _server_version(self, client: redis.Redis) -> str:
        return str(client.info("server").get("redis_version", "0"))

    def close(self) -> None:
        self.wait_archived()
        if self._redis is not None:
            self._redis.close()
            self._redis = None

    def _eval(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        client = self._client()
        with self._errors():
            try:
                return client.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:  # EVAL caches it on the node that owns the keys
                return client.eval(script.source, len(keys), *keys, *args)

    def _eval_many(self, calls: list[tuple[LuaScript, list[str], list[Any]]]) -> list[Any]:
        """Run several script calls in one round trip (pipelined, not a transaction)."""
        if len(calls) == 1:
            return [self._eval(*calls[0])]
        client = self._client()
        with self._errors():
            pipe = client.pipeline(transaction=False)
            for script, keys, args in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            results = pipe.execute(raise_on_error=False)
        out: list[Any] = []
        for call, result in zip(calls, results):
            if isinstance(result, NoScriptError):
                result = self._eval(*call)  # this call did not run: run it alone
            elif isinstance(result, Exception):
                with self._errors():
                    raise result
            out.append(result)
        return out

    # -- runs --------------------------------------------------------------------
    def _open_run(self, run_id: str, desc: dict[str, Any], fingerprint: str, shards: int,
                  micro_batch: int, config: dict[str, Any]) -> RunInfo:
        args = [fingerprint, shards, micro_batch, orjson.dumps(desc), orjson.dumps(config),
                repr(time.time()),
                grain_table_for(max((domain_depth(d[0]) for d in desc.get("domains", ())),
                                    default=0))]
        result = self._eval(OPEN_RUN, [meta_key(run_id)], args)
        code = int(result[0])
        if code == FINGERPRINT_MISMATCH:
            raise RunMismatchError(run_id, "plan fingerprint", result[1].decode(), fingerprint)
        if code == CONFIG_MISMATCH:
            stored = f"{int(result[1])} / {int(result[2])}"
            raise RunMismatchError(run_id, "shards / micro_batch", stored,
                                   f"{shards} / {micro_batch}")
        with self._errors():
            self._client().hsetnx(meta_key(run_id), "keep", self.release.keep)  # first wins
            self._client().hsetnx(meta_key(run_id), "payloads", self.payloads.root)
            if self.archive_url:
                self._client().hsetnx(meta_key(run_id), "archive", self.archive_url)
            self._client().sadd(RUNS_KEY, run_id)
        self._layouts.pop(run_id, None)
        return self.run_info(run_id)

    def run_info(self, run_id: str) -> RunInfo:
        return self._layout(run_id).info

    def payloads_of(self, run_id: str) -> PayloadStore:
        """Where ``run_id``'s values are: :meth:`PayloadRoots.of` the root it recorded."""
        try:
            return self.roots.of(self._layout(run_id).info.payloads)
        except RunNotFoundError:
            return self.payloads

    def load_payload(self, ref: str) -> tuple[Any, ...]:
        """The outputs stored under ``ref``, read where its run keeps its values."""
        return self.payloads_of(run_of_ref(ref)).load(ref)

    def _layout(self, run_id: str) -> RunLayout:
        layout = self._layouts.get(run_id)
        if layout is None:
            with self._errors():
                raw = self._client().hgetall(meta_key(run_id))
            if not raw:
                raise RunNotFoundError(run_id, self.safe_url)
            info = RunInfo(
                run_id=run_id,
                fingerprint=decode_text(raw[b"fingerprint"]),
                plan=orjson.loads(raw[b"plan"]),
                shards=int(raw[b"shards"]),
                micro_batch=int(raw[b"micro_batch"]),
                config=orjson.loads(raw[b"config"]),
                created_ts=float(raw[b"created_ts"]),
                sink=decode_sink(raw.get(b"sink")),
                keep=decode_text(raw.get(b"keep", b"all")),
                payloads=decode_text(raw.get(b"payloads", b"")),
            )
            self._grain_tables[run_id] = grain_table_of(run_id, raw)
            layout = self._layouts[run_id] = RunLayout(info)
        return layout

    def _grain_keys(self, run_id: str, shard: int) -> GrainKeys:
        """Where the shard's Grain entries are (buckets, or a run's one hash from before)."""
        self._layout(run_id)
        return GrainKeys(ShardKeys(run_id, shard), self._grain_tables[run_id])

    def list_runs(self) -> list[RunInfo]:
        with self._errors():
            ids = sorted(decode_text(m) for m in self._client().smembers(RUNS_KEY))
        infos = []
        for run_id in ids:
            with contextlib.suppress(RunNotFoundError):
                infos.append(self.run_info(run_id))
        return sorted(infos, key=lambda i: (i.created_ts, i.run_id))

    def delete_run(self, run_id: str) -> None:
        check_run_id(run_id)  # never "." or "..": the payload directory is named by it
        try:
            layout = self._layout(run_id)
        except RunNotFoundError:
            return
        held = refs_held_elsewhere(self, run_id)  # later runs reuse these files: kept
        archive = self._archive_of(run_id)
        if archive is not None:
            archive.delete_run(run_id)
        client = self._client()
        with self._errors():
            pipe = client.pipeline(transaction=False)
            run_keys = [meta_key(run_id), manifest_key(run_id), drivers_key(run_id),
                        done_key(run_id), pools_key(run_id)]
            for shard in range(layout.info.shards):
                run_keys += ShardKeys(run_id, shard).all_keys(layout.domains)
            run_keys += self._scan(grain_buckets_of_run(run_id))
            for key in run_keys:  # one key per command: the keys span Redis Cluster slots
                pipe.delete(key)
            pipe.srem(RUNS_KEY, run_id)
            pipe.execute()
        payloads = self.payloads_of(run_id)
        self._layouts.pop(run_id, None)
        payloads.delete_run(run_id, keep=held)

    # -- leases ------------------------------------------------------------------
    def _lease_keys(self, run_id: str, shard: int) -> tuple[ShardKeys, list[str]]:
        self._layout(run_id).check_shard(shard)
        keys = ShardKeys(run_id, shard)
        return keys, [keys.lease, keys.holder, keys.epoch]

    def _holder_token(self, run_id: str, shard: int, driver: str, epoch: int) -> str:
        """The token of this client's acquisition of ``epoch`` ("" if another client took it)."""
        return self._holder_tokens.get((run_id, shard, driver, epoch), "")

    def acquire_lease(self, run_id: str, shard: int, driver: str, ttl_s: float, *,
                      after_epoch: int | None = None) -> int:
        keys, lease_keys = self._lease_keys(run_id, shard)
        token = uuid.uuid4().hex
        after, after_token = "", ""
        if after_epoch is not None:
            after, after_token = str(after_epoch), self._holder_token(run_id, shard, driver,
                                                                      after_epoch)
        result = self._eval(
            ACQUIRE_LEASE,
            [*lease_keys, keys.seq, keys.facts(ROOT)],
            [driver, max(1, int(ttl_s * 1000)), shard, repr(time.time()), token, after,
             after_token],
        )
        code = int(result[0])
        if code == LEASE_HELD:
            raise LeaseHeldError(run_id, shard, decode_text(result[2]), int(result[1]))
        if code < 0:
            raise lease_refusal(run_id, shard, after_epoch or 0, result)
        epoch = int(result[1])
        self._holder_tokens[(run_id, shard, driver, epoch)] = token
        if code == 1:
            self._sync_to_disk(keys.lease)
        return epoch

    def _sync_to_disk(self, key: str) -> None:
        """Wait for the AOF fsync of a new epoch (of ``key``) where the server supports it."""
        if not self._waitaof:
            return
        try:
            with self._errors():
                self._client().execute_command("WAITAOF", 1, 0, 1000)  # type: ignore[no-untyped-call]
        except StoreError:
            self._waitaof = False  # no AOF, or a server without WAITAOF

    def _renew(self, run_id: str, shard: int, driver: str, epoch: int, ttl_ms: int) -> Any:
        _, lease_keys = self._lease_keys(run_id, shard)
        token = self._holder_token(run_id, shard, driver, epoch)
        return self._eval(RENEW_LEASE, lease_keys, [epoch, driver, ttl_ms, token])

    def renew_lease(self, run_id: str, shard: int, driver: str, epoch: int, ttl_s: float) -> None:
        result = self._renew(run_id, shard, driver, epoch, max(1, int(ttl_s * 1000)))
        if int(result[0]) != 1:
            raise lease_refusal(run_id, shard, epoch, result)

    def release_lease(self, run_id: str, shard: int, driver: str, epoch: int) -> None:
        result = self._renew(run_id, shard, driver, epoch, 0)
        if int(result[0]) == 1:
            self._holder_tokens.pop((run_id, shard, driver, epoch), None)

    def lease_holder(self, run_id: str, shard: int) -> LeaseHolder | None:
        self._layout(run_id).check_shard(shard)
        with self._errors():
            raw = self._client().get(ShardKeys(run_id, shard).lease)
        if raw is None:
            return None
        epoch, _, driver = parse_lease_value(decode_text(raw))
        return LeaseHolder(driver, epoch)

    # -- facts -------------------------------------------------------------------
    def append(self, run_id: str, shard: int, epoch: int, facts: Sequence[Fact], *,
               driver: str, basis: AppendBasis | None = None) -> list[int]:
        layout = self._layout(run_id)
        prepared = prepare_driver_facts(layout, shard, facts)
        keys, lease_keys = self._lease_keys(run_id, shard)
        grains = self._grain_keys(run_id, shard)
        more = KeyIndex()  # the streams and Grain buckets the call touches
        basis = basis or AppendBasis()
        args: list[Any] = [epoch, next_token(), len(prepared), driver,
                           self._holder_token(run_id, shard, driver, epoch), basis.read_seq,
                           basis.appended_first, len(basis.sealed)]
        for call, path, generation in basis.sealed:
            args += [grain_field(call, path), more.index(grains.of(path)), generation]
        for item in prepared:
            fact: Any = item.fact  # a Grain fact (it has a path) unless its kind is 0
            bucket = more.index(grains.of(fact.path)) if item.kind else 0
            args += [item.kind, item.grain, bucket, item.generation,
                     more.index(keys.facts(item.domain)), encode_fact(item.fact)]
        result = self._eval(APPEND_FENCED, [*lease_keys, keys.seq, keys.lastop, *more], args)
        if int(result[0]) in (1, 2):
            first = int(result[1])
            self.release.release(layout, shard, facts)
            self._count_appended(run_id, shard, len(prepared))
            return list(range(first, first + len(prepared)))
        raise append_refusal(run_id, shard, epoch, result, [p.grain for p in prepared], basis)

    def commit(self, run_id: str, reports: Sequence[GrainCommitted], *,
               token: str | None = None) -> list[CommitVerdict]:
        layout = self._layout(run_id)
        groups = prepare_reports(layout, reports)
        token = token or next_token()
        refs: dict[int, str] = {}
        calls: list[tuple[LuaScript, list[str], list[Any]]] = []
        positions: list[list[int]] = []
        # Payload segments are written before the scripts run and are not deleted if
        # anything below raises: the outcome is then unknown (a lost reply may hide a
        # commit), and a segment's name is shared with any earlier commit of the same
        # reports. `rayorch gc` collects the objects no fact refers to
        # (docs/topics/PAYLOADS.md, "Payload segments and uncertain commits").
        for shard, items in groups.items():
            keys = ShardKeys(run_id, shard)
            grains = self._grain_keys(run_id, shard)
            more = KeyIndex()  # the streams and Grain buckets of the shard's reports
            args: list[Any] = [len(items), token]
            barrier_args: list[bytes] = []
            slim = self.release.externalize(layout, shard, [item.report for item in items])
            refs.update({items[at].position: str(r.payload_ref) for at, r in slim.items()})
            for at, item in enumerate(items):
                report = item.report
                encoded = encode_fact(slim.get(at, report))
                bucket = more.index(grains.of(report.path))
                index = more.index(keys.facts(item.domain))
                if item.installs_barrier:
                    args.extend((item.grain, bucket, item.generation, item.barrier, "1", index,
                                 encoded))
                    barrier_args.append(encode_fact(barrier_fact(report)))
                else:
                    args.extend((item.grain, bucket, item.generation, item.barrier, "0", index,
                                 encoded))
            calls.append((COMMIT_BATCH, [keys.barriers, keys.seq, *more], args + barrier_args))
            positions.append([item.position for item in items])
        results = self._eval_many(calls)
        verdicts = [CommitVerdict.NOT_DISPATCHED] * len(reports)
        for shard_positions, result in zip(positions, results):
            for position, code in zip(shard_positions, result):
                verdicts[position] = VERDICTS[int(code)]
        if refs:
            self._delete_rejected_payloads(layout, reports, verdicts, refs)
        return verdicts

    def _delete_rejected_payloads(self, layout: RunLayout, reports: Sequence[GrainCommitted],
                                  verdicts: list[CommitVerdict], refs: dict[int, str]) -> None:
        def sealed_generations(positions: list[int]) -> list[int | None]:
            client = self._client()
            with self._errors():
                pipe = client.pipeline(transaction=False)
                for position in positions:
                    report = reports[position]
                    shard = layout.info.shard_of(report.path[0])
                    grains = self._grain_keys(layout.info.run_id, shard)
                    pipe.hget(grains.of(report.path), grain_field(report.call, report.path))
                phases = pipe.execute()
            return [None if p is None else p[1] for p in map(decode_phase, phases)]

        self.release.delete_rejected(reports, verdicts, refs, sealed_generations)

    def read(
        self,
        run_id: str,
        shard: int,
        after: int = 0,
        *,
        limit: int = DEFAULT_READ_LIMIT,
        block_s: float | None = None,
        domain: DomainId | None = None,
        payloads: bool = True,
    ) -> list[StoredFact]:
        """See :meth:`LineageStore.read`; ``payloads=False`` leaves payload refs unresolved.

        Archived facts are read from the run's archive, the rest from the streams: one
        order, each seq once (:mod:`.redis_archive`)."""
        self._layout(run_id).check_shard(shard)
        archive = self._archive_of(run_id)
        if archive is not None:
            return self._read_merged(archive, run_id, shard, after, limit=limit,
                                     block_s=block_s, domain=domain, payloads=payloads)
        return self._read_live(run_id, shard, after, limit=limit, block_s=block_s,
                               domain=domain, payloads=payloads)

    def _read_live(self, run_id: str, shard: int, after: int, *, limit: int,
                   block_s: float | None, domain: DomainId | None, payloads: bool
                   ) -> list[StoredFact]:
        layout = self._layout(run_id)
        keys = ShardKeys(run_id, shard)
        domains = (domain,) if domain is not None else layout.domains
        by_key = {keys.facts(d).encode(): d for d in domains}
        client = self._client()
        start = f"{after}-0"
        deadline = None if block_s is None else time.monotonic() + block_s
        while True:
            block_ms = None
            if deadline is not None:
                remaining = min(deadline - time.monotonic(), MAX_BLOCK_S)
                block_ms = max(1, int(remaining * 1000))
            with self._errors():
                response: Any = client.xread(
                    {k: start for k in by_key}, count=limit, block=block_ms
                )
            if response or deadline is None or time.monotonic() >= deadline:
                break
        return self._merge(response or [], by_key, limit, payloads)

    def _merge(
        self, response: list[Any], by_key: dict[bytes, DomainId], limit: int, payloads: bool
    ) -> list[StoredFact]:
        """Per-Domain XREAD results as one order of facts (:func:`merge_streams`)."""
        return [self._stored(seq, domain, blob, payloads)
                for seq, domain, blob in merge_streams(response, by_key, limit)]

    def _stored(self, seq: int, domain: DomainId, blob: bytes, payloads: bool) -> StoredFact:
        fact = decode_fact(blob)
        if payloads and isinstance(fact, GrainCommitted | GrainReused) \
                and fact.payload_ref is not None and fact.outputs is None:
            fact = self.resolve_payload(fact)
        return StoredFact(seq, domain, fact)

    def resolve_payload(self, fact: Sealing) -> Sealing:
        if fact.payload_ref is None:
            return fact
        return self.payloads_of(run_of_ref(fact.payload_ref)).resolve(fact)

    def grain_phase(self, run_id: str, shard: int, call: CallId, path: EntityPath
                    ) -> tuple[GrainPhase, int] | None:
        self._layout(run_id).check_shard(shard)
        with self._errors():
            raw = self._client().hget(self._grain_keys(run_id, shard).of(path),
                                      grain_field(call, path))
        return decode_phase(raw)

    def barriers(self, run_id: str, shard: int) -> frozenset[tuple[CallId, EntityPath]]:
        self._layout(run_id).check_shard(shard)
        with self._errors():
            members = self._client().smembers(ShardKeys(run_id, shard).barriers)
        return frozenset(split_field(decode_text(member)) for member in members)
