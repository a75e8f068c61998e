"""What an option's value may be: the argparse types tdu's commands share."""

from __future__ import annotations

import argparse
import json
import re
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


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def one_per_path(parse: Callable[[str], Any], option: str) -> Callable[[str], Any]:
    """An argparse type for an option that takes a value per PATH: a value that does not parse is
    most often a PATH written after the values, so the error says where PATHs go."""

    def parse_value(text: str) -> Any:
        try:
            return parse(text)
        except (argparse.ArgumentTypeError, ValueError) as error:
            reason = str(error) if isinstance(error, argparse.ArgumentTypeError) else f"not a number: {text!r}"
            if _is_number(text):  # a number out of range: no PATH in the wrong place
                raise argparse.ArgumentTypeError(reason) from None
            raise argparse.ArgumentTypeError(
                f"{reason}; if it is a PATH, write the PATHs before {option}, or end its values with --"
            ) from None

    return parse_value


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


_OPERATORS = ("not in", "in", "==", "!=", "<=", ">=", "=", "<", ">")


def parse_filters(text: str) -> list:
    """An argparse type: ``--filters`` as pyarrow's DNF list form. JSON (``[["label", "<", 10]]``,
    or a list of such lists: any one holds), or ``"COL OP VALUE"`` conditions joined by `` and ``
    (``"label < 10 and name = abc"``; OP one of = == != < <= > >= in, not in; VALUE JSON where it
    parses (``[1, 2]``, ``3``, ``"3"``), else the text)."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError as error:
            raise argparse.ArgumentTypeError(f"--filters is not valid JSON: {error} (example: '[[\"label\", \"<\", 10]]')") from None
        return _dnf(value, text)
    conditions = [part.strip() for part in re.split(r"(?<!\S)and(?!\S)", stripped)]
    if not all(conditions):
        raise argparse.ArgumentTypeError(f"--filters {text!r}: a condition is missing before or after 'and' (example: 'label < 10 and name = abc')")
    return [_condition(part, text) for part in conditions]


def _dnf(value: Any, text: str) -> list:
    def condition(item: Any) -> tuple:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and isinstance(item[1], str)):
            raise argparse.ArgumentTypeError(f"--filters {text!r}: each condition is [column, op, value], got {json.dumps(item)}")
        return (item[0], item[1], item[2])

    if not isinstance(value, list) or not value:
        raise argparse.ArgumentTypeError(f"--filters {text!r}: expected a non-empty list of [column, op, value] conditions")
    if all(isinstance(item, list) and item and isinstance(item[0], list) for item in value):
        return [[condition(item) for item in group] for group in value]  # any one group holds
    return [condition(item) for item in value]


def _condition(part: str, text: str) -> tuple:
    for op in _OPERATORS:
        column, sep, value = part.partition(f" {op} ")
        if sep and column.strip():
            try:
                parsed = json.loads(value.strip())
            except json.JSONDecodeError:
                parsed = value.strip()
            return (column.strip(), op, parsed)
    raise argparse.ArgumentTypeError(
        f"--filters {text!r}: {part!r} is not 'COLUMN OP VALUE' with OP one of {', '.join(_OPERATORS)} (spaces around OP), "
        "nor JSON such as '[[\"label\", \"<\", 10]]'"
    )
