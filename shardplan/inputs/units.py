"""Byte and bandwidth units, and parsing of human sizes ("24GB", "1.3B", "1M").

Capacities are reported in GiB (2**30) and bandwidths in GB/s (10**9) (docs/architecture.md, principle 3).
GPU memory sizes written by vendors as "24 GB" are binary (24 GiB of HBM/GDDR), so a capacity
string is read as binary; a parameter count or token count is decimal.
"""

from __future__ import annotations

import re

from shardplan.support.errors import ShardplanError
from shardplan.support.limits import MAX_BYTES, MAX_DIGITS, MAX_TOKENS, _shown

KiB = 2**10
MiB = 2**20
GiB = 2**30
TiB = 2**40
GB = 10**9

_CAPACITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(k|m|g|t)(?:i?b)?\s*$", re.IGNORECASE)
_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmbt]?)\s*$", re.IGNORECASE)
_BINARY = {"k": KiB, "m": MiB, "g": GiB, "t": TiB}
_DECIMAL = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


def _too_long(number_text: str) -> bool:
    """More significant digits than any bounded value has (refused before float()/int() see it)."""
    return len(number_text.split(".")[0].lstrip("0")) > MAX_DIGITS


def _scaled(pattern: re.Pattern, multiples: dict[str, int], text, field: str, expected: str, out_of_range: str) -> float:
    """``text`` read by ``pattern`` as a number and a suffix, times the suffix's multiple; a text it
    does not read is an error saying what was ``expected``, one with too many digits is out of range."""
    match = pattern.match(str(text))
    if not match:
        raise ShardplanError(field, _shown(text), f"expected {expected}")
    if _too_long(match.group(1)):
        raise ShardplanError(field, _shown(text), out_of_range)
    return float(match.group(1)) * multiples[match.group(2).lower()]


def parse_capacity_bytes(text: str, field: str = "capacity", hi: int = MAX_BYTES) -> int:
    """'24GB', '24GiB', '80G', '512MiB' -> bytes, binary multiples (vendor GPU/host RAM convention),
    at most ``hi`` (limits.MAX_BYTES, 1 EiB)."""
    value = _scaled(_CAPACITY, _BINARY, text, field, "a size such as '24GB' or '512MiB'", f"out of range [1, {hi:,}] bytes")
    if value <= 0:
        raise ShardplanError(field, text, "must be positive")
    if value > hi or round(value) < 1:
        raise ShardplanError(field, _shown(text), f"out of range [1, {hi:,}] bytes")
    return int(round(value))


def parse_count(text: str | int | float, field: str = "count", hi: int = MAX_TOKENS, lo: int = 1) -> int:
    """'1M' -> 1_000_000, '1.3B' -> 1_300_000_000, '4096' -> 4096 (decimal multiples), in [lo, hi]
    (default [1, limits.MAX_TOKENS]); NaN, infinities and over-long digit strings are refused."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if isinstance(text, int) and text > hi:
            raise ShardplanError(field, _shown(text), f"out of range [{lo:,}, {hi:,}]")
        value = float(text)
    else:
        value = _scaled(_COUNT, _DECIMAL, text, field, "a number such as 4096, '1M' or '1.3B'",
                        f"out of range [{lo:,}, {hi:,}]")
    if value != value or value in (float("inf"), float("-inf")) or value != int(value) or (value <= 0 and lo >= 1):
        raise ShardplanError(field, _shown(text), "must be a positive whole number")
    if not lo <= value <= hi:
        raise ShardplanError(field, _shown(text), f"out of range [{lo:,}, {hi:,}]")
    return int(value)

