"""What an option's value may be: the argparse types tdu's commands share."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from ..plan import sizes
from ..plan.splits import MAX_ROW_COUNT, MAX_SPLIT_BYTES


def parse_size(text: str) -> int:
    """'134217728', '128MiB', '64MB', '1.5GiB' -> bytes (plan/sizes.py)."""
    try:
        value = sizes.parse_size("size", text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 1048576, 64MiB, 128MB, 1GiB)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    if value > MAX_SPLIT_BYTES:
        raise argparse.ArgumentTypeError(f"size must be <= {MAX_SPLIT_BYTES:,} bytes: {text!r}")
    return value


def int_at_least(minimum: int, maximum: int = MAX_ROW_COUNT) -> Callable[[str], int]:
    """An argparse type: an integer in [``minimum``, ``maximum``]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}: {text!r}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum:,}: {text!r}")
        return value

    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def storage_option(text: str) -> tuple[str, Any]:
    """An argparse type: ``KEY=VALUE``, the value parsed as JSON where it parses."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r} (example: anon=true)")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def storage_options(args: argparse.Namespace) -> dict | None:
    """The repeated ``--storage-option`` values as the library's ``storage_options``."""
    return dict(args.storage_option) if args.storage_option else None
