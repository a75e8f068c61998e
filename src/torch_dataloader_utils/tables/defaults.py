"""Iceberg column defaults: the value a field takes in the rows of data files written before it was
added (the field's ``initial-default``; without one, those rows hold nulls).

A top-level column's default is a constant of each file that does not store the column
(``TableFile.value_if_absent``). A struct field's default is added to the struct of each file
whose struct lacks that field: ``with_defaults`` gives the type the file's column is read as,
``fill_defaults`` builds the column so.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

Path = tuple[str, ...]  # a field's names from its top-level column down, as the table names them


def with_defaults(
    kind: pa.DataType, table_kind: pa.DataType | None, path: Path, defaults: Mapping[Path, pa.Scalar]
) -> tuple[pa.DataType, dict[Path, pa.Scalar]]:
    """``kind`` (a stored column's type, named as the table names it) with every struct field the
    table gives a default and ``kind`` lacks added, typed as its default; and the fields added."""
    if not (pa.types.is_struct(kind) and table_kind is not None and pa.types.is_struct(table_kind)):
        return kind, {}
    added: dict[Path, pa.Scalar] = {}
    fields = []
    for item in kind:
        index = table_kind.get_field_index(item.name)
        inner, found = with_defaults(item.type, table_kind.field(index).type if index >= 0 else None, (*path, item.name), defaults)
        added.update(found)
        fields.append(item.with_type(inner))
    for item in table_kind:
        value = defaults.get((*path, item.name))
        if value is not None and kind.get_field_index(item.name) < 0:
            fields.append(pa.field(item.name, value.type))
            added[path + (item.name,)] = value
    return (pa.struct(fields) if added else kind), added


def fill_defaults(column: pa.ChunkedArray, kind: pa.DataType, added: Mapping[Path, pa.Scalar], path: Path) -> pa.ChunkedArray:
    """``column`` as ``kind`` (``with_defaults``): the added fields hold their default in every row."""
    return pa.chunked_array([_filled(chunk, kind, added, path) for chunk in column.chunks], kind)


def _filled(array: pa.Array, kind: pa.DataType, added: Mapping[Path, pa.Scalar], path: Path) -> pa.Array:
    if array.type == kind:
        return array
    children = array.flatten()  # (the parent's offset applied; its nulls are set again below)
    arrays = []
    for item in kind:
        index = array.type.get_field_index(item.name)
        if index >= 0:
            arrays.append(_filled(children[index], item.type, added, (*path, item.name)))
        else:
            arrays.append(pa.repeat(added[path + (item.name,)], len(array)).cast(item.type))
    mask = array.is_null() if array.null_count else None
    return pa.StructArray.from_arrays(arrays, fields=list(kind), mask=mask)
