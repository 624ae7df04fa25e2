"""Every Redis key of the lineage store is built here, and nowhere else.

All keys of one shard share the hash tag ``{<run>:<shard>}``, so a Lua script that
touches one shard stays in one Redis Cluster slot::

    ro:{<run>}:meta                     hash    run description (plan, fingerprint, config)
    ro:runs                             set     ids of all runs
    ro:{<run>}:manifest                 string  msgpack: pipeline import path, args, sources
    ro:{<run>}:drivers                  zset    driver id -> heartbeat deadline (unix ms)
    ro:{<run>}:done                     set     shards whose sources are all complete
    ro:{<run>:<k>}:facts:<domain>       stream  shard k's facts of one Domain (id = seq-0)
    ro:{<run>:<k>}:grains               hash    "call|path" -> "phase:generation[:token]"
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


def barrier_member(call: CallId, parent: Path) -> str:
    """The barrier-set member of a GroupFailure barrier on ``(call, parent)``."""
    return f"{call}|{format_path(parent)}"


def claims_key(scope: str) -> str:
    """The hash of a dedup scope's content claims (its own hash slot)."""
    return f"{PREFIX}:{{claims:{scope}}}"


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
        return f"{PREFIX}:{self.tag}:grains"

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
        """Every key of the shard (for deleting a run)."""
        fixed = [self.grains, self.barriers, self.lease, self.holder, self.epoch, self.seq,
                 self.lastop, self.payload_live, self.payload_sources, self.archived]
        return fixed + [self.facts(d) for d in domains]


__all__ = ["RUNS_KEY", "ShardKeys", "barrier_member", "claims_key", "done_key", "drivers_key",
           "grain_field", "manifest_key", "meta_key", "pools_key", "valid_run_id"]
