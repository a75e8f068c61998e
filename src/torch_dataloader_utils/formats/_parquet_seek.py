"""Private: start decoding a Parquet row group at a page near a given row, not at its first row.

pyarrow decodes a row group from its first page: it cannot yet start at a row
(apache/arrow#45284, a row-ranges API that would use the page index). So a read that starts
deep in a row group (a resume, a split that cuts a row group) would decode every row before it
only to drop them. When the file has a page index (each page's offset and first row: parquet-mr
writes one since 1.11, pyarrow with ``write_page_index=True``), this module cuts each column
chunk down to its dictionary page (if the kept pages use it) and the pages from the one holding
the row on (``_parquet_pages``), and gives pyarrow the columns cut at the same row as a small
Parquet file of their own, read from the original file as pyarrow asks, under a footer of those
columns and one row group (``_parquet_splice``). Every column is cut at its own page and then
trimmed to the row, so the columns line up. A caller that holds only the bytes it fetched (an
object store's file) is told which ranges the cut reads, after the page indexes and before
anything else (``fetch``). When pyarrow can read a row group from a row, this module and its
helpers (``_parquet_footer``, ``_parquet_pages``, ``_parquet_splice``, ``_thrift_compact``) go.

A column whose page index and page headers would cost more Python than the decoding they
save is read whole and trimmed. Nothing is cut when a file has no page index, a projected
column has more than one leaf (a struct or a map), the file is encrypted, or the page index
does not match the pages (``ThriftError``): the caller then decodes from the first row.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ._parquet_footer import (
    CHUNK_CRYPTO,
    CHUNK_ENCRYPTED_META,
    CHUNK_INDEXES,
    CHUNK_META,
    FILE_ENCRYPTION_ALGORITHM,
    GROUP_COLUMNS,
    GROUP_NUM_ROWS,
    INT96_DECODE_UNIT,
    MAGIC,
    META_COMPRESSED,
    META_DATA_OFFSET,
    META_DICT_OFFSET,
    META_NUM_VALUES,
    footer_bytes,
    footer_struct,
    row_group,
)
from ._parquet_leaves import leaf_count
from ._parquet_pages import Cut, CutPlan, check_cut, page_locations
from ._parquet_splice import cut_file
from ._thrift_compact import Struct, ThriftError, decode_struct

# The footer's access and decode_struct are importable from here too: tests/test_parquet_seek.py
# reaches them through this module.
__all__ = [
    "HEADER_COST",
    "MAGIC",
    "PAGE_LOCATION_BYTES",
    "THRIFT_BYTE_COST",
    "THRIFT_SKIP_BYTE_COST",
    "decode_batch_rows",
    "decode_struct",
    "footer_bytes",
    "footer_cost",
    "footer_struct",
    "iter_from_row",
    "leaf_columns",
    "offset_index_ranges",
    "row_group",
    "worth_seeking",
]

# What this module's Python costs, in compressed column bytes that pyarrow decodes in the same
# time: Thrift decoded in Python and each page header read are slow next to pyarrow's decoding
# of column bytes. Rounded up, so that a doubtful seek is left to the plain read.
#: per byte of footer or page index decoded
THRIFT_BYTE_COST = 256
#: per byte of footer skipped (the row groups not read)
THRIFT_SKIP_BYTE_COST = 128
#: per page header read
HEADER_COST = 64 * 1024
#: bytes of one page's entry in an offset index (about: three varints and their field headers)
PAGE_LOCATION_BYTES = 12


def worth_seeking(footer: pq.FileMetaData, unit: int, columns: list[str] | None, row: int) -> bool:
    """Whether a read from ``row`` of row group ``unit`` should try to seek: every projected
    column is one leaf with a page index, and decoding the footer costs less than decoding the
    column bytes before ``row`` (estimated; ``_plan`` weighs each column's page index and
    headers the same way)."""
    leaves = leaf_columns(footer, columns)
    if not leaves:
        return False
    group = footer.row_group(unit)
    chunks = [group.column(leaf) for leaf in leaves.values()]
    before_row = sum(chunk.total_compressed_size for chunk in chunks) * row // max(1, group.num_rows)
    return footer_cost(footer) <= before_row and all(chunk.has_offset_index for chunk in chunks)


def footer_cost(footer: pq.FileMetaData) -> int:
    """``footer_struct``'s cost, in column bytes: one row group decoded, the others skipped."""
    size = footer.serialized_size
    return size * THRIFT_SKIP_BYTE_COST + size // max(1, footer.num_row_groups) * THRIFT_BYTE_COST


def offset_index_ranges(footer: pq.FileMetaData, thrift: Struct, unit: int, columns: list[str] | None) -> list[tuple[int, int]]:
    """[start, end) of the projected columns' offset indexes in row group ``unit`` (those it
    has): what ``iter_from_row`` reads first, for a caller that fetches bytes ahead."""
    chunks = row_group(thrift, unit).structs(GROUP_COLUMNS)
    ranges = []
    for leaf in (leaf_columns(footer, columns) or {}).values():
        offset, length = chunks[leaf].integer(CHUNK_INDEXES[0], 0), chunks[leaf].integer(CHUNK_INDEXES[1], 0)
        if length > 0:
            ranges.append((offset, offset + length))
    return ranges


