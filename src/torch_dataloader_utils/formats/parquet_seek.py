"""Start decoding a Parquet row group at a page near a given row, not at its first row.

pyarrow decodes a row group from its first page (it cannot yet start at a row:
apache/arrow#45284), so a read that starts deep in a row group (a resume, a split that cuts
a row group) decodes every row before it only to drop them. When the file has a page index
(each page's offset and first row: parquet-mr writes one since 1.11, pyarrow with
``write_page_index=True``), this module cuts each column chunk down to its dictionary page (if
the kept pages use it) and the pages from the one holding the row on, and gives pyarrow that as
a small Parquet file of its own, read from the original file as pyarrow asks: the original
footer with one row group whose one real column chunk is the cut one. Every column is cut at
its own page and then trimmed to the row, so the columns line up. A caller that holds only the
bytes it fetched (an object store's file) is told which ranges the cut reads, after the page
indexes and before anything else (``fetch``).

A column whose page index and page headers would cost more Python than the decoding they
save is read whole and trimmed. Nothing is cut when a file has no page index, a projected
column has more than one leaf (a struct or a map), the file is encrypted, or the page index
does not match the pages (``ThriftError``): the caller then decodes from the first row.
"""

from __future__ import annotations

import bisect
import io
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from .thrift_compact import I64, LIST, STRUCT, Struct, ThriftError, ThriftList, decode_struct, encode_struct

MAGIC = b"PAR1"
# Parquet's thrift field ids (parquet.thrift)
_FILE_NUM_ROWS, _FILE_ROW_GROUPS = 3, 4
_GROUP_COLUMNS, _GROUP_NUM_ROWS, _GROUP_OFFSET, _GROUP_COMPRESSED, _GROUP_ORDINAL = 1, 3, 5, 6, 7
_CHUNK_FILE_OFFSET, _CHUNK_META, _CHUNK_INDEXES, _CHUNK_CRYPTO, _CHUNK_ENCRYPTED_META = 2, 3, (4, 5, 6, 7), 8, 9
_META_NUM_VALUES, _META_COMPRESSED, _META_DATA_OFFSET, _META_INDEX_OFFSET = 5, 7, 9, 10
_META_DICT_OFFSET, _META_STATISTICS, _META_BLOOM, _META_SIZE_STATISTICS = 11, 12, (14, 15), 16
_PAGE_TYPE, _PAGE_COMPRESSED_SIZE, _PAGE_DATA_V1, _PAGE_DATA_V2 = 1, 3, 5, 8
_DATA_PAGE, _DATA_PAGE_V2 = 0, 3
_DICTIONARY_ENCODINGS = (2, 8)  # PLAIN_DICTIONARY, RLE_DICTIONARY
_ENCRYPTION_ALGORITHM = 8  # in FileMetaData: set for encrypted files with a plaintext footer
_HEADER_READ = 1024  # bytes read for a page header first
# What this module's Python costs, in compressed column bytes pyarrow decodes in the same time
# (measured: Thrift decodes at 2 to 4 MB/s here, a page header read takes about 0.15 ms, and
# pyarrow decodes compressed column bytes at 2 ns (plain int64) to 6 ns (zstd text) each;
# rounded up, so that a doubtful seek is left to the plain read):
#: per byte of footer or page index decoded
THRIFT_BYTE_COST = 256
#: per page header read
HEADER_COST = 64 * 1024
#: bytes of one page's entry in an offset index (about: three varints and their field headers)
PAGE_LOCATION_BYTES = 12


@dataclass(frozen=True)
class _Cut:
    """One leaf column's chunk from the page holding the wanted row: where its dictionary page
    and its kept pages are in the file, the row the first kept page starts at, and the number
    of level values in the kept pages."""

    dictionary: tuple[int, int]  # (offset, size); size 0: no dictionary page
    pages: tuple[int, int]
    first_row: int
    num_values: int


@dataclass(frozen=True)
class _Page:
    """What a data page's header says: its level values, its rows (V2 pages only) and whether
    its values are dictionary-encoded."""

    values: int
    rows: int | None
    dictionary: bool


