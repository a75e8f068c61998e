"""Private: what an open Parquet file's readers of page indexes decode once and keep, by (row
group, leaf column): each column chunk's offset index (checked against the chunk) with the page
headers read so far and its column index's page bounds, and zstd dictionary pages stored
decompressed (``_parquet_dictionary``). One cache serves the page-range read of random access
(``_parquet_range``) and filter pruning by page (``_parquet_page_index``), so that a row group's
page index is decoded once in a reader whichever reads it first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..lru import Lru
from ._parquet_footer import CHUNK_INDEXES, CHUNK_META, META_COMPRESSED, META_DATA_OFFSET, META_DICT_OFFSET
from ._parquet_pages import Page, page_locations
from ._thrift_compact import Struct, ThriftError

#: Column chunks whose decoded page index a reader keeps (a few hundred bytes to a few KB each):
#: every chunk of a file of 128 row groups of 4 columns.
KEPT_CHUNKS = 512
#: bytes of dictionary pages a reader keeps decompressed (``_parquet_dictionary``)
KEPT_DICTIONARY_BYTES = 16 << 20
#: a dictionary page is kept decompressed from this use on: decompressing it to keep it costs
#: more than the read that asks (about 1.2x), so it pays from the next use on
STORED_FROM_USE = 3

Key = tuple[int, int]  # (row group, leaf column)


class ChunkPages:
    """A column chunk's offset index as decoded: (offset, size, first row) per page, the rows
    each page's header counts and the headers read (None: not read yet), and the page bounds
    of its column index (None: not decoded yet)."""

    __slots__ = ("bounds", "counts", "firsts", "headers", "locations")

    def __init__(self, locations: tuple[tuple[int, int, int], ...]) -> None:
        self.locations = locations
        self.firsts = [first for _, _, first in locations]
        self.counts: list[int | None] = [None] * len(locations)
        self.headers: list[Page | None] = [None] * len(locations)
        self.bounds: Any = None


class PageIndexes:
    """One file's decoded page indexes, the ``KEPT_CHUNKS`` used last, and its stored dictionary
    pages, the ``KEPT_DICTIONARY_BYTES`` used last."""

    def __init__(self) -> None:
        self._chunks: Lru[Key, ChunkPages] = Lru(KEPT_CHUNKS)
        # -> the chunk's dictionary page with its values stored, or None: read as it is (a page
        # of few values, or one used less than STORED_FROM_USE times so far)
        self._dictionaries: OrderedDict[Key, bytes | None] = OrderedDict()
        self._dictionary_bytes = 0
        self._uses: dict[Key, int] = {}  # of the dictionaries not stored (yet)

    def get(self, key: Key) -> ChunkPages | None:
        return self._chunks.find(key)

    def put(self, key: Key, chunk: ChunkPages) -> None:
        self._chunks.put(key, chunk)

    def load(self, source: Any, key: Key, chunk: Struct, group_rows: int, name: str) -> ChunkPages:
        """Column chunk ``chunk``'s (of column ``name``) offset index, decoded from ``source``
        and kept when not kept yet; ThriftError when it does not cover the chunk's pages."""
        return self._chunks.get(key, lambda: ChunkPages(_checked(source, chunk, group_rows, name)))

    def dictionary(self, key: Key, make: Callable[[], bytes | None]) -> bytes | None:
        """The chunk's dictionary page with its values stored: None before its
        ``STORED_FROM_USE``-th use, then ``make()`` (once; None: never)."""
        if key not in self._dictionaries:
            self._dictionaries[key] = None
            self._uses[key] = 0
        if key in self._uses:
            self._uses[key] += 1
            if self._uses[key] >= STORED_FROM_USE:
                del self._uses[key]
                made = self._dictionaries[key] = make()
                self._dictionary_bytes += len(made or b"")
        self._dictionaries.move_to_end(key)
        page = self._dictionaries[key]
        while self._dictionary_bytes > KEPT_DICTIONARY_BYTES or len(self._dictionaries) > KEPT_CHUNKS:
            evicted, dropped = self._dictionaries.popitem(last=False)
            self._dictionary_bytes -= len(dropped or b"")
            self._uses.pop(evicted, None)
        return page


def index_range(chunk: Struct) -> tuple[int, int]:
    """(offset, length) of a column chunk's offset index."""
    return chunk.integer(CHUNK_INDEXES[0]), chunk.integer(CHUNK_INDEXES[1])


def _checked(source: Any, chunk: Struct, group_rows: int, name: str) -> tuple[tuple[int, int, int], ...]:
    locations = page_locations(source, *index_range(chunk), group_rows)
    meta = chunk.struct(CHUNK_META)
    data = meta.integer(META_DATA_OFFSET)
    end = min(meta.integer(META_DICT_OFFSET, data) or data, data) + meta.integer(META_COMPRESSED)
    offsets = [offset for offset, _, _ in locations]
    ends = [offset + size for offset, size, _ in locations]
    if offsets[0] != data or ends[-1] != end or offsets[1:] != ends[:-1]:
        raise ThriftError(f"the page index of column {name!r} does not match its column chunk")
    return locations
