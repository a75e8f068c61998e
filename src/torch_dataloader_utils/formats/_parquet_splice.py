"""Private: a small Parquet file made of cut column chunks, for pyarrow to decode from the page
holding a wanted row (``_parquet_seek``).

It exists because pyarrow decodes a row group only from its first page (apache/arrow#45284):
handing it the kept pages as a file of their own, under a footer of those columns and one row
group, is the way to start decoding at a page. The file's bytes are the original file's,
read as pyarrow asks for them (``SplicedFile``); only the footer is new. When pyarrow can start
at a row itself, this module goes with the seek.
"""

from __future__ import annotations

import base64
import bisect
import io
import weakref
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ._parquet_footer import (
    ARROW_SCHEMA_KEY,
    CHUNK_FILE_OFFSET,
    CHUNK_INDEXES,
    CHUNK_META,
    FILE_COLUMN_ORDERS,
    FILE_CREATED_BY,
    FILE_KEY_VALUES,
    FILE_NUM_ROWS,
    FILE_ROW_GROUPS,
    FILE_SCHEMA,
    FILE_VERSION,
    GROUP_BYTES,
    GROUP_COLUMNS,
    GROUP_COMPRESSED,
    GROUP_NUM_ROWS,
    GROUP_OFFSET,
    MAGIC,
    META_BLOOM,
    META_COMPRESSED,
    META_DATA_OFFSET,
    META_DICT_OFFSET,
    META_INDEX_OFFSET,
    META_NUM_VALUES,
    META_SIZE_STATISTICS,
    META_STATISTICS,
    META_UNCOMPRESSED,
    SCHEMA_NUM_CHILDREN,
    SCHEMA_TYPE,
    read_exact,
    row_group,
)
from ._parquet_pages import Cut
from ._thrift_compact import BINARY, I32, I64, LIST, STRUCT, Struct, ThriftError, ThriftList, encode_struct, frozen

# a decoded footer -> what its cut files' footers share, built once (``_templates``)
_TEMPLATES: weakref.WeakKeyDictionary[Struct, dict[tuple, Any]] = weakref.WeakKeyDictionary()


def cut_file(source: Any, thrift: Struct, schema: pa.Schema, unit: int, columns: dict[int, tuple[str, Cut]], rows: int) -> SplicedFile:
    """A Parquet file of row group ``unit``'s ``columns`` (leaf -> name and cut; all cut at the
    same row) alone, in one row group of ``rows`` rows: their dictionary and kept pages, read from
    ``source`` as pyarrow asks for them, under a footer of these columns alone (their schema,
    Arrow types, column orders and the file's writer)."""
    return SplicedFile(source, _parts(thrift, schema, unit, columns, rows))


def spliced_bytes(thrift: Struct, schema: pa.Schema, unit: int, columns: dict[int, tuple[str, Cut, Any, Any]], rows: int) -> bytes:
    """``cut_file``'s file in memory, from the bytes of each cut's dictionary page and kept pages
    (leaf -> name, cut, dictionary bytes, pages bytes; the dictionary's may be empty)."""
    held = {}
    for _, cut, dictionary, pages in columns.values():
        held[cut.dictionary] = dictionary
        held[cut.pages] = pages
    parts = _parts(thrift, schema, unit, {leaf: (name, cut) for leaf, (name, cut, _, _) in columns.items()}, rows)
    return b"".join(part if isinstance(part, bytes) else held[part] for part in parts if (len(part) if isinstance(part, bytes) else part[1]))


def in_place_footer(thrift: Struct, schema: pa.Schema, unit: int, columns: dict[int, tuple[str, Cut]], rows: int) -> pq.FileMetaData:
    """``cut_file``'s footer with the cuts where they are in the original file: pyarrow reads
    the original file under it (every cut's dictionary page, if it keeps one, must be right
    before its pages, as pyarrow reads a column chunk's bytes in one range)."""
    if any(cut.dictionary[1] and sum(cut.dictionary) != cut.pages[0] for _, cut in columns.values()):
        raise ValueError("a cut's dictionary page is not right before its pages")
    footer = _parts(thrift, schema, unit, columns, rows, in_place=True)[-1]
    assert isinstance(footer, bytes)
    return pq.ParquetFile(pa.BufferReader(MAGIC + footer)).metadata


def _parts(
    thrift: Struct, schema: pa.Schema, unit: int, columns: dict[int, tuple[str, Cut]], rows: int, in_place: bool = False
) -> list[bytes | tuple[int, int]]:
    templates = _templates(thrift)
    parts: list[bytes | tuple[int, int]] = [MAGIC]
    new_chunks, offset, uncompressed, first_offset = [], len(MAGIC), 0, None
    for leaf in sorted(columns):  # the file's column order, as the schema's
        cut = columns[leaf][1]
        if in_place:
            offset = cut.dictionary[0] if cut.dictionary[1] else cut.pages[0]
        first_offset = offset if first_offset is None else first_offset
        chunk_template, meta_template, chunk_uncompressed = templates.get(("chunk", unit, leaf)) or _chunk_template(thrift, unit, leaf)
        uncompressed += chunk_uncompressed
        meta = Struct([list(field) for field in meta_template.fields])
        meta.set(META_NUM_VALUES, I64, cut.num_values)
        meta.set(META_COMPRESSED, I64, cut.dictionary[1] + cut.pages[1])
        meta.set(META_DATA_OFFSET, I64, offset + cut.dictionary[1])
        if cut.dictionary[1]:
            meta.set(META_DICT_OFFSET, I64, offset)
        chunk = Struct([list(field) for field in chunk_template.fields])
        chunk.set(CHUNK_FILE_OFFSET, I64, offset)
        chunk.set(CHUNK_META, STRUCT, meta)
        new_chunks.append(chunk)
        parts += [cut.dictionary, cut.pages]
        offset += cut.dictionary[1] + cut.pages[1]
    group = Struct(
        [
            [GROUP_COLUMNS, LIST, ThriftList(STRUCT, new_chunks)],
            [GROUP_BYTES, I64, uncompressed],
            [GROUP_NUM_ROWS, I64, rows],
            [GROUP_OFFSET, I64, first_offset],
            [GROUP_COMPRESSED, I64, sum(cut.dictionary[1] + cut.pages[1] for _, cut in columns.values())],
        ]
    )
    encoded = encode_struct(_footer_of(thrift, schema, {leaf: columns[leaf][0] for leaf in sorted(columns)}, rows, group))
    return parts + [encoded + len(encoded).to_bytes(4, "little") + MAGIC]


