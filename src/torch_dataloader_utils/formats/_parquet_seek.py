"""Start decoding a Parquet row group at a page near a given row, not at its first row.

pyarrow decodes a row group from its first page (it cannot yet start at a row:
apache/arrow#45284), so a read that starts deep in a row group (a resume, a split that cuts
a row group) decodes every row before it only to drop them. When the file has a page index
(each page's offset and first row: parquet-mr writes one since 1.11, pyarrow with
``write_page_index=True``), this module cuts each column chunk down to its dictionary page (if
the kept pages use it) and the pages from the one holding the row on, and gives pyarrow the
columns cut at the same row as a small Parquet file of their own, read from the original file
as pyarrow asks, under a footer of those columns and one row group. Every column is cut at its
own page and then trimmed to the row, so the columns line up. A caller that holds only the
bytes it fetched (an object store's file) is told which ranges the cut reads, after the page
indexes and before anything else (``fetch``).

A column whose page index and page headers would cost more Python than the decoding they
save is read whole and trimmed. Nothing is cut when a file has no page index, a projected
column has more than one leaf (a struct or a map), the file is encrypted, or the page index
does not match the pages (``ThriftError``): the caller then decodes from the first row.
"""

from __future__ import annotations

import base64
import bisect
import io
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from ._thrift_compact import BINARY, I32, I64, LIST, STRUCT, Struct, ThriftError, ThriftList, decode_struct, encode_struct

MAGIC = b"PAR1"
# Parquet's thrift field ids (parquet.thrift)
_FILE_VERSION, _FILE_SCHEMA, _FILE_NUM_ROWS, _FILE_ROW_GROUPS, _FILE_KEY_VALUES, _FILE_CREATED_BY, _FILE_COLUMN_ORDERS = 1, 2, 3, 4, 5, 6, 7
_SCHEMA_TYPE, _SCHEMA_NUM_CHILDREN = 1, 5
_GROUP_COLUMNS, _GROUP_BYTES, _GROUP_NUM_ROWS, _GROUP_OFFSET, _GROUP_COMPRESSED = 1, 2, 3, 5, 6
_CHUNK_FILE_OFFSET, _CHUNK_META, _CHUNK_INDEXES, _CHUNK_CRYPTO, _CHUNK_ENCRYPTED_META = 2, 3, (4, 5, 6, 7), 8, 9
_META_NUM_VALUES, _META_UNCOMPRESSED, _META_COMPRESSED, _META_DATA_OFFSET, _META_INDEX_OFFSET = 5, 6, 7, 9, 10
_META_DICT_OFFSET, _META_STATISTICS, _META_BLOOM, _META_SIZE_STATISTICS = 11, 12, (14, 15), 16
_PAGE_TYPE, _PAGE_COMPRESSED_SIZE, _PAGE_DATA_V1, _PAGE_DATA_V2 = 1, 3, 5, 8
_DATA_PAGE, _DATA_PAGE_V2 = 0, 3
_DICTIONARY_ENCODINGS = (2, 8)  # PLAIN_DICTIONARY, RLE_DICTIONARY
_ENCRYPTION_ALGORITHM = 8  # in FileMetaData: set for encrypted files with a plaintext footer
_ARROW_SCHEMA = b"ARROW:schema"  # the key of the Arrow schema pyarrow stores in a file's metadata
_HEADER_READ = 1024  # bytes read for a page header first
# What this module's Python costs, in compressed column bytes pyarrow decodes in the same time
# (measured: Thrift decodes at 2 to 4 MB/s here, a page header read takes about 0.15 ms, and
# pyarrow decodes compressed column bytes at 2 ns (plain int64) to 6 ns (zstd text) each;
# rounded up, so that a doubtful seek is left to the plain read):
#: per byte of footer or page index decoded
THRIFT_BYTE_COST = 256
#: per byte of footer skipped (the row groups not read)
THRIFT_SKIP_BYTE_COST = 128
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


def footer_struct(footer: pq.FileMetaData, unit: int, data: bytes | None = None) -> Struct:
    """The footer as decoded Thrift, with row group ``unit`` alone decoded (the others are None:
    see ``row_group``). ``data``: the footer's bytes as the file holds them, when the caller has
    them (else pyarrow serialises ``footer``, which costs about 0.6 ms in a new process)."""
    if data is None:
        sink = pa.BufferOutputStream()
        footer.write_metadata_file(sink)
        written = sink.getvalue().to_pybytes()
        data = written[len(MAGIC) : len(written) - 4 - len(MAGIC)]
    return decode_struct(data, only=(_FILE_ROW_GROUPS, unit))[0]


