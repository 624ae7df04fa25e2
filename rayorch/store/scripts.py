"""The Lua scripts of the Redis store (``lua/*.lua``), their return codes, and call tokens.

Each script is run by SHA (EVALSHA) and reloaded on NOSCRIPT; its header comment
documents its keys, arguments and answers. A line ``--- @include "name"`` is replaced by
``lua/includes/name.lua`` when the script is loaded (shared helpers, e.g. the lease fence).
Every script call carries a token unique across processes, so a call redone after a lost
reply answers as the first one did.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from rayorch.core.errors import StoreError
from rayorch.core.vocabulary import CommitVerdict
from rayorch.store.errors import (
    FencedError,
    GrainSealedError,
    LeaseLostError,
    LeaseRolledBackError,
    StoreRolledBackError,
)
from rayorch.store.gate import rolled_back_detail, split_field
from rayorch.store.layout import AppendBasis

_LUA_DIR = Path(__file__).parent / "lua"
_INCLUDE = re.compile(r'^--- @include "([a-z-]+)"$', re.MULTILINE)


@dataclass(frozen=True)
class LuaScript:
    """One ``.lua`` file, run by SHA and reloaded when the server lost it."""

    name: str
    source: str

    @cached_property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()


def _load_script(stem: str) -> LuaScript:
    source = (_LUA_DIR / f"{stem}.lua").read_text()
    source = _INCLUDE.sub(lambda m: (_LUA_DIR / "includes" / f"{m[1]}.lua").read_text(), source)
    return LuaScript(stem, source)


COMMIT_BATCH = _load_script("commit-batch-2")
APPEND_FENCED = _load_script("append-fenced-5")
ACQUIRE_LEASE = _load_script("acquire-lease-5")
RENEW_LEASE = _load_script("renew-lease-3")
OPEN_RUN = _load_script("open-run-1")
HEARTBEAT = _load_script("heartbeat-1")
DRIVER_REGISTRY = _load_script("driver-registry-1")
CLAIM_CONTENT = _load_script("claim-content-1")
TRACK_PAYLOADS = _load_script("track-payloads-2")
RELEASE_PAYLOADS = _load_script("release-payloads-2")
TRIM_ARCHIVED = _load_script("trim-archived-3")
RESTORE_ARCHIVED = _load_script("restore-archived-2")

# Return codes of the scripts (see their headers).
LEASE_LOST, FENCED, GRAIN_SEALED, ROLLED_BACK, LEASE_HELD = -10, -11, -12, -14, -20
STORE_ROLLED_BACK = -15  # append-fenced: the store lost what the caller's state rests on
TRIM_FENCED, TRIM_BEHIND = -16, -17  # trim-archived: a lease acquired since; fewer facts
FINGERPRINT_MISMATCH, CONFIG_MISMATCH = -30, -31
VERDICTS = {int(v): v for v in CommitVerdict}  # commit-batch codes -> verdicts
_LEASE_VALUE = re.compile(r"^(\d+)\|([0-9a-f]*)\|(.*)$", re.DOTALL)


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def parse_lease_value(text: str) -> tuple[int, str, str]:
    """``(epoch, token, driver)`` of a lease or holder value (see ``lua/includes/lease.lua``)."""
    match = _LEASE_VALUE.match(text)
    if match:
        return int(match[1]), match[2], match[3]
    epoch, _, driver = text.partition("|")  # written before holder tokens existed
    return int(epoch), "", driver


def lease_refusal(run_id: str, shard: int, epoch: int, result: Sequence[Any]) -> LeaseLostError:
    """The error of a lease script's refusal code (see ``lua/includes/lease.lua``)."""
    code = int(result[0])
    if code == FENCED:
        return FencedError(run_id, shard, epoch, int(result[1]), _text(result[2]))
    if code == ROLLED_BACK:
        return LeaseRolledBackError(run_id, shard, epoch, int(result[1]), _text(result[2]))
    if code == LEASE_LOST:
        return LeaseLostError(run_id, shard, epoch)
    raise StoreError(f"a lease script answered the unknown code {code}")

def append_refusal(run_id: str, shard: int, epoch: int, result: Sequence[Any],
                   grains: Sequence[str], basis: AppendBasis) -> StoreError:
    """The error of a refused ``append-fenced`` (``grains``: the facts' Grain fields)."""
    code = int(result[0])
    if code == STORE_ROLLED_BACK:
        return StoreRolledBackError(run_id, shard, rolled_back_detail(
            *(int(v) for v in result[1:]), sealed=basis.sealed))
    if code == GRAIN_SEALED:
        return GrainSealedError(run_id, shard, [split_field(grains[int(i) - 1])
                                                for i in result[1:]])
    return lease_refusal(run_id, shard, epoch, result)


# Call tokens are "<random prefix of this process>.<counter>"; next() on a count is
# atomic under the GIL, and a forked child draws a prefix of its own. 64 random bits: every
# sealed Grain entry keeps its commit's token, so its length is Redis memory (16 B less an
# entry than a uuid4), and two of 100,000 processes share a prefix with odds of ~3e-10.
_token_prefix = secrets.token_hex(8)
_token_counter = itertools.count(1)


def _new_token_prefix() -> None:
    global _token_prefix
    _token_prefix = secrets.token_hex(8)


os.register_at_fork(after_in_child=_new_token_prefix)


def next_token() -> str:
    """A call token no other call of any process uses (cheaper than a uuid4 per call)."""
    return f"{_token_prefix}.{next(_token_counter)}"