def footer_struct(footer: pq.FileMetaData) -> Struct:
    """The footer as decoded Thrift (pyarrow serialises it: the bytes between the magics)."""
    sink = pa.BufferOutputStream()
    footer.write_metadata_file(sink)
    data = sink.getvalue().to_pybytes()
    return decode_struct(memoryview(data)[4 : len(data) - 8])[0]


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
    return footer.serialized_size * THRIFT_BYTE_COST <= before_row and all(chunk.has_offset_index for chunk in chunks)


def offset_index_ranges(footer: pq.FileMetaData, thrift: Struct, unit: int, columns: list[str] | None) -> list[tuple[int, int]]:
    """[start, end) of the projected columns' offset indexes in row group ``unit`` (those it
    has): what ``iter_from_row`` reads first, for a caller that fetches bytes ahead."""
    group = thrift.structs(_FILE_ROW_GROUPS)[unit]
    chunks = group.structs(_GROUP_COLUMNS)
    ranges = []
    for leaf in (leaf_columns(footer, columns) or {}).values():
        offset, length = chunks[leaf].integer(_CHUNK_INDEXES[0], 0), chunks[leaf].integer(_CHUNK_INDEXES[1], 0)
        if length > 0:
            ranges.append((offset, offset + length))
    return ranges


def leaf_columns(footer: pq.FileMetaData, columns: list[str] | None) -> dict[str, int] | None:
    """Projected top-level column -> the index of its one leaf column, in the order ``columns``
    names them (else the file's); None when a projected column has several leaves (a struct or
    a map), a name is not a top-level column (a nested path), or names repeat."""
    return _leaves(footer.schema.to_arrow_schema(), columns)


def _leaves(schema: pa.Schema, columns: list[str] | None) -> dict[str, int] | None:
    names = schema.names
    wanted = names if columns is None else list(columns)
    if len(set(names)) != len(names) or len(set(wanted)) != len(wanted) or not set(wanted) <= set(names):
        return None
    first_leaf, leaf = {}, 0
    for field in schema:
        first_leaf[field.name] = leaf if _leaf_count(field.type) == 1 else None
        leaf += _leaf_count(field.type)
    if any(first_leaf[name] is None for name in wanted):
        return None
    return {name: first_leaf[name] for name in wanted}


