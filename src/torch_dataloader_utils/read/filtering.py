"""Row filters: the exact count of matching rows per unit at planning, and reading only those rows.

With a filter the plan is made in *matching rows*: every unit's row count is the number of its
rows that match, so splits, lanes, equal batches per rank and a state's positions all count
matching rows, exactly as they count rows without a filter. The counts come from one pass at
planning that reads only the filter's columns of the units whose statistics neither rule out nor
wholly match the filter (catalog/filter_prune.py: Parquet row groups and ORC stripes), in parallel threads; they are kept for the process and, with
``cache_dir``, on disk by file version and filter. A reader then decodes a unit with the
filter's columns, keeps the matching rows and slices them by their index among the matching
rows; a resume inside a unit decodes it from its start and skips that many matching rows.

Where a Parquet row group has a page index, the filter's columns' page bounds narrow both the
count and the reads to the row ranges whose pages may match (read/page_ranges.py): the pages
between them are not decoded (a range that starts inside the row group is read from the pages
holding its first row, as a resume seeks), and a range where every row matches is counted by its
length and skipped by it on resume.

The count and the reader apply the filter to the same conformed columns (conform.py), so they
agree row for row; a unit whose count differs when read raises FileChangedError.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Iterator, Sequence

import pyarrow as pa

from ..catalog.build import Catalog, replanned
from ..catalog.filter_prune import ALL, NONE, SOME, RowFilter, may_match, orc_statistics, row_filter
from ..catalog.partitions import directory_guarantee
from ..catalog.progress_bar import progress
from ..catalog.schema import check_repeated_columns
from ..catalog.sources import options_identity
from ..errors import DataReadError, FileChangedError, RemoteReadError
from ..formats._parquet_tail import metadata
from ..plan.splits import FileLayout
from ..storage.remote import IOOptions
from .conform import UnitRows, iter_conformed, read_conformed
from .filter_eval import matching_count, matching_rows
from .page_ranges import Range, candidate_ranges, range_rows

log = logging.getLogger(__name__)
_COUNT_THREADS = 8
_COUNTS_DIR = "filter_counts"  # under cache_dir (the range cache sweeps only its own top-level entries)
#: the version of how values are read, in the counts' key: counts kept by a version that read a
#: column otherwise are not taken (2: dates of the hybrid calendar converted, formats/_legacy_calendar.py)
_COUNT_RULES = 2
_MEMO: dict[str, tuple[int, ...]] = {}  # count key -> matching rows per unit, for this process


def filter_catalog(catalog: Catalog, filters: Any, io: IOOptions | None = None, skip_errors: bool = False) -> Catalog:
    """``catalog`` planned over the rows ``filters`` matches: pruned by statistics, then counted
    (``skip_errors``: on_error="skip", see ``count_matching``)."""
    rows_filter = row_filter(filters, catalog.schema)
    assert catalog.schema is not None  # row_filter refuses a catalog without columns
    check_repeated_columns(catalog.schema, list(rows_filter.columns), catalog.repeated_columns)
    layouts = catalog.layouts
    orc = orc_statistics(catalog.fs, catalog.files) if catalog.format.name == "orc" else None
    footers = [_statistics_footer(catalog.footer(index)) for index in range(len(catalog.files))]
    partitions = getattr(catalog.format, "partitions", None)  # (a PartitionedFormat: hive directories)
    directories = [directory_guarantee(partitions, entry.url) for entry in catalog.files] if partitions is not None else None
    unit_rows = [layout.unit_rows for layout in layouts]
    matching = may_match(rows_filter, footers, unit_rows, catalog.schema, catalog.missing_columns, orc, directories)
    source = replace(catalog, row_filter=rows_filter, source_layouts=layouts)
    counts = count_matching(source, matching, io.cache_dir if io is not None else None, skip_errors)
    filtered = [
        FileLayout(layout.path, layout.size, tuple(rows), tuple(size if n else 0 for size, n in zip(layout.unit_bytes, rows)))
        for layout, rows in zip(layouts, counts)
    ]
    known = [sum(state == value for units in matching for state in units) for value in (NONE, ALL)]
    units, rows = sum(map(len, matching)), sum(map(sum, counts))
    log.debug("filters=%s: of %d units, statistics rule out %d and show %d match whole; %d rows match", rows_filter.text, units, *known, rows)
    return replanned(source, filtered)


def _statistics_footer(footer: Any) -> Any:
    """The footer whose statistics prune: a partitioned file's is the first of (footer, values), a
    remote Parquet file's is kept as its bytes."""
    return metadata(footer[0] if isinstance(footer, tuple) else footer)


