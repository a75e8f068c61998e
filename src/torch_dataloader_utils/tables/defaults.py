"""Iceberg column defaults: the value a field takes in the rows of data files written before it was
added (the field's ``initial-default``; without one, those rows hold nulls).

A top-level column's default is a constant of each file that does not store the column
(``TableFile.value_if_absent``). A struct field's default (also of a struct in a list's elements
or a map's values) is added to the struct of each file whose struct lacks that field:
``with_defaults`` gives the type the file's column is read as, ``fill_defaults`` builds it so.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from .nested import child_type, same_nesting, stored_path, with_children

#: a field's names from its top-level column down, as the table names them (``nested.stored_path``:
#: "[]" is a list's element, "{value}" a map's value)
Path = tuple[str, ...]


def with_defaults(
    kind: pa.DataType, table_kind: pa.DataType | None, path: Path, defaults: Mapping[Path, pa.Scalar]
) -> tuple[pa.DataType, dict[Path, pa.Scalar]]:
    """``kind`` (a stored column's type, named as the table names it) with every struct field the
    table gives a default and ``kind`` lacks added, typed as its default; and the fields added."""
    if table_kind is None:
        return kind, {}
    added: dict[Path, pa.Scalar] = {}
    if same_nesting(kind, table_kind):  # a list's element, a map's key and value

        def child(item: pa.Field, index: int) -> pa.Field:
            inner, found = with_defaults(item.type, child_type(table_kind, index), stored_path(path, kind, index), defaults)
            added.update(found)
            return item.with_type(inner)

        rebuilt = with_children(kind, child)
        return (rebuilt if added else kind), added
    if not (pa.types.is_struct(kind) and pa.types.is_struct(table_kind)):
        return kind, {}
    fields = []
    for item in kind:
        index = table_kind.get_field_index(item.name)
        inner, found = with_defaults(item.type, table_kind.field(index).type if index >= 0 else None, path + (item.name,), defaults)
        added.update(found)
        fields.append(item.with_type(inner))
    for item in table_kind:
        value = defaults.get(path + (item.name,))
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
    mask = array.is_null() if array.null_count else None
    if pa.types.is_map(kind):  # (offsets into the whole values array, as a slice's are)
        items = _filled(array.items, kind.item_type, added, stored_path(path, kind, 1))
        return pa.MapArray.from_arrays(array.offsets, array.keys, items, type=kind, mask=mask)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        values = _filled(array.values, kind.value_type, added, stored_path(path, kind, 0))
        build = pa.LargeListArray if pa.types.is_large_list(kind) else pa.ListArray
        return build.from_arrays(array.offsets, values, type=kind, mask=mask)
    children = array.flatten()  # (the parent's offset applied; its nulls are set again below)
    arrays = []
    for item in kind:
        index = array.type.get_field_index(item.name)
        if index >= 0:
            arrays.append(_filled(children[index], item.type, added, path + (item.name,)))
        else:
            arrays.append(pa.repeat(added[path + (item.name,)], len(array)).cast(item.type))
    return pa.StructArray.from_arrays(arrays, fields=list(kind), mask=mask)