def _templates(thrift: Struct) -> dict[tuple, Any]:
    found = _TEMPLATES.get(thrift)
    if found is None:
        found = _TEMPLATES[thrift] = {}
    return found


def _chunk_template(thrift: Struct, unit: int, leaf: int) -> tuple[Struct, Struct, int]:
    """Column chunk ``leaf`` of row group ``unit`` without what a cut changes or drops (its
    ColumnMetaData apart), the rest encoded once, and its uncompressed size."""
    original = row_group(thrift, unit).structs(GROUP_COLUMNS)[leaf]
    meta = Struct([list(field) for field in original.struct(CHUNK_META).fields])
    size = meta.integer(META_UNCOMPRESSED)
    meta.drop(META_INDEX_OFFSET, META_STATISTICS, *META_BLOOM, META_SIZE_STATISTICS, META_DICT_OFFSET)
    chunk = Struct([list(field) for field in original.fields if field[0] not in CHUNK_INDEXES and field[0] != CHUNK_META])
    made = _templates(thrift)[("chunk", unit, leaf)] = (frozen(chunk), frozen(meta), size)
    return made


def _footer_of(thrift: Struct, schema: pa.Schema, leaves: dict[int, str], rows: int, group: Struct) -> Struct:
    """The file footer ``thrift`` cut down to the top-level columns ``leaves`` (first leaf ->
    name; one leaf each, in the file's order) and to the one row group ``group``."""
    key = ("footer", *leaves.items())
    templates = _templates(thrift)
    template = templates.get(key)
    if template is None:
        template = templates[key] = frozen(_footer_template(thrift, schema, leaves))
    footer = Struct([list(field) for field in template.fields])
    footer.set(FILE_NUM_ROWS, I64, rows)
    footer.set(FILE_ROW_GROUPS, LIST, ThriftList(STRUCT, [group]))
    return footer


def _footer_template(thrift: Struct, schema: pa.Schema, leaves: dict[int, str]) -> Struct:
    """``_footer_of``'s footer without its rows and row group."""
    elements = thrift.structs(FILE_SCHEMA)
    subtrees = _subtrees(elements)
    if any(subtrees.get(leaf, (None, 0))[1] != 1 for leaf in leaves):  # (one leaf each, as the Arrow types said)
        raise ThriftError("the footer's schema does not match its Arrow types")
    root = Struct([list(field) for field in elements[0].fields])
    root.set(SCHEMA_NUM_CHILDREN, I32, len(leaves))
    footer = Struct(
        [
            [FILE_VERSION, I32, thrift.integer(FILE_VERSION)],
            [FILE_SCHEMA, LIST, ThriftList(STRUCT, [root] + [element for leaf in leaves for element in subtrees[leaf][0]])],
        ]
    )
    pairs = thrift.get(FILE_KEY_VALUES)
    if pairs is not None and any(pair.get(1) == ARROW_SCHEMA_KEY for pair in pairs.values):
        # the Arrow types of these columns alone (pyarrow matches them to the file's columns by
        # position); Schema.remove, not pa.schema, whose first call in a process is slow (ABC checks)
        fields, kept = schema.remove_metadata(), set(leaves.values())
        for index, name in reversed(list(enumerate(schema.names))):
            if name not in kept:
                fields = fields.remove(index)
        arrow_schema = base64.b64encode(fields.serialize().to_pybytes())
        footer.set(FILE_KEY_VALUES, LIST, ThriftList(STRUCT, [Struct([[1, BINARY, ARROW_SCHEMA_KEY], [2, BINARY, arrow_schema]])]))
    if thrift.get(FILE_CREATED_BY) is not None:  # (pyarrow works around known writer bugs by it)
        footer.set(FILE_CREATED_BY, BINARY, thrift.get(FILE_CREATED_BY))
    orders = thrift.get(FILE_COLUMN_ORDERS)
    if isinstance(orders, ThriftList) and len(orders.values) > max(leaves):  # (one per leaf column)
        footer.set(FILE_COLUMN_ORDERS, LIST, ThriftList(orders.element, [orders.values[leaf] for leaf in leaves]))
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
            children = elements[index].get(SCHEMA_NUM_CHILDREN)
            is_leaf = children is None or (children == 0 and elements[index].get(SCHEMA_TYPE) is not None)
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
                out.append(read_exact(self._source, part[0] + self._pos - start, stop - self._pos))
            self._pos = stop
        return out[0] if len(out) == 1 else b"".join(out)
