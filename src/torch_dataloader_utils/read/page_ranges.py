"""The row ranges of a Parquet row group that a row filter may match, from the page index of
the filter's columns: pages whose min / max (or only nulls) rule the filter out are never decoded,
by the count at planning nor by the readers.

Each filter column's pages cut the row group at their first rows; between two cuts every column
is within one page, whose bounds make a guarantee for those rows as a row group's statistics do
for the whole group (catalog/filter_prune.py), and the same simplification says NONE, SOME or ALL.
The ranges depend only on the file's version, the unit and the filter, so every process computes
the same ones (kept per process); a file without a page index reads whole units as before.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    from ..formats._lazy import compute as pc  # imported when first used

from ..catalog.filter_prune import ALL, NONE, SOME, RowFilter, classify, column_term
from ..formats._parquet_page_index import PageBounds
from ..lru import Lru

log = logging.getLogger(__name__)
Range = tuple[int, int, int]  # rows [start, stop) of a unit, and SOME or ALL
_MEMO: Lru[tuple, tuple[Range, ...] | None] = Lru(1024)


def candidate_ranges(reader: Any, unit: int, catalog: Any, file: int, read: list[str] | None) -> tuple[Range, ...] | None:
    """The row ranges of ``unit`` where ``catalog.row_filter`` may match (SOME) or matches every row
    (ALL), in row order; None when the page index rules nothing in or out (or there is none, the
    reader cannot read one, or reading it would cost more than decoding the ``read`` columns
    could save): the unit is then read whole."""
    pages_of = getattr(reader, "column_pages", None)
    rows_filter: RowFilter = catalog.row_filter
    if pages_of is None or catalog.schema is None:
        return None
    entry = catalog.files[file]
    key = (entry.url, entry.size, entry.tag, unit, rows_filter.digest, rows_filter.identity)
    if key in _MEMO:  # (None too: the page index rules nothing in or out)
        return _MEMO.find(key)
    layouts = catalog.source_layouts if catalog.source_layouts is not None else catalog.layouts
    rows = layouts[file].unit_rows[unit]
    lacking = set(catalog.missing_columns[file] if catalog.missing_columns else ()) & set(rows_filter.columns)
    try:
        pages = pages_of(unit, [name for name in rows_filter.columns if name not in lacking], read)
    except (ValueError, OSError, pa.ArrowException) as error:  # (ThriftError is a ValueError) no pruning, still exact
        log.debug("no page index pruning in %s unit %d: %s", entry.url, unit, error)
        pages = {}
    if not pages:
        return None  # (not kept: whether the index is worth reading depends on ``read``)
    ranges = _ranges(pages, sorted(lacking), rows, rows_filter, catalog.schema)
    _MEMO.put(key, ranges)
    return ranges


def _ranges(
    pages: dict[str, tuple[pa.DataType, list[Any]]], lacking: list[str], rows: int, rows_filter: RowFilter, unified: pa.Schema
) -> tuple[Range, ...] | None:
    cuts = sorted({0, rows, *(page.first_row for _, column in pages.values() for page in column if page.first_row < rows)})
    starts = {name: [page.first_row for page in column] for name, (_, column) in pages.items()}
    if rows_filter.dnf is not None:
        states = _dnf_states(rows_filter.dnf, cuts, pages, starts, lacking, rows)
    else:
        states = _classified(cuts, pages, starts, lacking, rows_filter, unified)
    ranges: list[Range] = []
    for start, stop, state in zip(cuts, cuts[1:], states):
        if state == NONE:
            continue
        if ranges and ranges[-1][2] == state and ranges[-1][1] == start:
            ranges[-1] = (ranges[-1][0], stop, state)
        else:
            ranges.append((start, stop, state))
    return None if ranges == [(0, rows, SOME)] else tuple(ranges)


def _classified(cuts: list[int], pages: dict, starts: dict, lacking: list[str], rows_filter: RowFilter, unified: pa.Schema) -> list[int]:
    """Each segment's state by pyarrow's simplification of the filter under its pages' bounds."""
    guarantees = []
    for start in cuts[:-1]:
        guarantee = pc.scalar(True)
        for name in lacking:
            guarantee = guarantee & pc.field(name).is_null()
        for name, (kind, column) in pages.items():
            page = column[bisect.bisect_right(starts[name], start) - 1]  # (of pages starting at one row, the last: the others are empty)
            nulls = page.rows if page.only_nulls else page.nulls
            term = column_term(name, page.bounds, kind, unified.field(name).type, nulls, page.rows)
            if term is not None:
                guarantee = guarantee & term
        guarantees.append(guarantee)
    return classify(rows_filter, guarantees, unified)


def _dnf_states(dnf: tuple, cuts: list[int], pages: dict, starts: dict, lacking: list[str], rows: int) -> list[int]:
    """Each segment's state for a filter in the DNF list form, from its pages' bounds in plain
    Python (the simplification above costs about 50 us a segment; a row group may have
    thousands): each condition may hold for some row, or holds for every row, of the segment."""
    all_null = PageBounds(0, rows, True, rows, None)
    states = []
    for start in cuts[:-1]:
        at = {name: column[bisect.bisect_right(starts[name], start) - 1] for name, (_, column) in pages.items()}
        at.update((name, all_null) for name in lacking)
        may_any = every_any = False
        for conjunction in dnf:
            may_all = every_all = True
            for column, op, value in conjunction:
                may, every = _condition(op, value, at.get(column))
                may_all, every_all = may_all and may, every_all and every
            may_any, every_any = may_any or may_all, every_any or every_all
        states.append(ALL if every_any else SOME if may_any else NONE)
    return states


def _condition(op: str, value: Any, page: PageBounds | None) -> tuple[bool, bool]:
    """Whether ``column op value`` (as pyarrow.parquet.filters_to_expression builds it) may hold
    for some row of ``page``, and whether it holds for every row. A null makes a comparison and
    ``in`` null or false (the row is left out) and ``not in`` true (~is_in)."""
    if page is None:
        return True, False  # no page index for this column
    nulls = page.rows if page.only_nulls else page.nulls
    if nulls == page.rows:
        return (True, True) if op == "not in" else (False, False)
    if page.bounds is None or (op in ("in", "not in") and (not isinstance(value, (list, tuple, set)) or None in value)):
        return True, False
    low, high = page.bounds
    some_null = nulls is None or nulls > 0
    try:
        if op in ("in", "not in"):
            inside = any(low <= item <= high for item in value)
            single = low == high and low in value
            if op == "in":
                return inside, single and not some_null
            return some_null or not single, not inside
        may, every = {
            "=": (low <= value <= high, low == high == value),
            "==": (low <= value <= high, low == high == value),
            "!=": (not low == high == value, value < low or value > high),
            "<": (low < value, high < value),
            "<=": (low <= value, high <= value),
            ">": (high > value, low > value),
            ">=": (high >= value, low >= value),
        }[op]
    except (TypeError, KeyError):  # a value these bounds do not compare with: nothing known
        return True, False
    return bool(may), bool(every) and not some_null


def range_rows(ranges: tuple[Range, ...]) -> int:
    """The rows the ranges hold."""
    return sum(stop - start for start, stop, _ in ranges)


__all__ = ["ALL", "SOME", "Range", "candidate_ranges", "range_rows"]
