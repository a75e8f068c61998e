"""Batch columns of nested Arrow columns: a struct is one column per leaf, named
``parent.child`` (deeper: ``a.b.c``); a map is two list columns, ``m.keys`` and ``m.values``.

``columns=["st"]`` selects every leaf of struct ``st``, ``columns=["st.a"]`` one; a name that is a
top-level column of the files is always that column. Files are read by top-level column, and
the leaves are taken out of the decoded rows (zero-copy apart from validity: a null struct row
is a null in each of its leaves).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

import pyarrow as pa

from ..errors import UnknownColumnsError
from .forms import holds_mask
from .nulls import MASK_SUFFIX

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    from ..formats._lazy import compute as pc  # imported when first used

KEYS, VALUES = "keys", "values"


class BatchColumn(NamedTuple):
    """One column of a batch: its name, the top-level column it comes from and the steps into it
    (a struct field's index, or KEYS / VALUES of a map), and its Arrow type."""

    name: str
    top: str
    path: tuple[int | str, ...]
    type: pa.DataType


def _expand(name: str, top: str, path: tuple[int | str, ...], kind: pa.DataType) -> list[BatchColumn]:
    if pa.types.is_struct(kind):
        out = []
        for index in range(kind.num_fields):
            child = kind.field(index)
            out.extend(_expand(f"{name}.{child.name}", top, (*path, index), child.type))
        return out
    if pa.types.is_map(kind):
        keys = _expand(f"{name}.{KEYS}", top, (*path, KEYS), pa.list_(kind.key_type))
        return keys + _expand(f"{name}.{VALUES}", top, (*path, VALUES), pa.list_(kind.item_type))
    return [BatchColumn(name, top, path, kind)]


def batch_columns(schema: pa.Schema) -> list[BatchColumn]:
    """Every batch column of ``schema``, in schema order."""
    return [column for field in schema for column in _expand(field.name, field.name, (), field.type)]


def select(schema: pa.Schema, columns: Sequence[str] | None) -> list[BatchColumn]:
    """The batch columns ``columns`` names (a top-level column, a struct / map, or one of their
    leaves), in that order; ValueError naming every unknown name."""
    every = batch_columns(schema)
    if columns is None:
        return every
    chosen: list[BatchColumn] = []
    unknown = []
    for name in columns:
        if schema.get_field_index(name) >= 0:
            found = [c for c in every if c.top == name]
        else:
            found = [c for c in every if c.name == name or c.name.startswith(name + ".")]
        if not found:
            unknown.append(name)
        chosen.extend(c for c in found if c not in chosen)
    if unknown:
        names = [c.name for c in every]
        raise UnknownColumnsError(f"columns {unknown} are not in the data; its columns are {names}")
    return chosen


def top_columns(selected: Sequence[BatchColumn]) -> list[str]:
    """The top-level columns to read for ``selected``, in order of first use."""
    return list(dict.fromkeys(c.top for c in selected))


def is_flat(selected: Sequence[BatchColumn]) -> bool:
    """Whether the batch columns are top-level columns as they are (nothing to take apart)."""
    return all(not c.path and c.name == c.top for c in selected)


def read_selection(selected: list[BatchColumn], columns: list[str] | None) -> tuple[list[str] | None, list[BatchColumn] | None]:
    """The columns to read (``columns`` as given, None: all) and, when structs or maps are taken
    apart, the batch columns ``selected`` (else None)."""
    if is_flat(selected):
        return columns, None
    return top_columns(selected), selected


def _map_part(array: pa.Array, part: str) -> pa.Array:
    items = array.keys if part == KEYS else array.items
    offsets = pa.array(array.offsets.to_numpy())  # (from_arrays takes no validity with sliced offsets)
    return pa.ListArray.from_arrays(offsets, items, mask=array.is_null() if array.null_count else None)


def _step(column: pa.ChunkedArray, step: int | str) -> pa.ChunkedArray:
    if isinstance(step, int):
        return pc.struct_field(column, [step])  # a null struct row is null in the field
    chunks = [_map_part(chunk, step) for chunk in column.chunks]
    kind = pa.list_(column.type.key_type if step == KEYS else column.type.item_type)
    return pa.chunked_array(chunks, type=kind)


def flatten(table: pa.Table, selected: Sequence[BatchColumn]) -> pa.Table:
    """``table`` (top-level columns) as the batch columns ``selected``."""
    arrays, names = [], []
    for column in selected:
        array = table.column(column.top)
        for step in column.path:
            array = _step(array, step)
        arrays.append(array)
        names.append(column.name)
    return pa.Table.from_arrays(arrays, names=names)


def batch_schema(selected: Sequence[BatchColumn], masks: bool) -> pa.Schema:
    """The Arrow types of a batch's columns (the files' types: a timestamp keeps its unit and time
    zone, a decimal its precision and scale), with nulls="mask"'s bool masks after each."""
    fields = []
    for column in selected:
        fields.append(pa.field(column.name, column.type))
        if masks and holds_mask(column.type):
            fields.append(pa.field(column.name + MASK_SUFFIX, pa.bool_(), nullable=False))
    return pa.schema(fields)
