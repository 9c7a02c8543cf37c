"""Byte and bandwidth units, and parsing of human sizes ("24GB", "1.3B", "1M").

Capacities are reported in GiB (2**30) and bandwidths in GB/s (10**9), as DESIGN.md §3 fixes.
GPU memory sizes written by vendors as "24 GB" are binary (24 GiB of HBM/GDDR), so a capacity
string is read as binary; a parameter count or token count is decimal.
"""

from __future__ import annotations

import re

from shardplan.errors import ShardplanError

KiB = 2**10
MiB = 2**20
GiB = 2**30
TiB = 2**40
GB = 10**9

_CAPACITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(k|m|g|t)(?:i?b)?\s*$", re.IGNORECASE)
_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmbt]?)\s*$", re.IGNORECASE)
_BINARY = {"k": KiB, "m": MiB, "g": GiB, "t": TiB}
_DECIMAL = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


def parse_capacity_bytes(text: str, field: str = "capacity") -> int:
    """'24GB', '24GiB', '80G', '512MiB' -> bytes, binary multiples (vendor GPU/host RAM convention)."""
    match = _CAPACITY.match(str(text))
    if not match:
        raise ShardplanError(field, text, "expected a size such as '24GB' or '512MiB'")
    value = float(match.group(1)) * _BINARY[match.group(2).lower()]
    if value <= 0:
        raise ShardplanError(field, text, "must be positive")
    return int(round(value))


def parse_count(text: str | int | float, field: str = "count") -> int:
    """'1M' -> 1_000_000, '1.3B' -> 1_300_000_000, '4096' -> 4096 (decimal multiples)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        match = _COUNT.match(str(text))
        if not match:
            raise ShardplanError(field, text, "expected a number such as 4096, '1M' or '1.3B'")
        value = float(match.group(1)) * _DECIMAL[match.group(2).lower()]
    if value <= 0 or value != int(value):
        raise ShardplanError(field, text, "must be a positive whole number")
    return int(value)

