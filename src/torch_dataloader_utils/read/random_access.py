"""Random access: any rows of the whole dataset by global row number, in the loader's batch form.

Only the units (row groups / stripes) holding requested rows are read, with the dataset's
column projection. A run of rows that is short next to its unit (a slice, one row) is decoded
from only the pages that hold it where the file has a page index (Parquet,
``formats/_parquet_range.py``), else from the page holding its first row (the resume path's
seek, ``formats/_parquet_seek.py``) or the unit's first row, up to the run's end; other reads,
and a unit's second read that the cache cannot serve, decode the whole unit. Decoded rows stay
in a bounded cache (``unit_cache.py``), so neighbouring accesses read nothing again."""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import numpy as np
import pyarrow as pa
from torch.utils.data import get_worker_info

from ..catalog.build import Catalog
from ..errors import DataReadError, FileChangedError, RemoteReadError, WideningError
from ..lru import Lru
from ..plan.columns import flat_unit_rows
from ..plan.row_index import RowIndex, normalize_rows, unit_groups
from ..storage.paths import check_unchanged
from .conform import iter_conformed, project, read_conformed, read_rows_conformed
from .convert import slice_columns, table_to_columns
from .nested import BatchColumn, flatten
from .nulls import DEFAULT_POLICY, ColumnPolicy
from .output_formats import table_in_format
from .row_keys import parse_key, row_of
from .unit_cache import DEFAULT_ROW_CACHE_BYTES, CachedRows, UnitCache

#: A run of requested rows at most this fraction of its unit is decoded alone (from the pages that
#: hold it), not with the whole unit.
PARTIAL_FRACTION = 0.25
#: Rows decoded at least by a partial read, so that the rows after a single row read are cached too.
PARTIAL_MIN_ROWS = 1024
_OPEN_FILES = 16

__all__ = ["DEFAULT_ROW_CACHE_BYTES", "RowAccess"]


