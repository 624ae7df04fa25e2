"""Text from the store made safe to print: ANSI sequences stripped, control characters escaped.

Causes, ids and values in a lineage store are untrusted: a UDF's error message can hold
escape sequences that retitle or clear an operator's terminal. Every line the CLI prints
from the store goes through :func:`sanitize`; causes are stored without ANSI colour codes
(:func:`strip_ansi` where a cause is built). docs/ARCHITECTURE.md, "Trust model".
"""

from __future__ import annotations

import re
import unicodedata

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), other two-byte ESC sequences, and
# the 8-bit CSI/OSC introducers.
_ANSI = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b\]|\x9d).*?(?:\x07|\x1b\\|\x9c)"
    r"|\x1b[P^_X].*?(?:\x1b\\|\x9c)"
    r"|\x1b[@-Z\\-_]"
    r"|\x1b",
    re.DOTALL,
)


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (Ray's colour codes, OSC titles, ...)."""
    return _ANSI.sub("", text) if ("\x1b" in text or "\x9b" in text or "\x9d" in text) else text


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch == "\n":
        return "\\n"
    if ch == "\r":
        return "\\r"
    if ch == "\t":
        return "\\t"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _unsafe(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")


def sanitize(text: object, *, newlines: bool = False) -> str:
    """``text`` as one printable string: ANSI stripped, other control characters escaped.

    ``newlines=True`` keeps ``\\n`` (for multi-line messages the CLI itself built).
    """
    out = strip_ansi(text if isinstance(text, str) else str(text))
    if not any(_unsafe(ch) for ch in out):
        return out
    return "".join(
        ch if not _unsafe(ch) or (newlines and ch == "\n") else _escape(ch) for ch in out
    )


def _json_escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_safe(text: str) -> str:
    """JSON text with every control/format character inside its strings as a ``\\u`` escape.

    orjson escapes only ASCII controls; C1 controls (``\\x9b`` is an 8-bit CSI) and
    bidirectional overrides would still reach the terminal.
    """
    if not any(_unsafe(ch) for ch in text):
        return text
    return "".join(_json_escape(ch) if _unsafe(ch) and ch != "\n" else ch for ch in text)


__all__ = ["json_safe", "sanitize", "strip_ansi"]
