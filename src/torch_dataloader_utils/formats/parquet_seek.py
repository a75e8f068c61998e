"""Start decoding a Parquet row group at a page near a given row, not at its first row.

pyarrow decodes a row group from its first page (it cannot yet start at a row:
apache/arrow#45284), so a read that starts deep in a row group (a resume, a split that cuts
a row group) decodes every row before it only to drop them. When the file has a page index
(each page's offset and first row: parquet-mr writes one since 1.11, pyarrow with
``write_page_index=True``), this module cuts each column chunk down to its dictionary page (if
the kept pages use it) and the pages from the one holding the row on, and gives pyarrow that as
a small Parquet file of its own, read from the original file as pyarrow asks: the original
footer with one row group whose one real column chunk is the cut one. Every column is cut at
its own page and then trimmed to the row, so the columns line up.

Nothing here is used when a file has no page index, a projected column has more than one
leaf (a struct or a map) or the file is encrypted: the caller decodes from the first row.
"""

from __future__ import annotations

import bisect
import io
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from .thrift_compact import I64, LIST, STRUCT, Struct, ThriftError, ThriftList, decode_struct, encode_struct

MAGIC = b"PAR1"
# Parquet's thrift field ids (parquet.thrift)
_FILE_NUM_ROWS, _FILE_ROW_GROUPS = 3, 4
_GROUP_COLUMNS, _GROUP_BYTES, _GROUP_NUM_ROWS, _GROUP_OFFSET, _GROUP_COMPRESSED, _GROUP_ORDINAL = 1, 2, 3, 5, 6, 7
_CHUNK_FILE_OFFSET, _CHUNK_META, _CHUNK_INDEXES, _CHUNK_CRYPTO, _CHUNK_ENCRYPTED_META = 2, 3, (4, 5, 6, 7), 8, 9
_META_NUM_VALUES, _META_COMPRESSED, _META_DATA_OFFSET, _META_INDEX_OFFSET = 5, 7, 9, 10
_META_DICT_OFFSET, _META_STATISTICS, _META_BLOOM, _META_SIZE_STATISTICS = 11, 12, (14, 15), 16
_PAGE_TYPE, _PAGE_COMPRESSED_SIZE, _PAGE_DATA_V1, _PAGE_DATA_V2 = 1, 3, 5, 8
_DATA_PAGE, _DATA_PAGE_V2 = 0, 3
_DICTIONARY_ENCODINGS = (2, 8)  # PLAIN_DICTIONARY, RLE_DICTIONARY
_ENCRYPTION_ALGORITHM = 8  # in FileMetaData: set for encrypted files with a plaintext footer
_HEADER_READ = 1024  # bytes read for a page header first
#: seek only when the footer has at most this many bytes per row the seek may save decoding
FOOTER_BYTES_PER_ROW = 1


@dataclass(frozen=True)
class _Cut:
    """One leaf column's chunk from the page holding the wanted row: where its dictionary page
    and its kept pages are in the file, the row the first kept page starts at, and the number
    of level values in the kept pages."""

    dictionary: tuple[int, int]  # (offset, size); size 0: no dictionary page
    pages: tuple[int, int]
    first_row: int
    num_values: int


def footer_struct(footer: pq.FileMetaData) -> Struct:
    """The footer as decoded Thrift (pyarrow serialises it: the bytes between the magics)."""
    sink = pa.BufferOutputStream()
    footer.write_metadata_file(sink)
    data = sink.getvalue().to_pybytes()
    return decode_struct(memoryview(data)[4 : len(data) - 8])[0]


def worth_seeking(footer: pq.FileMetaData, unit: int, columns: list[str] | None, row: int) -> bool:
    """Whether a read from ``row`` of row group ``unit`` should try to seek: every projected leaf
    has a page index, and the footer is small against the rows a seek may save decoding (this
    module decodes the footer in Python, at about 4 MB/s: a byte per row saved stays well below
    what decoding a row costs)."""
    if footer.serialized_size > row * FOOTER_BYTES_PER_ROW:
        return False
    leaves = leaf_columns(footer, columns)
    group = footer.row_group(unit)
    return bool(leaves) and all(group.column(leaf).has_offset_index for leaf in leaves.values())


