"""Helpers of the Redis store: its reconnect policy, URL redaction, error and reply decoding,
the merge of its Domain streams."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from redis.exceptions import AuthenticationError, AuthorizationError
from redis.retry import Retry

from rayorch.core.errors import StoreError
from rayorch.core.ids import DomainId
from rayorch.core.vocabulary import GrainPhase
from rayorch.store.keys import GRAIN_TABLE_FIELD, GRAIN_TABLES
from rayorch.store.registry import redact_url


class ReconnectRetry(Retry):
    """Retry lost connections with backoff, but never a refused login (it will not heal)."""

    def call_with_retry(self, do: Any, fail: Any, is_retryable: Any = None,
                        with_failure_count: bool = False) -> Any:
        def retryable(error: Exception) -> bool:
            if isinstance(error, AuthenticationError | AuthorizationError):
                return False
            if is_tls_failure(error):
                return False
            return is_retryable is None or bool(is_retryable(error))

        return super().call_with_retry(do, fail, retryable, with_failure_count)


def parse_version(text: str) -> tuple[int, ...]:
    """``"7.0.15"`` -> ``(7, 0, 15)``."""
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def is_tls_failure(exc: BaseException) -> bool:
    """A refused TLS handshake (retrying will not help, and the server is running)."""
    import ssl

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    return "SSL" in text or "CERTIFICATE" in text.upper() or "TLS" in text


def decode_text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def decode_phase(raw: bytes | str | None) -> tuple[GrainPhase, int] | None:
    if raw is None:
        return None
    phase, generation = decode_text(raw).split(":")[:2]
    return GrainPhase(int(phase)), int(generation)


def grain_table_of(run_id: str, meta: Mapping[Any, Any]) -> str | None:
    """The buckets a run's meta hash names for its Grain table (:data:`GRAIN_TABLES`; None:
    a run opened before buckets, its one hash); a table this rayorch does not know is
    refused."""
    raw = meta.get(GRAIN_TABLE_FIELD.encode())
    table = None if raw is None else decode_text(raw)
    if table is not None and table not in GRAIN_TABLES:
        raise StoreError(f"run {run_id} keeps its Grain table as {table[:40]!r} (meta field "
                         f"{GRAIN_TABLE_FIELD}), which this version of rayorch does not know: "
                         "open it with the rayorch that wrote it")
    return table


def seq_of(entry_id: bytes) -> int:
    return int(entry_id.split(b"-", 1)[0])


__all__ = ["ReconnectRetry", "decode_phase", "decode_text", "grain_table_of",
           "is_tls_failure", "one_line",
           "parse_version", "redact_url", "seq_of"]


def merge_streams(response: list[Any], by_key: Mapping[bytes, DomainId], limit: int
                  ) -> list[tuple[int, DomainId, bytes]]:
    """Merge per-Domain XREAD results into one order, without gaps: ``(seq, domain, fact
    bytes)``, at most ``limit``.

    A stream that returned ``limit`` entries may hold more below another stream's
    entries, so only entries up to the smallest such stream's last seq are safe.
    """
    bound: int | None = None
    for _, entries in response:
        if len(entries) >= limit:
            last = seq_of(entries[-1][0])
            bound = last if bound is None else min(bound, last)
    merged: list[tuple[int, DomainId, bytes]] = []
    for key, entries in response:
        domain = by_key[key]
        for entry_id, fields in entries:
            seq = seq_of(entry_id)
            if bound is None or seq <= bound:
                merged.append((seq, domain, fields[b"f"]))
    if len(response) > 1:
        merged.sort(key=lambda e: e[0])
    return merged[:limit]
