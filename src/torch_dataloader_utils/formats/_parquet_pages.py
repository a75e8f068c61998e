"""Private: a Parquet column chunk's pages, from its offset index (each page's offset, size and
first row) and its page headers, for the page-level seek (``_parquet_seek``).

It exists because pyarrow neither reads a column chunk's offset index nor its page headers
into Python, nor starts decoding at a page (apache/arrow#45284); when it does, this module and
the seek go.

A cut keeps a column chunk's dictionary page (when the kept pages use it) and its pages from
the one holding the wanted row on. Before a cut is used, the page headers of one side of it are
read and their rows checked against the offset index, so that a damaged index cannot shift rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._parquet_footer import (
    DATA_PAGE,
    DATA_PAGE_V2,
    DICTIONARY_ENCODINGS,
    PAGE_COMPRESSED_SIZE,
    PAGE_DATA_V1,
    PAGE_DATA_V2,
    PAGE_TYPE,
    read_exact,
)
from ._thrift_compact import ThriftError, decode_struct

HEADER_READ = 1024  # bytes read for a page header first


@dataclass(frozen=True)
class Cut:
    """One leaf column's chunk from the page holding the wanted row: where its dictionary page
    and its kept pages are in the file, the row the first kept page starts at, and the number
    of level values in the kept pages."""

    dictionary: tuple[int, int]  # (offset, size); size 0: no dictionary page
    pages: tuple[int, int]
    first_row: int
    num_values: int

    def whole_range(self) -> list[tuple[int, int]]:
        """The bytes the cut spans, dictionary page included."""
        return [(self.dictionary[0], self.pages[0] + self.pages[1])]


@dataclass(frozen=True)
class Page:
    """What a data page's header says: its level values, its rows (V2 pages only) and whether
    its values are dictionary-encoded."""

    values: int
    rows: int | None
    dictionary: bool


@dataclass(frozen=True)
class CutPlan:
    """Where a column chunk is cut, decided from its offset index alone: its bytes [start, end),
    its first data page, the index's (offset, size, first row) per page and the page kept
    first. The page headers of one side of the cut are read next (``check_cut``)."""

    start: int
    first_page: int
    end: int
    num_values: int
    locations: tuple[tuple[int, int, int], ...]
    page: int
    count_kept: bool  # count the kept pages' headers (else those of the shorter side)
    values_per_row: int | None  # level values per row (see _parquet_seek._values_per_row)

    def ranges(self) -> list[tuple[int, int]]:
        """The bytes ``check_cut`` and the cut file may read: the dictionary page (if any) and
        the kept pages; the whole chunk when V1 pages could leave the column whole (see check_cut)."""
        if self.values_per_row is None:
            return [(self.start, self.end)]
        return [(self.start, self.first_page), (self.locations[self.page][0], self.end)]

    def whole(self) -> Cut:
        """The column chunk uncut."""
        return Cut((self.start, self.first_page - self.start), (self.first_page, self.end - self.first_page), 0, self.num_values)


def page_locations(source: Any, offset: int, length: int, group_rows: int) -> tuple[tuple[int, int, int], ...]:
    """(offset, size, first row) of each page, from the offset index at [offset, offset + length)
    of ``source``; ThriftError when its first rows are not in order within the row group."""
    index = decode_struct(read_exact(source, offset, length))[0]
    locations = tuple((location.integer(1), location.integer(2), location.integer(3)) for location in index.structs(1))
    firsts = [first for _, _, first in locations]
    if not locations or firsts[0] != 0 or firsts != sorted(firsts) or firsts[-1] > group_rows:
        raise ThriftError("page index rows out of order")
    return locations


def check_cut(source: Any, plan: CutPlan, group_rows: int) -> Cut:
    """The cut of ``plan``, checked against the page headers of one side of the cut: the rows
    they count (a flat column's values, a V2 page's rows) must be the rows the index gives that
    side. The V1 pages of a list column (other than a fixed-size list without nulls) count
    values, not rows, so such a column is left whole. Counts the kept pages' level values (the
    cut chunk's num_values) and whether they need the dictionary page."""
    locations, page = plan.locations, plan.page
    counted = locations[page:] if plan.count_kept else locations[:page]
    kept_first = locations[page][2]
    headers = [data_page(source, offset, size) for offset, size, _ in counted]
    side_rows = group_rows - kept_first if plan.count_kept else kept_first
    per_row = plan.values_per_row
    rows = [header.rows if header.rows is not None else header.values // per_row if per_row else None for header in headers]
    if None in rows:  # V1 pages of a list column count values, not rows: the cut cannot be checked
        return plan.whole()
    held = sum(count for count in rows if count is not None)
    if held != side_rows:
        raise ThriftError(f"the pages hold {held} rows where the page index says {side_rows}")
    values = sum(header.values for header in headers)
    num_values = values if plan.count_kept else plan.num_values - values
    # Writers fall back from dictionary to plain encoding once per column chunk, never back: the
    # kept pages need the dictionary page when their first one does.
    first_kept = headers[0] if plan.count_kept else data_page(source, locations[page][0], locations[page][1])
    kept = locations[page][0]
    dictionary = (plan.start, plan.first_page - plan.start if first_kept.dictionary else 0)
    return Cut(dictionary, (kept, plan.end - kept), kept_first, num_values)


def data_page(source: Any, offset: int, size: int) -> Page:
    """The header of the page at ``offset`` (the first bytes of the page; statistics in it may
    make it long); a page that is not a data page has no values. ThriftError when the header and
    its page are not ``size`` bytes, as the page index gives."""
    prefix = min(size, HEADER_READ)
    while True:
        try:
            return parse_page(read_exact(source, offset, prefix), offset, size)
        except ThriftError:
            if prefix == size:
                raise
            prefix = min(size, prefix * 16)


def parse_page(data: bytes | memoryview, offset: int, size: int) -> Page:
    """``data_page`` from the page's first bytes (``data``: the header at least)."""
    header, length = decode_struct(data)
    if length + header.integer(PAGE_COMPRESSED_SIZE) != size:
        raise ThriftError(f"the page at offset {offset} is not the {size} bytes its page index gives")
    kind = header.integer(PAGE_TYPE)
    if kind == DATA_PAGE:
        data_header = header.struct(PAGE_DATA_V1)
        return Page(data_header.integer(1), None, data_header.integer(2) in DICTIONARY_ENCODINGS)
    if kind == DATA_PAGE_V2:
        data_header = header.struct(PAGE_DATA_V2)
        return Page(data_header.integer(1), data_header.integer(3), data_header.integer(4) in DICTIONARY_ENCODINGS)
    return Page(0, 0, False)