# ------------------------------------------------------------------ counting at planning
def count_matching(catalog: Catalog, matching: Sequence[Sequence[int]], cache_dir: str | None = None, skip_errors: bool = False) -> list[tuple[int, ...]]:
    """Per file, per unit: the rows ``catalog.row_filter`` matches; read only where ``matching``
    (filter_prune.may_match) says SOME. ``skip_errors`` (on_error="skip"): a unit that cannot be
    counted is planned with all its rows, uncached; its reads then fail or miscount, and the
    readers leave it out and report it as any unreadable split (a warning names it here too)."""
    keys = [_count_key(catalog, file) for file in range(len(catalog.files))]
    results: list[tuple[int, ...] | None] = [_MEMO.get(key) or _load(cache_dir, key, len(units)) for key, units in zip(keys, matching)]
    todo = [file for file, found in enumerate(results) if found is None]
    uncounted = set()

    def count(file: int) -> tuple[tuple[int, ...], bool]:
        return _count_file(catalog, file, matching[file], skip_errors)

    if todo:
        with ThreadPoolExecutor(max_workers=min(_COUNT_THREADS, len(todo))) as pool:
            for file, (counted, complete) in zip(todo, progress(pool.map(count, todo), len(todo), "counting rows that match filters")):
                results[file] = counted
                if complete:
                    _store(cache_dir, keys[file], counted)
                else:
                    uncounted.add(file)
    done = [counts for counts in results if counts is not None]
    assert len(done) == len(results), "every file was counted"
    _MEMO.update((key, counts) for file, (key, counts) in enumerate(zip(keys, done)) if file not in uncounted)
    return done


def _count_file(catalog: Catalog, file: int, units: Sequence[int], skip_errors: bool = False) -> tuple[tuple[int, ...], bool]:
    """Matching rows per unit of one file, and whether every unit was counted; ``units``: what
    statistics say of each (filter_prune)."""
    rows = catalog.source_layouts[file].unit_rows if catalog.source_layouts is not None else catalog.layouts[file].unit_rows
    counts = [rows[unit] if known == ALL else 0 for unit, known in enumerate(units)]
    if SOME not in units:
        return tuple(counts), True
    entry = catalog.files[file]
    source = _Source(catalog)
    reader: Any = None
    complete = True
    for unit, known in enumerate(units):
        if known != SOME:
            continue
        try:
            if reader is None:
                reader = catalog.format.open(catalog.fs, entry.fs_path, catalog.footer(file), False)
            counts[unit] = _count_unit(reader, unit, catalog, file, source)
        except Exception as error:  # noqa: BLE001 - re-raised naming the file
            failure = _count_error(catalog, file, unit, error)
            if not skip_errors:
                raise failure from error
            log.warning("on_error='skip': %s; planned with its %d rows, which the readers leave out when they cannot read them", failure, rows[unit])
            counts[unit], complete = rows[unit], False
    return tuple(counts), complete


def _count_error(catalog: Catalog, file: int, unit: int, error: Exception) -> Exception:
    if isinstance(error, (RemoteReadError, DataReadError)):
        return error
    detail = " ".join(str(error).split()).rstrip(".")
    return DataReadError(f"cannot count the rows of {catalog.files[file].url} (unit {unit}) that match filters={catalog.row_filter.text}: {detail}")


def _count_unit(reader: Any, unit: int, catalog: Catalog, file: int, source: _Source) -> int:
    """The unit's matching rows: of its pages the page index leaves (read/page_ranges.py) where
    there is one, else of the whole unit, reading only the filter's columns."""
    rows_filter: RowFilter = catalog.row_filter
    columns = list(rows_filter.columns)
    ranges = candidate_ranges(reader, unit, catalog, file, columns)
    if ranges is None:
        return matching_count(rows_filter, read_conformed(reader, unit, columns, source, file))
    count = range_rows(tuple(r for r in ranges if r[2] == ALL))
    some = [(start, stop) for start, stop, state in ranges if state == SOME]
    if some:
        rows = UnitRows(reader, unit, columns, source, file, max(stop - start for start, stop in some))
        for start, stop in some:
            for table in rows.take(start, stop):
                count += matching_count(rows_filter, table)
    return count


def _count_key(catalog: Catalog, file: int) -> str:
    """The count's identity: the file's version, the filter, what the filter's columns are read as,
    and the reader's options (a text format's null and boolean spellings change what matches)."""
    entry, rows_filter = catalog.files[file], catalog.row_filter
    schema = catalog.schema
    types = [str(schema.field(name).type) if schema is not None else "" for name in rows_filter.columns]
    lacking = sorted(set(catalog.missing_columns[file] if catalog.missing_columns else ()) & set(rows_filter.columns))
    reader = getattr(catalog.format_of(file), "options", None)
    options = options_identity(reader) if reader else None
    identity = [_COUNT_RULES, entry.url, entry.size, entry.tag, rows_filter.digest, rows_filter.identity, types, lacking]
    text = json.dumps([*identity, *([options] if options else [])])
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _load(cache_dir: str | None, key: str, units: int) -> tuple[int, ...] | None:
    if cache_dir is None:
        return None
    try:
        with open(os.path.join(cache_dir, _COUNTS_DIR, key + ".json")) as handle:
            counts = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(counts, list) or len(counts) != units or not all(isinstance(c, int) and c >= 0 for c in counts):
        return None  # damaged: count again
    return tuple(counts)