def leaf_columns(footer: pq.FileMetaData, columns: list[str] | None) -> dict[str, int] | None:
    """Projected top-level column -> the index of its one leaf column, in the order ``columns``
    names them (else the file's); None when a projected column has several leaves (a struct or
    a map), a name is not a top-level column (a nested path), names repeat, or the Arrow types
    do not account for the file's leaf columns."""
    return _leaves(footer.schema.to_arrow_schema(), columns, footer.num_columns)


def _leaves(schema: pa.Schema, columns: list[str] | None, num_leaves: int) -> dict[str, int] | None:
    names = schema.names
    wanted = names if columns is None else list(columns)
    if len(set(names)) != len(names) or len(set(wanted)) != len(wanted) or not set(wanted) <= set(names):
        return None
    first_leaf, leaves = single_leaf_columns(schema)
    if leaves != num_leaves or any(name not in first_leaf for name in wanted):
        return None
    return {name: first_leaf[name] for name in wanted}


def single_leaf_columns(schema: pa.Schema) -> tuple[dict[str, int], int]:
    """The top-level columns of one Parquet leaf column -> that leaf's index; and the leaf count."""
    first_leaf: dict[str, int] = {}
    leaf = 0
    for field in schema:
        count = leaf_count(field.type)
        if count == 1:
            first_leaf[field.name] = leaf
        leaf += count
    return first_leaf, leaf


def iter_from_row(
    source: Any,
    footer: pq.FileMetaData,
    thrift: Struct,
    unit: int,
    columns: list[str] | None,
    row: int,
    batch_rows: int,
    buffer_size: int,
    fetch: Callable[[list[tuple[int, int]]], None] | None = None,
) -> Iterator[pa.Table] | None:
    """Rows ``row``.. of row group ``unit`` in tables of ``batch_rows`` rows, each column decoded
    from the page that holds ``row``; None when that cannot be done or gains nothing (no page
    index, a column with several leaves, an encrypted file, no column worth cutting). Raises
    ThriftError for a page index that does not describe its column chunk.

    ``fetch(ranges)``, if given, is called once with every [start, end) byte range read after
    the page indexes (the dictionary and kept pages of each column, whole chunks for columns not
    cut), before they are read: a remote file downloads only those. The check of a cut then reads
    the kept pages' headers (else the shorter side's)."""
    if row <= 0 or thrift.get(FILE_ENCRYPTION_ALGORITHM) is not None:
        return None
    schema = footer.schema.to_arrow_schema()
    leaves = _leaves(schema, columns, footer.num_columns)
    if not leaves:
        return None
    group = row_group(thrift, unit)
    chunks = group.structs(GROUP_COLUMNS)
    num_rows = group.integer(GROUP_NUM_ROWS)
    planned = {
        name: _plan(source, chunks[leaf], row, num_rows, _values_per_row(footer, unit, leaf, schema.field(name).type), fetch is not None)
        for name, leaf in leaves.items()
    }
    plans = {name: plan for name, plan in planned.items() if plan is not None}
    if len(plans) < len(planned) or all(isinstance(plan, Cut) for plan in plans.values()):
        return None
    if fetch is not None:
        fetch([r for plan in plans.values() for r in (plan.ranges() if isinstance(plan, CutPlan) else plan.whole_range())])
    cuts = {name: check_cut(source, plan, num_rows) if isinstance(plan, CutPlan) else plan for name, plan in plans.items()}
    by_first_row: dict[int, dict[int, str]] = {}  # columns cut at the same row share a file
    for name, cut in cuts.items():
        by_first_row.setdefault(cut.first_row, {})[leaves[name]] = name
    streams = []
    for first_row, names in by_first_row.items():
        spliced = cut_file(source, thrift, schema, unit, {leaf: (name, cuts[name]) for leaf, name in names.items()}, num_rows - first_row)
        reader = pq.ParquetFile(spliced, pre_buffer=False, buffer_size=buffer_size, coerce_int96_timestamp_unit=INT96_DECODE_UNIT)
        lead = row - first_row  # decoded and dropped
        batches = reader.iter_batches(batch_size=decode_batch_rows(lead, batch_rows), columns=list(names.values()), use_threads=False)
        streams.append(_RowStream(batches, lead, num_rows - first_row))
    return _aligned(streams, list(leaves), num_rows - row, batch_rows, schema.metadata)


