"""One schema for all files of a dataset: unified at planning, applied to every piece read.

The rule (documented in docs/reliability.md):

- A column missing from some files is read as nulls from those files; when its values become
  tensors (anything but strings and binary), building the dataset raises instead, naming them.
- Integers widen to the smallest integer type that holds both exactly (int32 + int64 -> int64,
  uint16 + int16 -> int32); uint64 with a signed type is an error.
- Floats widen (float32 + float64 -> float64); an integer with a float gives float64. Values that
  float64 cannot hold exactly raise when the piece is read (a safe cast).
- string + large_string -> large_string, binary + large_binary -> large_binary (string_view and
  binary_view, which Polars writes to Arrow IPC, read as large_string / large_binary); a dictionary-encoded
  column unifies as its value type; a column of the null type takes the other file's type. A
  column dictionary-encoded in every file stays so, with 32-bit indices (pandas writes 8-bit ones,
  which a shuffle window mixing two dictionaries can overflow).
- ``fixed_size_list<T>[n]`` + ``list<U>`` -> ``fixed_size_list`` of T and U unified: a list row
  of another length raises when the piece is read (``WideningError``, naming the file).
- Timestamps of one time zone widen to the finer unit (ORC and Spark's INT96 read as ns): a value
  the finer unit cannot hold raises when the piece is read. Spellings of UTC unify as "UTC".
- Decimals widen to the larger scale with enough integer digits for both (10,2 + 18,2 -> 18,2).
- ``list`` + ``large_list`` -> ``large_list``, a struct with the same field names in the same order,
  and a map unify part by part (Polars writes large lists and strings where pyarrow does not).
- Anything else must be equal. Otherwise the column is a conflict: a
  ValueError naming the column, both types and files on each side when the column is selected
  (columns that are not selected are never read, so they may disagree).
- A selected column that a file holds twice or more is refused, naming the file.

Field order is the order of first appearance in file order; every unified field is nullable.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import pyarrow as pa

LARGE_TYPES = {pa.string(): pa.large_string(), pa.binary(): pa.large_binary()}  # 64-bit offsets
VIEW_TYPES = {pa.string_view(): pa.large_string(), pa.binary_view(): pa.large_binary()}  # no tensor or list form of their own


def _int_bits(kind: pa.DataType) -> tuple[bool, int]:
    return pa.types.is_signed_integer(kind), kind.bit_width


def _merge_ints(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    (sa, wa), (sb, wb) = _int_bits(a), _int_bits(b)
    if sa == sb:
        return a if wa >= wb else b
    signed, unsigned = (wa, wb) if sa else (wb, wa)
    bits = max(signed, 2 * unsigned)
    return {8: pa.int8(), 16: pa.int16(), 32: pa.int32(), 64: pa.int64()}.get(bits)


def merge_types(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type both unify to under the rule above, or None when they are incompatible."""
    a, b = without_views(a), without_views(b)
    if a == b:
        return a
    if pa.types.is_null(a) or pa.types.is_null(b):
        return b if pa.types.is_null(a) else a
    if pa.types.is_dictionary(a) and pa.types.is_dictionary(b):  # indices of other widths (pandas int8, Polars uint32)
        values = merge_types(a.value_type, b.value_type)
        return None if values is None else pa.dictionary(pa.int32(), values)
    if pa.types.is_dictionary(a) or pa.types.is_dictionary(b):
        return merge_types(a.value_type if pa.types.is_dictionary(a) else a, b.value_type if pa.types.is_dictionary(b) else b)
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        return _merge_ints(a, b)
    if pa.types.is_floating(a) and pa.types.is_floating(b):
        return a if a.bit_width >= b.bit_width else b
    if (pa.types.is_integer(a) and pa.types.is_floating(b)) or (pa.types.is_floating(a) and pa.types.is_integer(b)):
        return pa.float64()
    if LARGE_TYPES.get(a, a) == LARGE_TYPES.get(b, b):
        return LARGE_TYPES.get(a, a)
    if pa.types.is_decimal(a) and pa.types.is_decimal(b):
        return _merge_decimals(a, b)
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b) and _zone(a.tz) == _zone(b.tz):  # ORC and INT96 read as ns, Parquet mostly as us
        finer = a if _UNITS.index(a.unit) >= _UNITS.index(b.unit) else b
        return finer if a.tz == b.tz else pa.timestamp(finer.unit, tz="UTC")
    if pa.types.is_fixed_size_list(b) and _is_list(a):
        a, b = b, a
    if pa.types.is_fixed_size_list(a) and (_is_list(b) or pa.types.is_fixed_size_list(b)):
        values = merge_types(a.value_type, b.value_type)
        same_size = not pa.types.is_fixed_size_list(b) or b.list_size == a.list_size
        return pa.list_(a.value_field.with_type(values), a.list_size) if values is not None and same_size else None
    return _merge_nested(a, b)