def _store(cache_dir: str | None, key: str, counts: tuple[int, ...]) -> None:
    """Written to a temporary file and renamed into place, so that a reader sees all or nothing;
    a cache that cannot be written only costs counting again."""
    if cache_dir is None:
        return
    folder = os.path.join(cache_dir, _COUNTS_DIR)
    temporary = os.path.join(folder, f"{key}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(temporary, "w") as handle:
            json.dump(list(counts), handle)
        os.replace(temporary, os.path.join(folder, key + ".json"))
    except OSError as error:
        log.debug("cannot cache filter counts in %s: %s", folder, error)


# ------------------------------------------------------------------ reading
class _Source:
    """The catalog as conform.py sees it for reading whole units: the files' own row counts."""

    def __init__(self, catalog: Catalog):
        self.schema = catalog.schema
        self.missing_columns = catalog.missing_columns
        self.layouts = catalog.source_layouts


def _with_filter_columns(columns: Sequence[str] | None, rows_filter: RowFilter) -> list[str] | None:
    if columns is None:
        return None  # every column, the filter's among them
    return [*columns, *(name for name in rows_filter.columns if name not in columns)]


def _projected(table: pa.Table, columns: Sequence[str] | None) -> pa.Table:
    return table if columns is None or table.column_names == list(columns) else table.select(list(columns))


def _changed(unit: int, seen: int, planned: int) -> FileChangedError:
    return FileChangedError(
        f"unit {unit} has {seen} rows that match the filter but had {planned} when planned: the file changed after planning, "
        "or its statistics are wrong (planning trusts them to rule a unit out or in whole)"
    )


def read_filtered(reader: Any, unit: int, columns: Sequence[str] | None, catalog: Catalog, file: int) -> pa.Table:
    """The unit's rows that match ``catalog.row_filter``, projected to ``columns`` and conformed."""
    rows_filter: RowFilter = catalog.row_filter
    ranges = _pruning(reader, unit, catalog, file, _with_filter_columns(columns, rows_filter))
    if ranges is not None:
        tables = list(iter_filtered(reader, unit, columns, catalog, file, max(1, range_rows(ranges))))
        return pa.concat_tables(tables) if len(tables) != 1 else tables[0]
    table = read_conformed(reader, unit, _with_filter_columns(columns, rows_filter), _Source(catalog), file)
    kept = matching_rows(rows_filter, table)
    planned = catalog.layouts[file].unit_rows[unit]
    if kept.num_rows != planned:
        raise _changed(unit, kept.num_rows, planned)
    return _projected(kept, columns)


def iter_filtered(
    reader: Any, unit: int, columns: Sequence[str] | None, catalog: Catalog, file: int, batch_rows: int, first_row: int = 0
) -> Iterator[pa.Table]:
    """``read_filtered``'s rows from matching row ``first_row`` on, decoded batch by batch (from the
    unit's start, or its first candidate range's: a matching row's place in the file is known
    only by counting)."""
    rows_filter: RowFilter = catalog.row_filter
    wanted = _with_filter_columns(columns, rows_filter)
    ranges = _pruning(reader, unit, catalog, file, wanted)
    source = _Source(catalog)
    skip, seen = first_row, 0
    rows = None if ranges is None else UnitRows(reader, unit, wanted, source, file, batch_rows)
    for start, stop, state in ranges if ranges is not None else [(0, 0, SOME)]:
        if state == ALL:  # every row matches: the matching rows to skip are rows, skipped undecoded
            jump = min(skip, stop - start)
            start, skip, seen = start + jump, skip - jump, seen + jump
            if start == stop:
                continue
        batches = iter_conformed(reader, unit, wanted, source, file, batch_rows) if rows is None else rows.take(start, stop)
        for table in batches:
            kept = matching_rows(rows_filter, table)
            seen += kept.num_rows
            if skip >= kept.num_rows:
                skip -= kept.num_rows
                continue
            if skip:
                kept, skip = kept.slice(skip), 0
            yield _projected(kept, columns)
    planned = catalog.layouts[file].unit_rows[unit]
    if seen != planned:
        raise _changed(unit, seen, planned)


def _pruning(reader: Any, unit: int, catalog: Catalog, file: int, columns: list[str] | None) -> tuple[Range, ...] | None:
    """The unit's candidate row ranges when its page index leaves some rows unread, else None."""
    ranges = candidate_ranges(reader, unit, catalog, file, columns)
    if ranges is None:
        return None
    unit_rows = (catalog.source_layouts or catalog.layouts)[file].unit_rows[unit]
    return ranges if 0 < range_rows(ranges) < unit_rows else None
