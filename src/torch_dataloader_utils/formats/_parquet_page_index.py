"""Private: a Parquet column chunk's page index as bounds per page (each page's rows, whether it
holds only nulls, its null count and its min / max values), for pruning pages by a row filter.

It exists because pyarrow reads neither a column chunk's ColumnIndex nor its OffsetIndex into
Python (apache/arrow#45284 would give a row-ranges read that uses them); when it does, this
module goes. Values are decoded only for the physical types whose plain encoding is simple and
whose order is the Arrow type's (integers, booleans, UTF-8 strings): for any other column a page
says nothing about its values, which only costs pruning, never rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from . import _parquet_seek
from ._parquet_footer import CHUNK_CRYPTO, CHUNK_ENCRYPTED_META, CHUNK_INDEXES, FILE_ENCRYPTION_ALGORITHM, GROUP_COLUMNS, read_exact, row_group
from ._parquet_index_cache import PageIndexes
from ._parquet_seek import PAGE_LOCATION_BYTES, footer_cost, leaf_columns
from ._thrift_compact import Struct, ThriftError, ThriftList, decode_struct

# ColumnIndex's field ids (parquet.thrift)
_NULL_PAGES, _MIN_VALUES, _MAX_VALUES, _NULL_COUNTS = 1, 2, 3, 5


@dataclass(frozen=True)
class PageBounds:
    """One data page of a column chunk: its rows [first_row, first_row + rows), and what its
    ColumnIndex entry says: only nulls, the null count (None: not given), min and max (None:
    not usable for this column's type)."""

    first_row: int
    rows: int
    only_nulls: bool
    nulls: int | None
    bounds: tuple[Any, Any] | None


#: bytes of a page's entries in the column index beyond its offset index entry (about: a flag,
#: two short values and a null count)
_COLUMN_INDEX_BYTES = 24
#: pages assumed per column chunk byte, for the estimate (writers' default pages are 1 MiB; this
#: assumes smaller ones, so a doubtful case is left to the plain read)
_PAGE_BYTES = 64 * 1024


def worth_reading_bounds(footer: pq.FileMetaData, unit: int, names: list[str], read: list[str] | None) -> bool:
    """Whether reading the page indexes of ``names`` in row group ``unit`` may save more than it
    costs: decoding the footer and the indexes in Python, in compressed column bytes that pyarrow
    decodes in the same time (the seek's cost model, _parquet_seek), against the bytes of the
    ``read`` columns (None: all), the most that pruning pages can leave undecoded."""
    leaves = leaf_columns(footer, names)
    group = footer.row_group(unit)
    if not leaves or not any(group.column(leaf).has_column_index for leaf in leaves.values()):
        return False
    pages = sum(1 + group.column(leaf).total_compressed_size // _PAGE_BYTES for leaf in leaves.values())
    cost = footer_cost(footer) + pages * (PAGE_LOCATION_BYTES + _COLUMN_INDEX_BYTES) * _parquet_seek.THRIFT_BYTE_COST
    chunks = (group.column(index) for index in range(group.num_columns))
    saved = sum(c.total_compressed_size for c in chunks if read is None or any(c.path_in_schema == n or c.path_in_schema.startswith(n + ".") for n in read))
    return cost <= saved


def column_pages(
    source: Any, footer: pq.FileMetaData, thrift: Struct, unit: int, names: list[str], indexes: PageIndexes
) -> dict[str, tuple[pa.DataType, list[PageBounds]]]:
    """Per column of ``names`` (top-level, one leaf) that has a page index in row group ``unit``:
    its Arrow type in the file and its pages' bounds, decoded once and kept in ``indexes`` (the
    reader's, which random access's page reads share). Columns without one (or nested, or
    encrypted) are left out; ThriftError for an index that does not decode or does not fit the
    row group and its column chunk."""
    arrow = footer.schema.to_arrow_schema()
    rows = footer.row_group(unit).num_rows
    chunks = row_group(thrift, unit).structs(GROUP_COLUMNS)
    found = {}
    for name, (leaf, _, _, column_at, column_length) in _indexes(thrift, footer, unit, names).items():
        pages = indexes.load(source, (unit, leaf), chunks[leaf], rows, name)
        kind = arrow.field(name).type
        if pages.bounds is None:
            index = decode_struct(read_exact(source, column_at, column_length))[0]
            pages.bounds = _pages(index, pages.firsts, rows, footer.schema.column(leaf).physical_type, kind)
        if _agrees(pages.bounds, footer.row_group(unit).column(leaf).statistics, kind):
            found[name] = (kind, pages.bounds)
    return found


def _agrees(pages: list[PageBounds], stats: Any, kind: pa.DataType) -> bool:
    """Whether the pages' bounds fit each other and the column chunk's statistics: a damaged
    column index would otherwise prune pages that hold matching rows (such a column is read
    unpruned). String bounds are only checked for order: writers may truncate them."""
    bounds = [page.bounds for page in pages if page.bounds is not None]
    if any(low > high for low, high in bounds):
        return False
    if stats is None:
        return True
    nulls = [page.nulls for page in pages]
    if stats.has_null_count and None not in nulls and sum(nulls) != stats.null_count:  # type: ignore[arg-type]
        return False
    if not bounds or not stats.has_min_max or isinstance(bounds[0][0], str):
        return True
    low, high = (stats.min_raw, stats.max_raw) if pa.types.is_date32(kind) else (stats.min, stats.max)
    return all(low <= page_low and page_high <= high for page_low, page_high in bounds)


def index_locations(thrift: Struct, footer: pq.FileMetaData, unit: int, names: list[str]) -> list[tuple[int, int]]:
    """(offset, length) of the offset and column indexes ``column_pages`` reads: for a caller that
    fetches them first."""
    return [(at, length) for _, *where in _indexes(thrift, footer, unit, names).values() for at, length in (where[:2], where[2:])]


def _indexes(thrift: Struct, footer: pq.FileMetaData, unit: int, names: list[str]) -> dict[str, tuple[int, int, int, int, int]]:
    """Per column of ``names`` with both indexes: its leaf and where its offset and column indexes are."""
    if thrift.get(FILE_ENCRYPTION_ALGORITHM) is not None:
        return {}
    chunks = row_group(thrift, unit).structs(GROUP_COLUMNS)
    found = {}
    for name in names:
        leaves = leaf_columns(footer, [name])
        if not leaves:
            continue
        chunk = chunks[leaves[name]]
        if chunk.get(CHUNK_CRYPTO) is not None or chunk.get(CHUNK_ENCRYPTED_META) is not None:
            continue
        offset_at, offset_length, column_at, column_length = (chunk.get(field) for field in CHUNK_INDEXES)
        if isinstance(offset_at, int) and isinstance(column_at, int) and offset_length and column_length:
            found[name] = (leaves[name], offset_at, offset_length, column_at, column_length)
    return found


def _pages(index: Struct, firsts: list[int], rows: int, physical: str, kind: pa.DataType) -> list[PageBounds]:
    null_pages, lows, highs = (_list(index, field) for field in (_NULL_PAGES, _MIN_VALUES, _MAX_VALUES))
    counts = index.get(_NULL_COUNTS)
    nulls = counts.values if isinstance(counts, ThriftList) else [None] * len(firsts)
    if not len(null_pages) == len(lows) == len(highs) == len(nulls) == len(firsts):
        raise ThriftError("the column index and the offset index count different pages")
    ends = [*firsts[1:], rows]
    pages = []
    for first, end, only_nulls, low, high, count in zip(firsts, ends, null_pages, lows, highs, nulls):
        bounds = None if only_nulls else _bounds(low, high, physical, kind)
        pages.append(PageBounds(first, end - first, bool(only_nulls), count if isinstance(count, int) else None, bounds))
    return pages


def _list(index: Struct, field: int) -> list[Any]:
    value = index.get(field)
    if not isinstance(value, ThriftList):
        raise ThriftError(f"the column index has no list in field {field}")
    return value.values


def _bounds(low: Any, high: Any, physical: str, kind: pa.DataType) -> tuple[Any, Any] | None:
    """A page's min and max as Python values of ``kind`` (the file's Arrow type), or None."""
    if not isinstance(low, bytes) or not isinstance(high, bytes):
        return None
    if physical in ("INT32", "INT64") and pa.types.is_integer(kind):
        width = 4 if physical == "INT32" else 8
        if len(low) != width or len(high) != width:
            return None
        signed = pa.types.is_signed_integer(kind)
        return int.from_bytes(low, "little", signed=signed), int.from_bytes(high, "little", signed=signed)
    if physical == "INT32" and pa.types.is_date32(kind) and len(low) == len(high) == 4:
        return int.from_bytes(low, "little", signed=True), int.from_bytes(high, "little", signed=True)  # days
    if physical == "BOOLEAN" and pa.types.is_boolean(kind) and len(low) == len(high) == 1:
        return bool(low[0]), bool(high[0])
    if physical == "BYTE_ARRAY" and (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        # (writers may truncate these bounds; a truncated min stays below and a truncated max is
        # rounded up above every value, but either may then not be UTF-8: no bounds)
        try:
            return low.decode("utf-8"), high.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None