def _leaf_count(kind: pa.DataType) -> int:
    if pa.types.is_struct(kind):
        return sum(_leaf_count(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _leaf_count(kind.key_type) + _leaf_count(kind.item_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _leaf_count(kind.value_type)
    return 1


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
    if row <= 0 or thrift.get(_ENCRYPTION_ALGORITHM) is not None:
        return None
    schema = footer.schema.to_arrow_schema()
    leaves = _leaves(schema, columns)
    if not leaves:
        return None
    group = thrift.structs(_FILE_ROW_GROUPS)[unit]
    chunks = group.structs(_GROUP_COLUMNS)
    num_rows = group.integer(_GROUP_NUM_ROWS)
    plans = {
        name: _plan(source, chunks[leaf], row, num_rows, _values_per_row(footer, unit, leaf, schema.field(name).type), fetch is not None)
        for name, leaf in leaves.items()
    }
    if any(plan is None for plan in plans.values()) or all(isinstance(plan, _Cut) for plan in plans.values()):
        return None
    if fetch is not None:
        fetch([r for plan in plans.values() for r in (plan.ranges() if isinstance(plan, _Plan) else _whole_range(plan))])
    cuts = {}
    for name, plan in plans.items():
        cuts[name] = _cut_at(source, plan, num_rows) if isinstance(plan, _Plan) else plan
    streams = {}
    for name, cut in cuts.items():
        spliced = _one_chunk_file(source, thrift, group, leaves[name], cut, num_rows)
        reader = pq.ParquetFile(spliced, pre_buffer=False, buffer_size=buffer_size)
        lead = row - cut.first_row  # decoded and dropped
        batches = reader.iter_batches(batch_size=decode_batch_rows(lead, batch_rows), columns=[name], use_threads=False)
        streams[name] = _ColumnStream(batches, lead, num_rows - cut.first_row)
    return _aligned(streams, num_rows - row, batch_rows, schema.metadata)


def decode_batch_rows(lead: int, batch_rows: int) -> int:
    """A decode batch size of at most ``batch_rows`` whose batches end close after the first
    ``batch_rows`` rows past ``lead`` (fewer rows than there are batches to get there): the
    first wanted rows wait for little more than themselves and the rows before them."""
    wanted = lead + batch_rows
    batches = -(-wanted // batch_rows)
    return -(-wanted // batches)


@dataclass(frozen=True)
class _Plan:
    """Where a column chunk is cut, decided from its page index alone: its bytes [start, end),
    its first data page, the index's (offset, size, first row) per page and the page kept
    first. The page headers of one side of the cut are read next (``_cut_at``)."""

    start: int
    first_page: int
    end: int
    num_values: int
    locations: tuple[tuple[int, int, int], ...]
    page: int
    count_kept: bool  # count the kept pages' headers (else those of the shorter side)
    values_per_row: int | None  # level values per row (see _values_per_row)

    def ranges(self) -> list[tuple[int, int]]:
        """The bytes ``_cut_at`` and the cut file may read: the dictionary page (if any) and the
        kept pages; the whole chunk when V1 pages could leave the column whole (see _cut_at)."""
        if self.values_per_row is None:
            return [(self.start, self.end)]
        return [(self.start, self.first_page), (self.locations[self.page][0], self.end)]


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


def _plan(source: Any, chunk: Struct, row: int, group_rows: int, values_per_row: int | None, count_kept: bool) -> _Plan | _Cut | None:
    """Where to cut ``chunk`` for ``row``: a plan, or the chunk whole (a ``_Cut`` at row 0) when
    reading its page index and headers would cost more than the decoding it saves; None when it
    has no page index or is encrypted. ``count_kept``: the kept pages' headers will be checked,
    not the shorter side's (for a caller that fetches only the bytes ``_Plan.ranges`` names)."""
    if chunk.get(_CHUNK_CRYPTO) is not None or chunk.get(_CHUNK_ENCRYPTED_META) is not None:
        return None
    if chunk.get(_CHUNK_INDEXES[0]) is None or not chunk.get(_CHUNK_INDEXES[1]):
        return None
    meta = chunk.struct(_CHUNK_META)
    data_offset = meta.integer(_META_DATA_OFFSET)
    start = min(meta.integer(_META_DICT_OFFSET, data_offset) or data_offset, data_offset)
    end = start + meta.integer(_META_COMPRESSED)
    whole = _Cut((start, data_offset - start), (data_offset, end - data_offset), 0, meta.integer(_META_NUM_VALUES))
    index_length = chunk.integer(_CHUNK_INDEXES[1])
    index_cost = index_length * THRIFT_BYTE_COST
    pages = index_length // PAGE_LOCATION_BYTES  # (estimated)
    headers_to_read = pages * (group_rows - row if count_kept else min(row, group_rows - row)) // group_rows
    if index_cost + headers_to_read * HEADER_COST > (end - start) * row // group_rows:
        return whole  # (before reading the index: its decoding alone may cost more than it saves)
    index = decode_struct(_read(source, chunk.integer(_CHUNK_INDEXES[0]), index_length))[0]
    locations = tuple((location.integer(1), location.integer(2), location.integer(3)) for location in index.structs(1))
    firsts = [first for _, _, first in locations]
    if not locations or firsts[0] != 0 or firsts != sorted(firsts) or firsts[-1] > group_rows:
        raise ThriftError("page index rows out of order")
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
    return _Plan(start, first_page, end, meta.integer(_META_NUM_VALUES), locations, page, count_kept, values_per_row)


def _cut_at(source: Any, plan: _Plan, group_rows: int) -> _Cut:
    """The cut of ``plan``, checked against the page headers of one side of the cut: the rows
    they count (a flat column's values, a V2 page's rows) must be the rows the index gives that
    side, so that a damaged index cannot shift rows. The V1 pages of a list column (other than
    a fixed-size list without nulls) count values, not rows, so such a column is left whole.
    Counts the kept pages' level values (the cut chunk's num_values) and whether they need the
    dictionary page."""
    locations, page = plan.locations, plan.page
    counted = locations[page:] if plan.count_kept else locations[:page]
    kept_first = locations[page][2]
    headers = [_data_page(source, offset, size) for offset, size, _ in counted]
    side_rows = group_rows - kept_first if plan.count_kept else kept_first
    per_row = plan.values_per_row
    rows = [header.rows if header.rows is not None else header.values // per_row if per_row else None for header in headers]
    if None in rows:  # V1 pages of a list column count values, not rows: the cut cannot be checked
        return _Cut((plan.start, plan.first_page - plan.start), (plan.first_page, plan.end - plan.first_page), 0, plan.num_values)
    if sum(rows) != side_rows:
        raise ThriftError(f"the pages hold {sum(rows)} rows where the page index says {side_rows}")
    values = sum(header.values for header in headers)
    num_values = values if plan.count_kept else plan.num_values - values
    # Writers fall back from dictionary to plain encoding once per column chunk, never back: the
    # kept pages need the dictionary page when their first one does.
    first_kept = headers[0] if plan.count_kept else _data_page(source, locations[page][0], locations[page][1])
    kept = locations[page][0]
    dictionary = (plan.start, plan.first_page - plan.start if first_kept.dictionary else 0)
    return _Cut(dictionary, (kept, plan.end - kept), kept_first, num_values)


def _whole_range(cut: _Cut) -> list[tuple[int, int]]:
    return [(cut.dictionary[0], cut.pages[0] + cut.pages[1])]


def _data_page(source: Any, offset: int, size: int) -> _Page:
    """The header of the page at ``offset`` (the first bytes of the page; statistics in it may
    make it long); a page that is not a data page has no values. ThriftError when the header and
    its page are not ``size`` bytes, as the page index gives."""
    prefix = min(size, _HEADER_READ)
    while True:
        try:
            header, length = decode_struct(_read(source, offset, prefix))
            break
        except ThriftError:
            if prefix == size:
                raise
            prefix = min(size, prefix * 16)
    if length + header.integer(_PAGE_COMPRESSED_SIZE) != size:
        raise ThriftError(f"the page at offset {offset} is not the {size} bytes its page index gives")
    kind = header.integer(_PAGE_TYPE)
    if kind == _DATA_PAGE:
        data = header.struct(_PAGE_DATA_V1)
        return _Page(data.integer(1), None, data.integer(2) in _DICTIONARY_ENCODINGS)
    if kind == _DATA_PAGE_V2:
        data = header.struct(_PAGE_DATA_V2)
        return _Page(data.integer(1), data.integer(3), data.integer(4) in _DICTIONARY_ENCODINGS)
    return _Page(0, 0, False)


def _one_chunk_file(source: Any, thrift: Struct, group: Struct, leaf: int, cut: _Cut, group_rows: int) -> SplicedFile:
    """A Parquet file of one row group in which leaf ``leaf`` is ``cut`` (other leaves keep their
    metadata but point outside the file: they are not projected, so never read). Its bytes are
    read from ``source`` as pyarrow asks for them."""
    dictionary_size, pages_size = cut.dictionary[1], cut.pages[1]
    size = dictionary_size + pages_size
    chunk = group.structs(_GROUP_COLUMNS)[leaf]
    meta = Struct([list(field) for field in chunk.struct(_CHUNK_META).fields])
    meta.set(_META_NUM_VALUES, I64, cut.num_values)
    meta.set(_META_COMPRESSED, I64, size)
    meta.set(_META_DATA_OFFSET, I64, len(MAGIC) + dictionary_size)
    meta.drop(_META_INDEX_OFFSET, _META_STATISTICS, *_META_BLOOM, _META_SIZE_STATISTICS)
    if dictionary_size:
        meta.set(_META_DICT_OFFSET, I64, len(MAGIC))
    else:
        meta.drop(_META_DICT_OFFSET)
    new_chunk = Struct([list(field) for field in chunk.fields if field[0] not in _CHUNK_INDEXES])
    new_chunk.set(_CHUNK_FILE_OFFSET, I64, len(MAGIC))
    new_chunk.set(_CHUNK_META, STRUCT, meta)
    columns = list(group.structs(_GROUP_COLUMNS))
    columns[leaf] = new_chunk
    rows = group_rows - cut.first_row
    new_group = Struct([list(field) for field in group.fields])
    new_group.set(_GROUP_COLUMNS, LIST, ThriftList(STRUCT, columns))
    new_group.set(_GROUP_NUM_ROWS, I64, rows)
    new_group.set(_GROUP_OFFSET, I64, len(MAGIC))
    new_group.set(_GROUP_COMPRESSED, I64, size)
    new_group.drop(_GROUP_ORDINAL)
    footer = Struct([list(field) for field in thrift.fields])
    footer.set(_FILE_NUM_ROWS, I64, rows)
    footer.set(_FILE_ROW_GROUPS, LIST, ThriftList(STRUCT, [new_group]))
    encoded = encode_struct(footer)
    tail = encoded + len(encoded).to_bytes(4, "little") + MAGIC
    return SplicedFile(source, [MAGIC, cut.dictionary, cut.pages, tail])


class SplicedFile(io.RawIOBase):
    """A read-only file made of parts: bytes, or (offset, size) ranges of ``source``."""

    def __init__(self, source: Any, parts: list[bytes | tuple[int, int]]) -> None:
        super().__init__()
        self._source = source
        self._parts = [p for p in parts if (len(p) if isinstance(p, bytes) else p[1])]
        sizes = [len(p) if isinstance(p, bytes) else p[1] for p in self._parts]
        self._starts = [0]
        for size in sizes:
            self._starts.append(self._starts[-1] + size)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._starts[-1]}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int = -1) -> bytes:
        end = self._starts[-1] if size is None or size < 0 else min(self._starts[-1], self._pos + size)
        out = []
        while self._pos < end:
            index = bisect.bisect_right(self._starts, self._pos) - 1
            part, start = self._parts[index], self._starts[index]
            stop = min(end, self._starts[index + 1])
            if isinstance(part, bytes):
                out.append(part[self._pos - start : stop - start])
            else:
                out.append(_read(self._source, part[0] + self._pos - start, stop - self._pos))
            self._pos = stop
        return out[0] if len(out) == 1 else b"".join(out)


class _ColumnStream:
    """One column's decoded arrays, the first ``lead`` rows dropped; ``take(n)`` returns the next
    n, and the column must hold exactly ``rows`` rows (lead included)."""

    def __init__(self, batches: Iterator[pa.RecordBatch], lead: int, rows: int) -> None:
        self._batches = batches
        self._lead = lead
        self._left = rows - lead  # rows still to take
        self._held: list[pa.Array] = []
        self._rows = 0
        self.field: pa.Field | None = None

    def take(self, rows: int) -> pa.ChunkedArray:
        while self._rows < rows:
            batch = next(self._batches, None)
            if batch is None:
                raise ValueError(f"a cut column chunk ended {rows - self._rows} rows early")
            self.field = batch.schema.field(0)
            array = batch.column(0)
            if self._lead:
                dropped = min(self._lead, len(array))
                array, self._lead = array.slice(dropped), self._lead - dropped
            if len(array):
                self._held.append(array)
                self._rows += len(array)
        out, need = [], rows
        while need:
            array = self._held[0]
            if len(array) <= need:
                out.append(self._held.pop(0))
                need -= len(array)
            else:
                out.append(array.slice(0, need))
                self._held[0] = array.slice(need)
                need = 0
        self._rows -= rows
        self._left -= rows
        if self._left == 0 and (self._rows or next(self._batches, None) is not None):
            raise ValueError("a cut column chunk holds more rows than its page index says")
        return pa.chunked_array(out, type=self.field.type)


def _aligned(streams: dict[str, _ColumnStream], rows: int, batch_rows: int, metadata: dict | None) -> Iterator[pa.Table]:
    done, schema = 0, None
    while done < rows:
        take = min(batch_rows, rows - done)
        arrays = [stream.take(take) for stream in streams.values()]
        if schema is None:  # (the fields are known once each stream has decoded a batch)
            schema = pa.schema([stream.field for stream in streams.values()], metadata=metadata)
        yield pa.Table.from_arrays(arrays, schema=schema)
        done += take


def _read(source: Any, offset: int, size: int) -> bytes:
    data = source.read_at(size, offset)
    if len(data) != size:
        raise ThriftError(f"{size} bytes at offset {offset} run past the end of the file")
    return bytes(data)
