"""Every Redis key of the lineage store is built here, and nowhere else.

All keys of one shard share the hash tag ``{<run>:<shard>}``, so a Lua script that
touches one shard stays in one Redis Cluster slot::

    ro:{<run>}:meta                     hash    run description (plan, fingerprint, config)
    ro:runs                             set     ids of all runs
    ro:{<run>}:manifest                 string  msgpack: pipeline import path, args, sources
    ro:{<run>}:drivers                  zset    driver id -> heartbeat deadline (unix ms)
    ro:{<run>}:done                     set     shards whose sources are all complete
    ro:{<run>:<k>}:facts:<domain>       stream  shard k's facts of one Domain (id = seq-0)
    ro:{<run>:<k>}:grains:<bucket>      hash    "call|path" -> "phase:generation[:token]": the
                                                Grain table, one small hash per bucket
                                                (:class:`GrainKeys`: "12" holds source 12's
                                                root Grains, "12.3" every Grain under its
                                                child 3; in a plan of one expansion level,
                                                "12" holds all of source 12's); a run opened
                                                before buckets (no "grain_table" in its
                                                meta) keeps the one hash ro:{<run>:<k>}:grains
    ro:{<run>:<k>}:barriers             set     "call|parent_path" of GroupFailure barriers
    ro:{<run>:<k>}:lease                string  "epoch|token|driver", with the lease TTL
    ro:{<run>:<k>}:holder               string  "epoch|token|driver" of the last acquisition
                                                (no TTL: who continued the shard, for fencing)
    ro:{<run>:<k>}:epoch                string  last epoch handed out (never goes backwards)
    ro:{<run>:<k>}:seq                  string  last sequence number of the shard's facts
    ro:{<run>:<k>}:lastop               string  token of the last driver append (retry safety)
    ro:{<run>:<k>}:archived             string  last seq the run's archive holds (the facts up
                                                to it may be trimmed from the streams)
    ro:{claims:<scope>}                 hash    content key -> claimant (a dedup index,
                                                rayorch/store/claims.py)
"""

from __future__ import annotations

from dataclasses import dataclass

from rayorch.core.ids import CallId, DomainId, Path, format_path
from rayorch.core.names import valid_run_id

PREFIX = "ro"
RUNS_KEY = f"{PREFIX}:runs"


def meta_key(run_id: str) -> str:
    return f"{PREFIX}:{{{run_id}}}:meta"


def manifest_key(run_id: str) -> str:
    return f"{PREFIX}:{{{run_id}}}:manifest"


def drivers_key(run_id: str) -> str:
    return f"{PREFIX}:{{{run_id}}}:drivers"


def done_key(run_id: str) -> str:
    return f"{PREFIX}:{{{run_id}}}:done"


def pools_key(run_id: str) -> str:
    return f"{PREFIX}:{{{run_id}}}:pools"


def grain_field(call: CallId, path: Path) -> str:
    """The Grain hash field (and differential-test key) of one Grain."""
    return f"{call}|{format_path(path)}"


def grain_bucket(path: Path, *, by_child: bool = True) -> str:
    """The bucket of a Grain's entry: its source, then (``by_child``) its first child
    ordinal if any.

    ``(12,)`` -> ``"12"``, ``(12, 3)`` and ``(12, 3, 5)`` -> ``"12.3"`` (``"12"`` when not
    ``by_child``). A bucket holds one page's Grains on the region path (~10 entries), or one
    source's on a path of one expansion level (a root Grain or two and one per page), so
    Redis keeps it as a listpack (~40 B an entry) instead of entries of one big hashtable
    (~85 B); a delivered source's buckets go whole.
    """
    return str(path[0]) if len(path) == 1 or not by_child else f"{path[0]}.{path[1]}"


def barrier_member(call: CallId, parent: Path) -> str:
    """The barrier-set member of a GroupFailure barrier on ``(call, parent)``."""
    return f"{call}|{format_path(parent)}"


def claims_key(scope: str) -> str:
    """The hash of a dedup scope's content claims (its own hash slot)."""
    return f"{PREFIX}:{{claims:{scope}}}"


def grain_buckets_of_run(run_id: str) -> str:
    """SCAN MATCH pattern of every Grain bucket of every shard of a run (a run id has no
    ``:``, ``*`` or ``}``, so nothing of another run matches)."""
    return f"{PREFIX}:{{{run_id}:*}}:grains:*"


