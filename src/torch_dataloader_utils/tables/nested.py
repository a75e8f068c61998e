"""A nested Arrow type's child fields, as tables match them: each child's path, and the type
rebuilt with other children."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa


def stored_path(path: tuple[str, ...], kind: pa.DataType, child: int) -> tuple[str, ...]:
    """The path of a nested field: the names of the structs' fields leading to it, with ``[]`` for
    a list's element and ``{key}`` / ``{value}`` for a map's (their own names differ by writer)."""
    if pa.types.is_struct(kind):
        return (*path, kind.field(child).name)
    if pa.types.is_map(kind):
        return (*path, "{key}" if child == 0 else "{value}")
    return (*path, "[]")


def with_children(kind: pa.DataType, child: Callable[[pa.Field, int], pa.Field]) -> pa.DataType:
    """``kind`` with each child field (a struct's fields, a list's value, a map's key and item)
    replaced by ``child(field, index)``; other types as they are."""
    if pa.types.is_struct(kind):
        return pa.struct([child(kind.field(i), i) for i in range(kind.num_fields)])
    if pa.types.is_map(kind):
        return pa.map_(child(kind.key_field, 0), child(kind.item_field, 1), kind.keys_sorted)
    if pa.types.is_fixed_size_list(kind):
        return pa.list_(child(kind.value_field, 0), kind.list_size)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return (pa.list_ if pa.types.is_list(kind) else pa.large_list)(child(kind.value_field, 0))
    return kind


def same_nesting(kind: pa.DataType, other: pa.DataType) -> bool:
    """Whether both are variable-size lists, or both maps: their children correspond by index."""
    lists = (pa.types.is_list, pa.types.is_large_list)
    return (any(test(kind) for test in lists) and any(test(other) for test in lists)) or (pa.types.is_map(kind) and pa.types.is_map(other))


def child_type(kind: pa.DataType, index: int) -> pa.DataType:
    """The type of child ``index`` of a list (its values) or a map (0: its keys, 1: its items)."""
    if pa.types.is_map(kind):
        return kind.key_type if index == 0 else kind.item_type
    return kind.value_type