_UNITS = ("s", "ms", "us", "ns")
_UTC_NAMES = frozenset({"utc", "+00:00", "-00:00", "z", "etc/utc", "gmt", "etc/gmt", "zulu", "etc/zulu", "universal", "etc/universal"})


def _zone(tz: str | None) -> str | None:
    """A time zone's name, with the writers' spellings of UTC made one (pyarrow writes "UTC",
    others "+00:00" or "Etc/UTC")."""
    return "UTC" if tz is not None and tz.lower() in _UTC_NAMES else tz


def _merge_decimals(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The decimal that holds both exactly: the larger scale and enough integer digits for either
    (DuckDB writes DECIMAL(18, s) where pyarrow and pandas write a narrower precision)."""
    scale = max(a.scale, b.scale)
    precision = max(a.precision - a.scale, b.precision - b.scale) + scale
    if precision <= 38:
        return pa.decimal128(precision, scale)
    return pa.decimal256(precision, scale) if precision <= 76 else None


def _merge_nested(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """Lists, structs and maps whose parts unify: Polars and DuckDB write large lists and large
    strings inside them where pyarrow writes 32-bit offsets, so the same data differs only there."""
    if _is_list(a) and _is_list(b):
        values = merge_types(a.value_type, b.value_type)
        if values is None:
            return None
        field = a.value_field.with_type(values)
        return pa.large_list(field) if pa.types.is_large_list(a) or pa.types.is_large_list(b) else pa.list_(field)
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return _merge_structs(a, b)
    if pa.types.is_map(a) and pa.types.is_map(b) and a.keys_sorted == b.keys_sorted:
        key, item = merge_types(a.key_type, b.key_type), merge_types(a.item_type, b.item_type)
        if key is None or item is None:
            return None
        return pa.map_(a.key_field.with_type(key), a.item_field.with_type(item), keys_sorted=a.keys_sorted)
    return None


def _merge_structs(a: pa.StructType, b: pa.StructType) -> pa.DataType | None:
    """Structs unify field by field, by name; a field only one has is added (null where the other
    is read), as a column only some files have: a struct that gained a field since older files."""
    names_a, names_b = [f.name for f in a], [f.name for f in b]
    if len(set(names_a)) != len(names_a) or len(set(names_b)) != len(names_b):  # a repeated name: matched by position
        if names_a != names_b:
            return None
        kinds = [merge_types(x.type, y.type) for x, y in zip(a, b)]
        return None if None in kinds else pa.struct([pa.field(x.name, k, nullable=x.nullable or y.nullable) for x, y, k in zip(a, b, kinds)])
    others = {f.name: f for f in b}
    fields = []
    for field in a:
        other = others.pop(field.name, None)
        kind = field.type if other is None else merge_types(field.type, other.type)
        if kind is None:
            return None
        fields.append(pa.field(field.name, kind, nullable=True if other is None else field.nullable or other.nullable))
    fields += [f.with_nullable(True) for f in others.values()]
    return pa.struct(fields)


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def _files_text(names: Sequence[str], noun: str = "file") -> str:
    more = f" (and {len(names) - 1} more {noun}{'s' if len(names) > 2 else ''})" if len(names) > 1 else ""
    return f"{names[0]}{more}"


def unify(schemas: Sequence[pa.Schema], names: Sequence[str], conflicts: dict[str, str] | None = None, noun: str = "file") -> pa.Schema:
    """The unified schema of files ``names`` with ``schemas``; ValueError naming the files that
    disagree, or with ``conflicts`` given, each such column's message put there (the column
    keeps the type it had first) for the caller to raise if the column is selected. ``noun``:
    what ``names`` are ("source" for a mixture's sources)."""
    if not schemas:
        return pa.schema([])
    if all(s is schemas[0] for s in schemas):  # one shared object (the plan cache's, or equal footers')
        return _wide_dictionaries(schemas[0])
    distinct: dict[pa.Schema, list[str]] = {}
    for schema, name in zip(schemas, names):
        distinct.setdefault(schema.remove_metadata(), []).append(name)
    if len(distinct) == 1:
        return _wide_dictionaries(schemas[0])
    fields: dict[str, pa.DataType] = {}
    seen_in: dict[str, dict[pa.DataType, list[str]]] = {}
    for schema, files in distinct.items():
        for field in schema:
            kind = stored_type(field.type)
            seen_in.setdefault(field.name, {}).setdefault(kind, []).extend(files)
            current = fields.get(field.name)
            merged = kind if current is None else merge_types(current, kind)
            if merged is None:
                if conflicts is None:
                    raise ValueError(_conflict(field.name, current, kind, seen_in[field.name], noun))
                conflicts.setdefault(field.name, _conflict(field.name, current, kind, seen_in[field.name], noun))
                continue
            fields[field.name] = merged
    return _wide_dictionaries(pa.schema([pa.field(name, kind, nullable=True) for name, kind in fields.items()], metadata=schemas[0].metadata))


def without_views(kind: pa.DataType) -> pa.DataType:
    """``kind`` with string_view / binary_view (also inside lists, structs and maps) as large_string
    / large_binary, which pyarrow casts them to and batches have a form for."""
    if kind in VIEW_TYPES:
        return VIEW_TYPES[kind]
    if pa.types.is_dictionary(kind):  # (Polars' Categorical and Enum in Arrow IPC)
        values = without_views(kind.value_type)
        return kind if values == kind.value_type else pa.dictionary(kind.index_type, values, kind.ordered)
    if _is_list(kind) or pa.types.is_fixed_size_list(kind):
        inner = without_views(kind.value_type)
        if inner == kind.value_type:
            return kind
        field = kind.value_field.with_type(inner)
        if pa.types.is_fixed_size_list(kind):
            return pa.list_(field, kind.list_size)
        return pa.large_list(field) if pa.types.is_large_list(kind) else pa.list_(field)
    if pa.types.is_struct(kind):
        fields = [field.with_type(without_views(field.type)) for field in kind]
        return pa.struct(fields) if any(f.type != g.type for f, g in zip(fields, kind)) else kind
    if pa.types.is_map(kind):
        key, item = without_views(kind.key_type), without_views(kind.item_type)
        if key == kind.key_type and item == kind.item_type:
            return kind
        return pa.map_(kind.key_field.with_type(key), kind.item_field.with_type(item), keys_sorted=kind.keys_sorted)
    return kind


def stored_type(kind: pa.DataType) -> pa.DataType:
    """A column's type as batches hold it: an extension type (UUID, JSON, fixed_shape_tensor, as
    pyarrow reads Parquet's logical types and Arrow IPC metadata) as its storage type, ``bool8`` as
    bool, a run-end encoded column as its values. Top level only: read/conform.py casts those."""
    if isinstance(kind, pa.BaseExtensionType):
        return pa.bool_() if kind.extension_name == "arrow.bool8" else kind.storage_type
    if pa.types.is_run_end_encoded(kind):
        return kind.value_type
    return kind


def _wide_dictionaries(schema: pa.Schema) -> pa.Schema:
    """Dictionary columns with 32-bit indices: a shuffle window takes rows of row groups (and
    files) with different dictionaries, and merging them can overflow 8- or 16-bit indices.
    View strings and binary (Polars' Arrow IPC files) are read as their large types, extension
    and run-end encoded columns as what they store (``stored_type``)."""
    for index, field in enumerate(schema):
        kind = without_views(stored_type(field.type))
        if pa.types.is_dictionary(kind) and kind.index_type.bit_width < 32:
            kind = pa.dictionary(pa.int32(), kind.value_type, kind.ordered)
        if kind != field.type:
            schema = schema.set(index, field.with_type(kind))
    return schema




def _conflict(column: str, current: pa.DataType, new: pa.DataType, seen: dict[pa.DataType, list[str]], noun: str) -> str:
    incompatible = [kind for kind in seen if kind != new and merge_types(kind, new) is None]
    if not incompatible:  # each type fits the new one alone, but not what they unified to
        incompatible = [kind for kind in seen if kind != new]
    old_files = sorted({f for kind in incompatible for f in seen[kind]})
    return (
        f"{noun}s have incompatible schemas: column {column!r} is {incompatible[0]} in {_files_text(old_files, noun)} "
        f"but {new} in {_files_text(sorted(seen[new]), noun)}. Only missing columns and widening (numbers, strings, "
        "decimals, timestamp units, lists, structs, maps) are unified; rewrite the odd files with one type for the column, or pass a path without them."
    )


def missing_columns(schema: pa.Schema, unified: pa.Schema) -> tuple[str, ...]:
    """Columns of the unified schema that a file with ``schema`` lacks (or has only as Arrow's null type)."""
    names = {field.name for field in schema if not pa.types.is_null(field.type)}
    return tuple(name for name in unified.names if name not in names)


_NULLS_HAVE_BATCH_FORM = (pa.null(), *LARGE_TYPES, *LARGE_TYPES.values())  # strings and binary hold None


def repeated_columns(schemas: Sequence[pa.Schema], names: Sequence[str]) -> dict[str, tuple[str, int]]:
    """Column name -> (first file, count) for names a file holds more than once."""
    repeated: dict[str, tuple[str, int]] = {}
    for schema, name in zip(schemas, names):
        for column, count in collections.Counter(schema.names).items():
            if count > 1 and column not in repeated:
                repeated[column] = (name, count)
    return repeated


def check_repeated_columns(unified: pa.Schema, columns: Sequence[str] | None, repeated: dict[str, tuple[str, int]]) -> None:
    """ValueError for a selected column that a file holds more than once: a batch maps each name to
    one column, and the file's value for it would be ambiguous."""
    for name in unified.names if columns is None else columns:
        if name in repeated:
            file, count = repeated[name]
            raise ValueError(
                f"{file} has {count} columns named {name!r}: a batch maps each name to one column, and pyarrow cannot "
                "read such a column by name. Leave it out with columns=[...], or rename the columns in the data"
            )


def check_missing_columns(unified: pa.Schema, columns: Sequence[str] | None, missing: Sequence[tuple[str, ...]], sources: Sequence[tuple[str, int]]) -> None:
    """ValueError for a selected column that some non-empty sources of a mixture (``sources``:
    (name, rows)) lack when its nulls have no batch form: everything but strings and binary
    becomes a tensor."""
    for name in unified.names if columns is None else columns:
        kind = unified.field(name).type
        kind = kind.value_type if pa.types.is_dictionary(kind) else kind
        lacking = [source for (source, rows), lacks in zip(sources, missing) if rows and name in lacks]
        if lacking and kind not in _NULLS_HAVE_BATCH_FORM:
            raise ValueError(
                f"column {name!r} ({kind}) is missing from {_files_text(lacking, 'source')}: it would be read as nulls "
                "there, which a tensor cannot hold. Pass nulls='fill' (or 'mask'), leave the column out with columns=[...], or add it to those sources."
            )
