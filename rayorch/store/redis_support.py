"""Helpers of the Redis store: its reconnect policy, URL redaction, error and reply decoding."""

from __future__ import annotations

from typing import Any

from redis.exceptions import AuthenticationError, AuthorizationError
from redis.retry import Retry

from rayorch.core.vocabulary import GrainPhase
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


def seq_of(entry_id: bytes) -> int:
    return int(entry_id.split(b"-", 1)[0])


__all__ = ["ReconnectRetry", "decode_phase", "decode_text", "is_tls_failure", "one_line",
           "parse_version", "redact_url", "seq_of"]