def footer_bytes(source: Any, footer: pq.FileMetaData) -> bytes | None:
    """The bytes of ``footer`` read from the end of ``source`` (a local file), or None when the
    file does not end in a plain footer of that size."""
    size = source.size()
    if size < footer.serialized_size + 4 + 2 * len(MAGIC):
        return None
    tail = source.read_at(4 + len(MAGIC), size - 4 - len(MAGIC))
    if tail[4:] != MAGIC or int.from_bytes(tail[:4], "little") != footer.serialized_size:
        return None
    return _read(source, size - len(tail) - footer.serialized_size, footer.serialized_size)


def row_group(thrift: Struct, unit: int) -> Struct:
    """Row group ``unit`` of a footer from ``footer_struct(footer, unit)``."""
    groups = thrift.get(_FILE_ROW_GROUPS)
    group = groups.values[unit] if isinstance(groups, ThriftList) and 0 <= unit < len(groups.values) else None
    if not isinstance(group, Struct):
        raise ThriftError(f"the footer has no row group {unit}")
    return group


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
    return _footer_cost(footer) <= before_row and all(chunk.has_offset_index for chunk in chunks)


def _footer_cost(footer: pq.FileMetaData) -> int:
    """``footer_struct``'s cost, in column bytes: one row group decoded, the others skipped."""
    size = footer.serialized_size
    return size * THRIFT_SKIP_BYTE_COST + size // max(1, footer.num_row_groups) * THRIFT_BYTE_COST


def offset_index_ranges(footer: pq.FileMetaData, thrift: Struct, unit: int, columns: list[str] | None) -> list[tuple[int, int]]:
    """[start, end) of the projected columns' offset indexes in row group ``unit`` (those it
    has): what ``iter_from_row`` reads first, for a caller that fetches bytes ahead."""
    chunks = row_group(thrift, unit).structs(_GROUP_COLUMNS)
    ranges = []
    for leaf in (leaf_columns(footer, columns) or {}).values():
        offset, length = chunks[leaf].integer(_CHUNK_INDEXES[0], 0), chunks[leaf].integer(_CHUNK_INDEXES[1], 0)
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
    first_leaf, leaf = {}, 0
    for field in schema:
        first_leaf[field.name] = leaf if _leaf_count(field.type) == 1 else None
        leaf += _leaf_count(field.type)
    if leaf != num_leaves or any(first_leaf[name] is None for name in wanted):
        return None
    return {name: first_leaf[name] for name in wanted}