def leaf_columns(footer: pq.FileMetaData, columns: list[str] | None) -> dict[str, int] | None:
    """Projected top-level column -> the index of its one leaf column; None when a projected
    column has several leaves (a struct or a map)."""
    leaves, first = {}, 0
    for field in footer.schema.to_arrow_schema():
        count = _leaf_count(field.type)
        if columns is None or field.name in columns:
            if count != 1:
                return None
            leaves[field.name] = first
        first += count
    return leaves


def _leaf_count(kind: pa.DataType) -> int:
    if pa.types.is_struct(kind):
        return sum(_leaf_count(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _leaf_count(kind.key_type) + _leaf_count(kind.item_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _leaf_count(kind.value_type)
    return 1


def iter_from_row(
    source: Any, footer: pq.FileMetaData, thrift: Struct, unit: int, columns: list[str] | None, row: int, batch_rows: int, buffer_size: int
) -> Iterator[pa.Table] | None:
    """Rows ``row``.. of row group ``unit`` in tables of ``batch_rows`` rows, each column decoded
    from the page that holds ``row``; None when that cannot be done or gains nothing (no page
    index, a column with several leaves, an encrypted file, ``row`` in every column's first page)."""
    if row <= 0 or thrift.get(_ENCRYPTION_ALGORITHM) is not None:
        return None
    leaves = leaf_columns(footer, columns)
    if not leaves:
        return None
    group = thrift.get(_FILE_ROW_GROUPS).values[unit]
    chunks = group.get(_GROUP_COLUMNS).values
    try:
        cuts = {name: _cut(source, chunks[leaf], row) for name, leaf in leaves.items()}
    except ThriftError:
        return None  # a damaged index: decode from the first row, which names the damage if it matters
    if any(cut is None for cut in cuts.values()) or all(cut.first_row == 0 for cut in cuts.values()):
        return None
    num_rows = group.get(_GROUP_NUM_ROWS)
    streams = {}
    for name, cut in cuts.items():
        spliced = _one_chunk_file(source, thrift, group, leaves[name], cut, num_rows)
        reader = pq.ParquetFile(spliced, pre_buffer=False, buffer_size=buffer_size)
        lead = row - cut.first_row  # decoded and dropped: the first batch holds it and the first rows wanted
        streams[name] = _ColumnStream(reader.iter_batches(batch_size=lead + batch_rows, columns=[name], use_threads=False), lead)
    return _aligned(streams, num_rows - row, batch_rows)


def _cut(source: Any, chunk: Struct, row: int) -> _Cut | None:
    if chunk.get(_CHUNK_CRYPTO) is not None or chunk.get(_CHUNK_ENCRYPTED_META) is not None:
        return None
    index_offset, index_length = chunk.get(_CHUNK_INDEXES[0]), chunk.get(_CHUNK_INDEXES[1])
    meta = chunk.get(_CHUNK_META)
    if index_offset is None or not index_length or meta is None:
        return None
    locations = decode_struct(_read(source, index_offset, index_length))[0].get(1)
    if not isinstance(locations, ThriftList) or not locations.values:
        return None
    firsts = [location.get(3) for location in locations.values]
    # the last page that starts at or before the row: pages begin at row boundaries when a file
    # has a page index (parquet.thrift); of pages that start at the same row, all but the last
    # are empty (pyarrow writes such pages)
    page = max(0, bisect.bisect_right(firsts, row) - 1)
    first_page = locations.values[0].get(1)
    start = meta.get(_META_DICT_OFFSET) or meta.get(_META_DATA_OFFSET)
    start = min(start, meta.get(_META_DATA_OFFSET))
    end = start + meta.get(_META_COMPRESSED)
    kept = [(location.get(1), location.get(2)) for location in locations.values[page:]]
    if not start <= first_page <= kept[0][0] or sum(size for _, size in kept) != end - kept[0][0]:
        raise ThriftError("page index does not match its column chunk")
    headers = [_data_page(source, offset, size) for offset, size in kept]
    num_values = sum(values for values, _ in headers)
    needs_dictionary = any(dictionary for _, dictionary in headers)
    dictionary = (start, first_page - start) if needs_dictionary else (start, 0)
    return _Cut(dictionary, (kept[0][0], end - kept[0][0]), firsts[page], num_values)


def _data_page(source: Any, offset: int, size: int) -> tuple[int, bool]:
    """The level values of the data page at ``offset`` and whether they are dictionary-encoded
    ((0, False) for another kind of page), from its header (the first bytes of the page;
    statistics in it may make it long)."""
    prefix = min(size, _HEADER_READ)
    while True:
        try:
            header = decode_struct(_read(source, offset, prefix))[0]
            break
        except ThriftError:
            if prefix == size:
                raise
            prefix = min(size, prefix * 16)
    kind = header.get(_PAGE_TYPE)
    if kind not in (_DATA_PAGE, _DATA_PAGE_V2):
        return 0, False
    data = header.get(_PAGE_DATA_V1 if kind == _DATA_PAGE else _PAGE_DATA_V2)
    encoding = data.get(2 if kind == _DATA_PAGE else 4)
    return data.get(1), encoding in _DICTIONARY_ENCODINGS


def _one_chunk_file(source: Any, thrift: Struct, group: Struct, leaf: int, cut: _Cut, group_rows: int) -> "SplicedFile":
    """A Parquet file of one row group in which leaf ``leaf`` is ``cut`` (other leaves keep their
    metadata but point outside the file: they are not projected, so never read). Its bytes are
    read from ``source`` as pyarrow asks for them."""
    dictionary_size, pages_size = cut.dictionary[1], cut.pages[1]
    size = dictionary_size + pages_size
    chunk = group.get(_GROUP_COLUMNS).values[leaf]
    meta = Struct([list(field) for field in chunk.get(_CHUNK_META).fields])
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
    columns = list(group.get(_GROUP_COLUMNS).values)
    columns[leaf] = new_chunk
    rows = group_rows - cut.first_row
    new_group = Struct([list(field) for field in group.fields])
    new_group.set(_GROUP_COLUMNS, LIST, ThriftList(STRUCT, columns))
    new_group.set(_GROUP_NUM_ROWS, I64, rows)
    new_group.set(_GROUP_BYTES, I64, size)
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

    def __init__(self, source: Any, parts: list[bytes | tuple[int, int]]):
        super().__init__()
        self._source = source
        self._parts = [p for p in parts if len(p) if isinstance(p, bytes) or p[1]]
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
    """One column's decoded arrays, the first ``lead`` rows dropped; ``take(n)`` returns the next n."""

    def __init__(self, batches: Iterator[pa.RecordBatch], lead: int):
        self._batches = batches
        self._lead = lead
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
        return pa.chunked_array(out, type=self.field.type)


def _aligned(streams: dict[str, _ColumnStream], rows: int, batch_rows: int) -> Iterator[pa.Table]:
    done = 0
    while done < rows:
        take = min(batch_rows, rows - done)
        arrays = {name: stream.take(take) for name, stream in streams.items()}
        fields = [streams[name].field for name in arrays]
        yield pa.Table.from_arrays(list(arrays.values()), schema=pa.schema(fields))
        done += take


def _read(source: Any, offset: int, size: int) -> bytes:
    data = source.read_at(size, offset)
    if len(data) != size:
        raise ThriftError(f"{size} bytes at offset {offset} run past the end of the file")
    return bytes(data)
