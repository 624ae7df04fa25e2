"""The Lua scripts of the Redis store (``lua/*.lua``), their return codes, and call tokens.

Each script is run by SHA (EVALSHA) and reloaded on NOSCRIPT; its header comment
documents its keys, arguments and answers. Every script call carries a token unique
across processes, so a call redone after a lost reply answers as the first one did.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import uuid
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from rayorch.core.commit import CommitVerdict

_LUA_DIR = Path(__file__).parent / "lua"


@dataclass(frozen=True)
class LuaScript:
    """One ``.lua`` file, run by SHA and reloaded when the server lost it."""

    name: str
    source: str

    @cached_property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()


def _load_script(stem: str) -> LuaScript:
    return LuaScript(stem, (_LUA_DIR / f"{stem}.lua").read_text())


COMMIT_BATCH = _load_script("commit-batch-3")
APPEND_FENCED = _load_script("append-fenced-4")
ACQUIRE_LEASE = _load_script("acquire-lease-4")
RENEW_LEASE = _load_script("renew-lease-1")
OPEN_RUN = _load_script("open-run-1")
HEARTBEAT = _load_script("heartbeat-1")
LIVE_DRIVERS = _load_script("live-drivers-1")
DRIVER_REGISTRY = _load_script("driver-registry-1")

# Return codes of the scripts (see their headers).
LEASE_LOST, FENCED, GRAIN_SEALED, LEASE_HELD = -10, -11, -12, -20
FINGERPRINT_MISMATCH, CONFIG_MISMATCH = -30, -31
VERDICTS = {int(v): v for v in CommitVerdict}  # commit-batch codes -> verdicts

# Call tokens are "<random prefix of this process>.<counter>"; next() on a count is
# atomic under the GIL, and a forked child draws a prefix of its own.
_token_prefix = uuid.uuid4().hex
_token_counter = itertools.count(1)


def _new_token_prefix() -> None:
    global _token_prefix
    _token_prefix = uuid.uuid4().hex


os.register_at_fork(after_in_child=_new_token_prefix)


def next_token() -> str:
    """A call token no other call of any process uses (cheaper than a uuid4 per call)."""
    return f"{_token_prefix}.{next(_token_counter)}"