@dataclass(frozen=True, slots=True)
class ShardKeys:
    """The keys of one shard of one run."""

    run_id: str
    shard: int

    @property
    def tag(self) -> str:
        return f"{{{self.run_id}:{self.shard}}}"

    def facts(self, domain: DomainId) -> str:
        return f"{PREFIX}:{self.tag}:facts:{domain}"

    @property
    def grains(self) -> str:
        """The one Grain hash of a run opened before buckets (also the buckets' prefix)."""
        return f"{PREFIX}:{self.tag}:grains"

    def grain_bucket(self, bucket: str) -> str:
        """The hash of one Grain bucket (:func:`grain_bucket`)."""
        return f"{self.grains}:{bucket}"

    @property
    def grain_buckets(self) -> str:
        """SCAN MATCH pattern of every Grain bucket of the shard."""
        return f"{self.grains}:*"

    @property
    def barriers(self) -> str:
        return f"{PREFIX}:{self.tag}:barriers"

    @property
    def lease(self) -> str:
        return f"{PREFIX}:{self.tag}:lease"

    @property
    def holder(self) -> str:
        return f"{PREFIX}:{self.tag}:holder"

    @property
    def epoch(self) -> str:
        return f"{PREFIX}:{self.tag}:epoch"

    @property
    def seq(self) -> str:
        return f"{PREFIX}:{self.tag}:seq"

    @property
    def lastop(self) -> str:
        return f"{PREFIX}:{self.tag}:lastop"

    @property
    def archived(self) -> str:
        """Last seq of the shard that archive segments hold (:mod:`rayorch.store.archive`)."""
        return f"{PREFIX}:{self.tag}:archived"

    @property
    def payload_live(self) -> str:
        """Hash: payload segment -> how many undelivered sources have a value in it."""
        return f"{PREFIX}:{self.tag}:payload_live"

    @property
    def payload_sources(self) -> str:
        """Hash: source index -> the segments holding its freeable values."""
        return f"{PREFIX}:{self.tag}:payload_sources"

    def all_keys(self, domains: tuple[DomainId, ...]) -> list[str]:
        """Every key of the shard but its Grain buckets (found by SCAN: :class:`GrainKeys`)."""
        fixed = [self.grains, self.barriers, self.lease, self.holder, self.epoch, self.seq,
                 self.lastop, self.payload_live, self.payload_sources, self.archived]
        return fixed + [self.facts(d) for d in domains]


GRAIN_TABLE_FIELD = "grain_table"  # run meta field: how the run keeps its Grain table
BY_CHILD = "by-child"  # a bucket per source and per (source, first child ordinal)
BY_SOURCE = "by-source"  # a bucket per source
GRAIN_TABLES = (BY_CHILD, BY_SOURCE)  # a run without the field: one hash per shard


def grain_table_for(max_depth: int) -> str:
    """The buckets of a new run whose deepest Domain has ``max_depth``: by child when
    Domains nest (a page's regions), else by source (~10 pages' entries share a key)."""
    return BY_CHILD if max_depth >= 2 else BY_SOURCE


@dataclass(frozen=True, slots=True)
class GrainKeys:
    """Where one shard's Grain entries live: bucket hashes (``table``: one of
    :data:`GRAIN_TABLES`), or the one hash ``ShardKeys.grains`` of a run opened before
    buckets (``table=None``)."""

    shard: ShardKeys
    table: str | None = BY_CHILD

    @property
    def bucketed(self) -> bool:
        return self.table is not None

    def of(self, path: Path) -> str:
        """The hash holding the entry of the Grain at ``path``."""
        if self.table is None:
            return self.shard.grains
        return self.shard.grain_bucket(grain_bucket(path, by_child=self.table == BY_CHILD))

    def source_of(self, key: str) -> int | None:
        """The source whose Grains a bucket key holds (None: not a bucket of this shard)."""
        prefix = self.shard.grains + ":"
        if not self.bucketed or not key.startswith(prefix):
            return None
        root = key[len(prefix):].partition(".")[0]
        return int(root) if root.isdigit() else None


class KeyIndex(dict[str, int]):
    """The variable KEYS of a script call: each distinct key once, numbered from 1 in
    the order first asked (a script finds key ``i`` at ``KEYS[fixed + i]``)."""

    def index(self, key: str) -> int:
        at = self.get(key)
        if at is None:
            at = self[key] = len(self) + 1
        return at


__all__ = ["BY_CHILD", "BY_SOURCE", "GRAIN_TABLES", "GRAIN_TABLE_FIELD", "RUNS_KEY", "GrainKeys",
           "KeyIndex", "ShardKeys", "barrier_member", "claims_key", "done_key", "drivers_key",
           "grain_bucket", "grain_buckets_of_run", "grain_field", "grain_table_for",
           "manifest_key", "meta_key", "pools_key", "valid_run_id"]
