"""Byte sizes as users write them: an int, or a string such as "64MiB", "1GB" or "512KiB"."""

from __future__ import annotations

import operator
import re
from typing import Any

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
ACCEPTED = (
    'an int, or a string: a number and a unit B, K/KB, M/MB, G/GB, T/TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), '
    'e.g. "64MiB", "1GB", "512KiB"'
)


def parse_size(name: str, value: Any) -> int:
    """``value`` (an int or a size string) in bytes; a ValueError naming ``name`` and the accepted forms."""
    if isinstance(value, str):
        match = _SIZE.match(value)
        unit = _UNITS.get(match.group(2).lower()) if match else None
        if match is None or unit is None:
            raise ValueError(f"{name} must be {ACCEPTED}; got {value!r}")
        number = match.group(1)
        whole, _, fraction = number.partition(".")
        return (int(whole) * unit) + (int(fraction) * unit // 10 ** len(fraction) if fraction else 0)
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ValueError(f"{name} must be {ACCEPTED}; got {value!r}")
    return operator.index(value)
