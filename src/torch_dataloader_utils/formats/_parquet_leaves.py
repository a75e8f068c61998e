"""Private: the Parquet leaf columns of an Arrow type, in the order Parquet lays them out (as
pyarrow writes and reads them): what a footer's column index numbers."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

#: a leaf column's place in its top-level column: the names down to it, "[]" for a list's
#: element, "{key}" / "{value}" for a map's keys and values ("s", "d") for struct s's field d
Path = tuple[str, ...]
ELEMENT, KEY, VALUE = "[]", "{key}", "{value}"

_LISTS = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list, pa.types.is_list_view, pa.types.is_large_list_view)


def leaf_paths(kind: pa.DataType, path: Path) -> Iterator[tuple[Path, pa.DataType]]:
    """The leaf columns of a column of type ``kind`` at ``path``, with their types, in order."""
    if isinstance(kind, pa.ExtensionType):
        kind = kind.storage_type
    if pa.types.is_struct(kind):
        for field in kind:
            yield from leaf_paths(field.type, (*path, field.name))
    elif pa.types.is_map(kind):
        yield from leaf_paths(kind.key_type, (*path, KEY))
        yield from leaf_paths(kind.item_type, (*path, VALUE))
    elif any(test(kind) for test in _LISTS):
        yield from leaf_paths(kind.value_type, (*path, ELEMENT))
    else:
        yield path, kind


def leaf_count(kind: pa.DataType) -> int:
    """How many Parquet leaf columns a column of type ``kind`` has."""
    return sum(1 for _ in leaf_paths(kind, ()))