def decode_batch_rows(lead: int, batch_rows: int) -> int:
    """A decode batch size of at most ``batch_rows`` whose batches end close after the first
    ``batch_rows`` rows past ``lead`` (fewer rows than there are batches to get there): the
    first wanted rows wait for little more than themselves and the rows before them."""
    wanted = lead + batch_rows
    batches = -(-wanted // batch_rows)
    return -(-wanted // batches)


def _values_per_row(footer: pq.FileMetaData, unit: int, leaf: int, kind: pa.DataType) -> int | None:
    """The level values every row of a column chunk has, when that is fixed: 1 for a flat
    column, the size for a fixed-size list without nulls; else None (a V1 page header, which
    counts values, then does not tell its rows)."""
    if footer.schema.column(leaf).max_repetition_level == 0:
        return 1
    size = 1
    while pa.types.is_fixed_size_list(kind):
        size, kind = size * kind.list_size, kind.value_type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        return None
    statistics = footer.row_group(unit).column(leaf).statistics
    return size if statistics is not None and statistics.has_null_count and statistics.null_count == 0 else None


def _plan(source: Any, chunk: Struct, row: int, group_rows: int, values_per_row: int | None, count_kept: bool) -> CutPlan | Cut | None:
    """Where to cut ``chunk`` for ``row``: a plan, or the chunk whole (a ``Cut`` at row 0) when
    reading its page index and headers would cost more than the decoding it saves; None when it
    has no page index or is encrypted. ``count_kept``: the kept pages' headers will be checked,
    not the shorter side's (for a caller that fetches only the bytes ``CutPlan.ranges`` names)."""
    if chunk.get(CHUNK_CRYPTO) is not None or chunk.get(CHUNK_ENCRYPTED_META) is not None:
        return None
    if chunk.get(CHUNK_INDEXES[0]) is None or not chunk.get(CHUNK_INDEXES[1]):
        return None
    meta = chunk.struct(CHUNK_META)
    data_offset = meta.integer(META_DATA_OFFSET)
    start = min(meta.integer(META_DICT_OFFSET, data_offset) or data_offset, data_offset)
    end = start + meta.integer(META_COMPRESSED)
    whole = Cut((start, data_offset - start), (data_offset, end - data_offset), 0, meta.integer(META_NUM_VALUES))
    index_length = chunk.integer(CHUNK_INDEXES[1])
    index_cost = index_length * THRIFT_BYTE_COST
    pages = index_length // PAGE_LOCATION_BYTES  # (estimated)
    headers_to_read = pages * (group_rows - row if count_kept else min(row, group_rows - row)) // group_rows
    if index_cost + headers_to_read * HEADER_COST > (end - start) * row // group_rows:
        return whole  # (before reading the index: its decoding alone may cost more than it saves)
    locations = page_locations(source, chunk.integer(CHUNK_INDEXES[0]), index_length, group_rows)
    firsts = [first for _, _, first in locations]
    # the last page that starts at or before the row: pages begin at row boundaries when a file
    # has a page index (parquet.thrift); of pages that start at the same row, all but the last
    # are empty (pyarrow writes such pages)
    page = bisect.bisect_right(firsts, row) - 1
    first_page, kept = locations[0][0], locations[page][0]
    if first_page != data_offset or sum(size for _, size, _ in locations[page:]) != end - kept:
        raise ThriftError("page index does not match its column chunk")
    count_kept = count_kept or len(locations) - page <= page
    counted = len(locations) - page if count_kept else page
    if page == 0 or index_cost + (counted + 1) * HEADER_COST > kept - first_page:
        return whole
    return CutPlan(start, first_page, end, meta.integer(META_NUM_VALUES), locations, page, count_kept, values_per_row)


class _RowStream:
    """Some columns' decoded batches, the first ``lead`` rows dropped; ``take(n)`` returns the
    next n rows, and the columns must hold exactly ``rows`` rows (lead included)."""

    def __init__(self, batches: Iterator[pa.RecordBatch], lead: int, rows: int) -> None:
        self._batches = batches
        self._lead = lead
        self._left = rows - lead  # rows still to take
        self._held: list[pa.RecordBatch] = []
        self._rows = 0

    def take(self, rows: int) -> pa.Table:
        while self._rows < rows:
            batch = next(self._batches, None)
            if batch is None:
                raise ValueError(f"a cut column chunk ended {rows - self._rows} rows early")
            if self._lead:
                dropped = min(self._lead, batch.num_rows)
                batch, self._lead = batch.slice(dropped), self._lead - dropped
            if batch.num_rows:
                self._held.append(batch)
                self._rows += batch.num_rows
        out, need = [], rows
        while need:
            batch = self._held[0]
            if batch.num_rows <= need:
                out.append(self._held.pop(0))
                need -= batch.num_rows
            else:
                out.append(batch.slice(0, need))
                self._held[0] = batch.slice(need)
                need = 0
        self._rows -= rows
        self._left -= rows
        if self._left == 0 and (self._rows or next(self._batches, None) is not None):
            raise ValueError("a cut column chunk holds more rows than its page index says")
        return pa.Table.from_batches(out)


def _aligned(streams: list[_RowStream], names: list[str], rows: int, batch_rows: int, metadata: dict | None) -> Iterator[pa.Table]:
    """Tables of ``batch_rows`` rows of the columns ``names``, taken from the streams in step."""
    done = 0
    while done < rows:
        take = min(batch_rows, rows - done)
        tables = [stream.take(take) for stream in streams]
        table = tables[0]
        for other in tables[1:]:
            for index, field in enumerate(other.schema):
                table = table.append_column(field, other.column(index))
        yield table.select(names).replace_schema_metadata(metadata)
        done += take