class RowAccess:
    """Rows of a catalog's files by global row number (file order, then stored order).

    Picklable: a copy (a DataLoader worker's) opens its files and fills its own cache on first
    use. Calls from several threads take turns.
    """

    def __init__(
        self,
        catalog: Catalog | Callable[[], Catalog],
        columns: list[str] | None,
        cache_bytes: int = DEFAULT_ROW_CACHE_BYTES,
        selected: list[BatchColumn] | None = None,
        policy: ColumnPolicy = DEFAULT_POLICY,
        output_format: str = "torch",
    ):
        self._catalog = catalog
        self.output_format = output_format  # what a batch is (output_formats.OUTPUT_FORMATS)
        self.columns = columns  # as read: top-level columns when ``selected`` takes structs and maps apart
        self.selected = selected
        self.policy = policy
        self.cache_bytes = cache_bytes
        self.cache = UnitCache(cache_bytes)
        self._readers: Lru[int, Any] = Lru(_OPEN_FILES)
        self._lock = threading.Lock()

    @functools.cached_property
    def catalog(self) -> Catalog:
        """The files rows are numbered in; made on first use where given as a function (a table
        dataset's snapshot without its filters, whose footers only random access needs)."""
        return self._catalog if isinstance(self._catalog, Catalog) else self._catalog()

    @functools.cached_property
    def index(self) -> RowIndex:
        """Every unit's first global row, made on first use (a worker that reads no row by
        number neither receives nor builds it)."""
        return RowIndex.from_flat(*flat_unit_rows(self.catalog.layouts))

    @property
    def num_rows(self) -> int:
        """Rows in all files."""
        return self.index.num_rows

    def __getitem__(self, key: Any) -> Any:
        """One row (an int key: column -> item of the batch's column) or a batch in
        ``output_format`` (any other key form; see ``row_keys.parse_key``)."""
        rows = parse_key(key, self.num_rows)
        if isinstance(rows, int):
            return row_of(self.batch(np.array([rows], dtype=np.int64)), 0)
        return self.batch(rows)

    def locate(self, index: int) -> tuple[str, int]:
        """(file URL, row within that file) of global row ``index`` (negative: from the end); the
        row is numbered as the file stores its rows, rows a table deleted included."""
        row = parse_key(index, self.num_rows)
        if not isinstance(row, int):
            raise TypeError(f"locate takes one row index (an int), got {type(index).__name__}")
        located = self.index.locate(np.array([row], dtype=np.int64))
        file, row_in_file = int(located.file[0]), int(located.row_in_file[0])
        stored_row = getattr(self.catalog.format_of(file), "stored_row", None)  # a table's file: rows it deleted count too
        if stored_row is not None:
            row_in_file = stored_row(self.catalog.footers[file], row_in_file)
        return self.catalog.files[file].url, row_in_file

    def batch(self, rows: np.ndarray) -> Any:
        """Rows (global, in [0, num_rows) or negative from the end) as a batch in the loader's form
        for ``output_format``, in the order given."""
        rows = normalize_rows(rows, self.num_rows)
        table = self.table(rows)
        if self.selected is not None:
            table = flatten(table, self.selected)
        if self.output_format != "torch":
            return table_in_format(table, self.output_format, self.policy)
        where = lambda: self._describe(rows)  # noqa: E731 - asked only for an error message
        return slice_columns(table_to_columns(table, where, policy=self.policy), 0, table.num_rows, where)

    def replanned(self, catalog: Catalog | Callable[[], Catalog], columns: list[str] | None, selected: list[BatchColumn] | None) -> RowAccess:
        """The same access over another catalog (a table dataset's other snapshot, with its columns)."""
        return RowAccess(catalog, columns, self.cache_bytes, selected, self.policy, self.output_format)

    def table(self, rows: np.ndarray) -> pa.Table:
        """Rows (global, in range) as one Arrow table conformed to the dataset's schema, in order."""
        with self._lock:
            return self._gather(rows)

    # ------------------------------------------------------------ internals
    def _gather(self, rows: np.ndarray) -> pa.Table:
        located = self.index.locate(rows)
        groups = unit_groups(located)
        if not groups:
            return self._empty()
        # units already cached first: the reads that follow then evict what this call no longer needs
        groups.sort(key=lambda group: (group[0], group[1]) not in self.cache)
        parts, order = [], []
        for file, unit, positions in groups:
            local = located.row_in_unit[positions]
            cached = self._unit_rows(file, unit, int(local.min()), int(local.max()))
            parts.append(_pick(cached.table, local - cached.first))
            order.append(positions)
        table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        positions = np.concatenate(order)
        if np.array_equal(positions, np.arange(len(positions))):
            return table
        inverse = np.empty(len(positions), dtype=np.int64)
        inverse[positions] = np.arange(len(positions))
        return table.take(inverse)

    def _unit_rows(self, file: int, unit: int, lo: int, hi: int) -> CachedRows:
        """Decoded rows of a unit covering rows lo..hi (inclusive), from the cache or read."""
        key = (file, unit)
        cached = self.cache.get(key, lo, hi)
        if cached is not None:
            return cached
        try:
            reader = self._open(file)
            unit_rows = self.catalog.layouts[file].unit_rows[unit]
            # a second miss in a unit (a walk through it, or scattered reads) decodes the whole unit
            short = hi - lo + 1 <= unit_rows * PARTIAL_FRACTION and key not in self.cache
            partial = short and getattr(self.catalog.format_of(file), "streams_units", False)
            if partial:
                cached = self._read_part(reader, file, unit, lo, hi)
            else:
                cached = CachedRows(0, read_conformed(reader, unit, self.columns, self.catalog, file))
        except Exception as error:  # noqa: BLE001 - re-raised naming the file and unit
            self._readers.pop(file)
            raise self._read_error(file, unit, error) from error
        self.cache.put(key, cached)
        return cached

    def _read_part(self, reader: Any, file: int, unit: int, lo: int, hi: int) -> CachedRows:
        """Rows lo..hi of a unit and at least ``PARTIAL_MIN_ROWS`` (or to the unit's end): only the
        pages that hold them where the reader can (``read_rows``: Parquet with a page index), with
        the rows before lo that every column decoded; else from the page holding lo (``_read_run``)."""
        stop = min(max(hi + 1, lo + PARTIAL_MIN_ROWS), self.catalog.layouts[file].unit_rows[unit])
        if hasattr(reader, "read_rows"):
            read = read_rows_conformed(reader, unit, self.columns, self.catalog, file, lo, stop)
            if read is not None:
                return CachedRows(*read)
        return CachedRows(lo, self._read_run(reader, file, unit, lo, hi))

    def _read_run(self, reader: Any, file: int, unit: int, lo: int, hi: int) -> pa.Table:
        """Rows lo.. of a unit: through hi, and at least ``PARTIAL_MIN_ROWS`` (or to the unit's
        end), with the rest of the last batch decoded."""
        want = hi - lo + 1
        target = min(max(want, PARTIAL_MIN_ROWS), self.catalog.layouts[file].unit_rows[unit] - lo)
        tables, got = [], 0
        batches = iter_conformed(reader, unit, self.columns, self.catalog, file, target, lo)
        try:
            for table in batches:
                tables.append(table)
                got += table.num_rows
                if got >= target:
                    break
        finally:
            getattr(batches, "close", lambda: None)()  # a generator: a remote reader forgets the bytes it fetched
        if got < target:
            raise FileChangedError(f"unit {unit} ended after {lo + got} rows; the file changed after planning")
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    def _open(self, file: int) -> Any:
        """A reader of ``file``, its file checked against the planned version at every read (a
        reader is kept open between calls)."""
        catalog = self.catalog
        entry, fs = catalog.files[file], catalog.fs_of(file)
        check_unchanged(fs, entry)
        return self._readers.get(file, lambda: catalog.format_of(file).open(fs, entry.fs_path, catalog.footer(file), get_worker_info() is None))

    def _read_error(self, file: int, unit: int, error: Exception) -> Exception:
        url = self.catalog.files[file].url
        if isinstance(error, WideningError):
            return WideningError(f"{url}: {error}")
        detail = " ".join(str(error).split()).rstrip(".")
        message = f"cannot read {url} (unit {unit}) for random access: {detail}"
        if not isinstance(error, (RemoteReadError, FileChangedError)):
            message += ". If the file is damaged, replace or remove it"
        return DataReadError(message)

    def _empty(self) -> pa.Table:
        schema = self.catalog.schema
        if schema is None:
            return pa.table({})
        return project(schema, self.columns).empty_table()

    def _describe(self, rows: np.ndarray) -> str:
        files = sorted({int(f) for f in self.index.locate(rows).file}) if len(rows) else []
        urls = [self.catalog.files[f].url for f in files]
        shown = ", ".join(urls[:3]) + (f" and {len(urls) - 3} more" if len(urls) > 3 else "")
        return f"rows {_span(rows)} read from {shown}"

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("index", None)
        state["_readers"] = Lru(_OPEN_FILES)
        state["cache"] = UnitCache(self.cache.limit_bytes)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def _pick(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """``table.take(rows)``, as a zero-copy slice when the rows are consecutive and ascending."""
    first = int(rows[0])
    if int(rows[-1]) - first + 1 == len(rows) and (len(rows) == 1 or bool((np.diff(rows) == 1).all())):
        return table.slice(first, len(rows))
    return table.take(rows)


def _span(rows: np.ndarray) -> str:
    if not len(rows):
        return "(none)"
    return f"{int(rows[0])}" if len(rows) == 1 else f"{int(rows.min())}..{int(rows.max())}"
