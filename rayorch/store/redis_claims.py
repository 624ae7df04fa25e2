"""The Redis store's content claims (:class:`~rayorch.store.claims.ContentClaims`).

One hash per scope, ``ro:{claims:<scope>}`` (its own hash slot on a Redis Cluster); a
claim is one call of ``lua/claim-content-1.lua``, which reads every key before it writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from rayorch.store.claims import ContentClaims, check_claim, check_scope
from rayorch.store.keys import claims_key
from rayorch.store.scripts import CLAIM_CONTENT, LuaScript


def _text(value: Any) -> str | None:
    if value is None or value is False:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisAccess:
    """What ``RedisStore`` gives its mixins (claims, archiving): scripts, the client, and
    its error translation."""

    def _eval(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        raise NotImplementedError

    def _client(self) -> Any:
        raise NotImplementedError

    def _errors(self) -> AbstractContextManager[None]:
        raise NotImplementedError

    def _scan(self, pattern: str, *, near: str | None = None) -> list[str]:
        """Keys matching a SCAN MATCH ``pattern``; ``near``: a key in the same hash slot as
        every match (the Redis Cluster store then scans that slot's master only)."""
        with self._errors():
            return [_text(k) or "" for k in self._client().scan_iter(match=pattern, count=1000)]


class RedisClaims(RedisAccess, ContentClaims):
    """Claims of a Redis-backed store; the store gives :meth:`_eval` and :meth:`_client`."""

    def claim(self, scope: str, keys: Sequence[str], claimant: str) -> tuple[str | None, ...]:
        check_claim(scope, keys, claimant)
        answer = self._eval(CLAIM_CONTENT, [claims_key(scope)], [claimant, *keys])
        return tuple(_text(v) for v in answer)

    def holders(self, scope: str, keys: Sequence[str]) -> tuple[str | None, ...]:
        check_scope(scope)
        if not keys:
            return ()
        with self._errors():
            values = self._client().hmget(claims_key(scope), list(keys))
        return tuple(_text(v) for v in values)

    def claims_of(self, scope: str) -> dict[str, str]:
        check_scope(scope)
        with self._errors():
            table = self._client().hgetall(claims_key(scope))
        return {str(_text(k)): str(_text(v)) for k, v in table.items()}

    def delete_claims(self, scope: str) -> None:
        check_scope(scope)
        with self._errors():
            self._client().delete(claims_key(scope))


__all__ = ["RedisClaims"]
