"""Which value a batch holds for a column of each Arrow type (the table in docs/types.md), decided
from the type alone so that planning can refuse a column before any row is read.

- "tensor": integers, floats, bools, decimals, timestamps / dates / times / durations, and
  fixed-size lists of them (an N-D tensor);
- "ragged": variable-length lists of those (a 2-D tensor or ``Ragged``);
- "strings": strings and binary (``list[str]`` / ``list[bytes]``);
- "python": a Python list of pyarrow's own values (``to_pylist``) for everything else a batch can
  hold: fixed-size binary (bytes), the null type (None), lists of strings, of lists (nested lists),
  of structs (dicts) or of maps (lists of (key, value) tuples);
- refused: unions and intervals (no one value per row that both torch and Python agree on).

Structs and maps at the top of a column never get here: ``nested.py`` takes them apart first.
"""

from __future__ import annotations

import functools
from typing import Iterator

import pyarrow as pa

STRING_CHECKS = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)


def is_string(kind: pa.DataType) -> bool:
    return any(check(kind) for check in STRING_CHECKS)


def is_time_count(kind: pa.DataType) -> bool:
    """Timestamps, dates, times and durations: integer counts of a unit (intervals are not one number)."""
    return pa.types.is_temporal(kind) and not pa.types.is_interval(kind)


def is_number(kind: pa.DataType) -> bool:
    """A type whose values are one number each (a tensor element)."""
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind) or pa.types.is_decimal(kind) or is_time_count(kind)


def innermost(kind: pa.DataType) -> pa.DataType:
    while pa.types.is_fixed_size_list(kind):
        kind = kind.value_type
    return kind


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def _nested(kind: pa.DataType) -> Iterator[pa.DataType]:
    yield kind
    if pa.types.is_dictionary(kind):
        yield from _nested(kind.value_type)
        return
    for index in range(getattr(kind, "num_fields", 0)):
        yield from _nested(kind.field(index).type)


def _refused(kind: pa.DataType) -> pa.DataType | None:
    return next((inner for inner in _nested(kind) if pa.types.is_union(inner) or pa.types.is_interval(inner)), None)


@functools.lru_cache(maxsize=256)  # asked for every column of every Arrow chunk converted
def batch_form(kind: pa.DataType) -> str | None:
    """"tensor", "ragged", "strings" or "python" (see above); None when a batch cannot hold it."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if is_string(kind):
        return "strings"
    if is_number(kind) or (pa.types.is_fixed_size_list(kind) and is_number(innermost(kind))):
        return "tensor"
    if _is_list(kind) and is_number(innermost(kind.value_type)):
        return "ragged"
    if _refused(kind) is not None:
        return None
    if pa.types.is_fixed_size_binary(kind) or pa.types.is_null(kind) or getattr(kind, "num_fields", 0):
        return "python"
    return None


def batch_form_problem(kind: pa.DataType) -> str | None:
    """Why a column of Arrow type ``kind`` has no batch value (None when it has one)."""
    if batch_form(kind) is not None:
        return None
    inner = _refused(kind)
    if inner is not None and inner != kind:
        return f"its {inner} values are not supported"
    return "it has no tensor form"


def holds_mask(kind: pa.DataType) -> bool:
    """Whether nulls="mask" gives the column a validity mask (its values are tensors)."""
    return batch_form(kind) in ("tensor", "ragged")
