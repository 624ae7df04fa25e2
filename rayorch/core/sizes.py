"""Byte sizes as people write them: ``1.5GB``, ``800MiB``, ``64MB``, ``2048`` (bytes).

One parser for every option that takes a size (a module's ``max_rss``, the CLI's
``--actor-max-rss``). Decimal units are powers of 1000, binary ones (``KiB``, ``MiB``,
``GiB``, ``TiB``) powers of 1024, as their names say.

>>> parse_byte_size("1.5GB"), parse_byte_size("800MiB"), parse_byte_size(4096)
(1500000000, 838860800, 4096)
>>> format_byte_size(1_610_612_736)
'1.6 GB'
"""

from __future__ import annotations

import math
import re

UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
         "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
         "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_byte_size(value: object) -> int:
    """``value`` (an int of bytes, or a number with a unit) as a whole number of bytes > 0;
    ``ValueError`` saying what is accepted otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"a size is a number of bytes or a text like '1.5GB', not {value!r}")
    if isinstance(value, int):
        number, unit = float(value), ""
    elif isinstance(value, float):
        number, unit = value, ""
    elif isinstance(value, str) and (match := _SIZE.match(value)):
        number, unit = float(match.group(1)), match.group(2).lower()
    else:
        raise ValueError(f"a size is a number of bytes or a text like '1.5GB' or '800MiB', "
                         f"not {str(value)[:40]!r}")
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit[:10]!r} in a size: use B, KB, MB, GB, TB or "
                         "KiB, MiB, GiB, TiB")
    size = number * UNITS[unit]
    if not math.isfinite(size) or size < 1:
        raise ValueError(f"a size is at least one byte, not {str(value)[:40]!r}")
    return int(size)


def format_byte_size(size: float) -> str:
    """``size`` bytes in the largest decimal unit that keeps it >= 1, one decimal."""
    for unit, factor in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{int(size)} B"


__all__ = ["format_byte_size", "parse_byte_size"]