def _leaf_count(kind: pa.DataType) -> int:
    """The Parquet leaf columns of an Arrow type (as pyarrow writes it)."""
    if isinstance(kind, pa.ExtensionType):
        return _leaf_count(kind.storage_type)
    if pa.types.is_struct(kind):
        return sum(_leaf_count(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _leaf_count(kind.key_type) + _leaf_count(kind.item_type)
    if any(test(kind) for test in (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list, pa.types.is_list_view, pa.types.is_large_list_view)):
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
    leaves = _leaves(schema, columns, footer.num_columns)
    if not leaves:
        return None
    group = row_group(thrift, unit)
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
    cuts = {name: _cut_at(source, plan, num_rows) if isinstance(plan, _Plan) else plan for name, plan in plans.items()}
    by_first_row: dict[int, dict[int, str]] = {}  # columns cut at the same row share a file
    for name, cut in cuts.items():
        by_first_row.setdefault(cut.first_row, {})[leaves[name]] = name
    streams = []
    for first_row, names in by_first_row.items():
        spliced = _cut_file(source, thrift, schema, unit, {leaf: (name, cuts[name]) for leaf, name in names.items()}, num_rows - first_row)
        reader = pq.ParquetFile(spliced, pre_buffer=False, buffer_size=buffer_size)
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


def _cut_file(source: Any, thrift: Struct, schema: pa.Schema, unit: int, columns: dict[int, tuple[str, _Cut]], rows: int) -> SplicedFile:
    """A Parquet file of row group ``unit``'s ``columns`` (leaf -> name and cut; all cut at the
    same row) alone, in one row group of ``rows`` rows: their dictionary and kept pages, read from
    ``source`` as pyarrow asks for them, under a footer of these columns alone (their schema,
    Arrow types, column orders and the file's writer)."""
    chunks = row_group(thrift, unit).structs(_GROUP_COLUMNS)
    parts: list[bytes | tuple[int, int]] = [MAGIC]
    new_chunks, offset, uncompressed = [], len(MAGIC), 0
    for leaf in sorted(columns):  # the file's column order, as the schema's
        cut = columns[leaf][1]
        meta = Struct([list(field) for field in chunks[leaf].struct(_CHUNK_META).fields])
        uncompressed += meta.integer(_META_UNCOMPRESSED)
        meta.set(_META_NUM_VALUES, I64, cut.num_values)
        meta.set(_META_COMPRESSED, I64, cut.dictionary[1] + cut.pages[1])
        meta.set(_META_DATA_OFFSET, I64, offset + cut.dictionary[1])
        meta.drop(_META_INDEX_OFFSET, _META_STATISTICS, *_META_BLOOM, _META_SIZE_STATISTICS)
        if cut.dictionary[1]:
            meta.set(_META_DICT_OFFSET, I64, offset)
        else:
            meta.drop(_META_DICT_OFFSET)
        chunk = Struct([list(field) for field in chunks[leaf].fields if field[0] not in _CHUNK_INDEXES])
        chunk.set(_CHUNK_FILE_OFFSET, I64, offset)
        chunk.set(_CHUNK_META, STRUCT, meta)
        new_chunks.append(chunk)
        parts += [cut.dictionary, cut.pages]
        offset += cut.dictionary[1] + cut.pages[1]
    group = Struct(
        [
            [_GROUP_COLUMNS, LIST, ThriftList(STRUCT, new_chunks)],
            [_GROUP_BYTES, I64, uncompressed],
            [_GROUP_NUM_ROWS, I64, rows],
            [_GROUP_OFFSET, I64, len(MAGIC)],
            [_GROUP_COMPRESSED, I64, offset - len(MAGIC)],
        ]
    )
    encoded = encode_struct(_footer_of(thrift, schema, {leaf: columns[leaf][0] for leaf in sorted(columns)}, rows, group))
    return SplicedFile(source, parts + [encoded + len(encoded).to_bytes(4, "little") + MAGIC])


def _footer_of(thrift: Struct, schema: pa.Schema, leaves: dict[int, str], rows: int, group: Struct) -> Struct:
    """The file footer ``thrift`` cut down to the top-level columns ``leaves`` (first leaf ->
    name; one leaf each, in the file's order) and to the one row group ``group``."""
    elements = thrift.structs(_FILE_SCHEMA)
    subtrees = _subtrees(elements)
    if any(subtrees.get(leaf, (None, 0))[1] != 1 for leaf in leaves):  # (one leaf each, as _leaves found)
        raise ThriftError("the footer's schema does not match its Arrow types")
    root = Struct([list(field) for field in elements[0].fields])
    root.set(_SCHEMA_NUM_CHILDREN, I32, len(leaves))
    footer = Struct(
        [
            [_FILE_VERSION, I32, thrift.integer(_FILE_VERSION)],
            [_FILE_SCHEMA, LIST, ThriftList(STRUCT, [root] + [element for leaf in leaves for element in subtrees[leaf][0]])],
            [_FILE_NUM_ROWS, I64, rows],
            [_FILE_ROW_GROUPS, LIST, ThriftList(STRUCT, [group])],
        ]
    )
    pairs = thrift.get(_FILE_KEY_VALUES)
    if pairs is not None and any(pair.get(1) == _ARROW_SCHEMA for pair in pairs.values):
        # the Arrow types of these columns alone (pyarrow matches them to the file's columns by
        # position). (Schema.remove: pa.schema's first call in a process costs ~0.6 ms of ABC checks)
        fields, kept = schema.remove_metadata(), set(leaves.values())
        for index, name in reversed(list(enumerate(schema.names))):
            if name not in kept:
                fields = fields.remove(index)
        arrow_schema = base64.b64encode(fields.serialize().to_pybytes())
        footer.set(_FILE_KEY_VALUES, LIST, ThriftList(STRUCT, [Struct([[1, BINARY, _ARROW_SCHEMA], [2, BINARY, arrow_schema]])]))
    if thrift.get(_FILE_CREATED_BY) is not None:  # (pyarrow works around known writer bugs by it)
        footer.set(_FILE_CREATED_BY, BINARY, thrift.get(_FILE_CREATED_BY))
    orders = thrift.get(_FILE_COLUMN_ORDERS)
    if isinstance(orders, ThriftList) and len(orders.values) > max(leaves):  # (one per leaf column)
        footer.set(_FILE_COLUMN_ORDERS, LIST, ThriftList(orders.element, [orders.values[leaf] for leaf in leaves]))
    return footer


def _subtrees(elements: list[Struct]) -> dict[int, tuple[list[Struct], int]]:
    """The schema elements of each top-level column (a depth-first list under the root) and its
    number of leaves, by the index of its first leaf column. A leaf has no children, or none and
    a type (as parquet-cpp reads elements; some writers set 0 on leaves)."""
    out, index, leaf = {}, 1, 0
    while index < len(elements):
        start, pending, leaves = index, 1, 0
        while pending:
            if index >= len(elements):
                raise ThriftError("the schema ends inside a column")
            children = elements[index].get(_SCHEMA_NUM_CHILDREN)
            is_leaf = children is None or (children == 0 and elements[index].get(_SCHEMA_TYPE) is not None)
            pending += (0 if is_leaf else children) - 1
            leaves += is_leaf
            index += 1
        out[leaf] = (elements[start:index], leaves)
        leaf += leaves
    return out


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


def _read(source: Any, offset: int, size: int) -> bytes:
    data = source.read_at(size, offset)
    if len(data) != size:
        raise ThriftError(f"{size} bytes at offset {offset} run past the end of the file")
    return bytes(data)
