"""Per-file and per-split records kept in columns (NumPy arrays, one bytes blob for strings)
instead of one Python object per file: 100,000 files cost a few MB, not 50, and pickle as a
few buffers. Each table is a read-only Sequence that makes the record (FileLayout, Split,
SplitRows) on access, so code written for lists reads them unchanged. Pure: no I/O.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

import numpy as np

from .splits import MAX_FILE_ROWS, FileLayout, Split, plan_splits
from .streams import SplitRows

T = TypeVar("T")
_ENCODING = ("utf-8", "surrogatepass")  # a name that is not valid UTF-8 keeps its surrogates


class Column(Sequence[T], Generic[T]):
    """A read-only sequence whose items are made on access; slices give lists."""

    __slots__ = ()

    def _item(self, index: int) -> T:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> list[T]: ...
    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(len(self)))]
        i = index.__index__()
        if i < 0 or i >= len(self):
            if not -len(self) <= i < 0:
                raise IndexError(f"index {index} out of range for {len(self)} items")
            i += len(self)
        return self._item(i)

    def __iter__(self) -> Iterator[T]:
        return (self._item(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # equal to lists, so unhashable like them

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} items)"


class Strings(Column[str]):
    """Strings (or None) as one UTF-8 blob and the offset where each ends."""

    __slots__ = ("_blob", "_ends", "_none")

    def __init__(self, items: Iterable[str | None]):
        parts: list[bytes] = []
        none: list[int] = []
        for i, item in enumerate(items):
            if item is None:
                none.append(i)
            parts.append(b"" if item is None else item.encode(*_ENCODING))
        self._blob = b"".join(parts)
        self._ends = array("q", np.cumsum(np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))).tobytes())
        self._none = frozenset(none)

    def __len__(self) -> int:
        return len(self._ends)

    def _item(self, index: int) -> str | None:  # type: ignore[override]
        if index in self._none:
            return None
        start = self._ends[index - 1] if index else 0
        return self._blob[start : self._ends[index]].decode(*_ENCODING)

    def __iter__(self) -> Iterator[str]:
        text = self._blob.decode(*_ENCODING)
        if self._none or len(text) != len(self._blob):  # offsets count bytes: only ASCII slices the text by them
            yield from super().__iter__()
            return
        start = 0
        for end in self._ends:
            yield text[start:end]
            start = end

    def same(self, other: Strings) -> bool:
        """Whether both hold the same strings (to share one copy)."""
        return self._none == other._none and self._blob == other._blob and self._ends == other._ends


class LayoutTable(Column[FileLayout]):
    """Files' layouts: path, size and an index into the distinct (unit rows, unit bytes) lists,
    which files written alike share; ``rows`` (each file's row count) and ``offsets`` (each
    file's unit offsets, read-only) for the planner. The distinct unit lists are kept in flat
    arrays too, not tuples: a tuple kept from a file read in the middle of planning would pin
    the memory of the objects around it that planning frees."""

    __slots__ = ("paths", "sizes", "rows", "_kind", "_units", "_unit_rows", "_unit_bytes", "_offsets")

    def __init__(self, layouts: Iterable[FileLayout], paths: Strings | None = None):
        kinds: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
        names: list[str] = []
        sizes: list[int] = []
        kind: list[int] = []
        for layout in layouts:
            names.append(layout.path)
            sizes.append(layout.size)
            kind.append(kinds.setdefault((layout.unit_rows, layout.unit_bytes), len(kinds)))
        own = Strings(names)
        del names
        self.paths = paths if paths is not None and paths.same(own) else own
        self.sizes = np.array(sizes, dtype=np.int64)
        self._kind = np.array(kind, dtype=np.int32)
        counts = np.fromiter((len(rows) for rows, _ in kinds), dtype=np.int64, count=len(kinds))
        self._units = np.concatenate([[0], np.cumsum(counts)])  # kind k's units: [_units[k], _units[k + 1])
        self._unit_rows = np.fromiter((n for rows, _ in kinds for n in rows), dtype=np.int64, count=int(self._units[-1]))
        self._unit_bytes = np.fromiter((n for _, b in kinds for n in b), dtype=np.int64, count=int(self._units[-1]))
        del kinds
        # offsets of kind k: _offsets[_units[k] + k : _units[k + 1] + k + 1] (a leading 0 per kind)
        pieces = [np.concatenate([[0], np.cumsum(self._unit_rows[a:b])]) for a, b in zip(self._units[:-1], self._units[1:])]
        self._offsets = np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, np.int64)
        self._offsets.flags.writeable = False
        ends = self._offsets[self._units[1:] + np.arange(len(counts))] if len(counts) else np.zeros(0, np.int64)
        self.rows = ends[self._kind] if len(kind) else np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self._kind)

    def _item(self, index: int) -> FileLayout:
        k = int(self._kind[index])
        a, b = int(self._units[k]), int(self._units[k + 1])
        return FileLayout(self.paths[index], int(self.sizes[index]), tuple(self._unit_rows[a:b].tolist()), tuple(self._unit_bytes[a:b].tolist()))

    def unit_rows_at(self, file: int, unit: int) -> int:
        k = self._kind[file]
        first, stop = self._units[k], self._units[k + 1]
        if not 0 <= unit < stop - first:
            raise IndexError(f"file {file} has {stop - first} units, not {unit + 1}")
        return int(self._unit_rows[first + unit])

    def flat_unit_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(each file's unit count, every file's unit rows laid end to end in file order)."""
        per_kind = np.diff(self._units)
        counts = per_kind[self._kind]
        first = np.repeat(np.cumsum(counts) - counts - self._units[:-1][self._kind], counts)
        return counts, self._unit_rows[np.arange(int(counts.sum()), dtype=np.int64) - first]

    @property
    def offsets(self) -> Sequence[np.ndarray]:
        """Every file's unit offsets (first row of each unit, plus the row count)."""
        return _Offsets(self._offsets, self._units, self._kind)


class _Offsets(Column[np.ndarray]):
    __slots__ = ("_views", "_kind")

    def __init__(self, flat: np.ndarray, units: np.ndarray, kind: np.ndarray):
        self._views = [flat[int(units[k]) + k : int(units[k + 1]) + k + 1] for k in range(len(units) - 1)]
        self._kind = array("i", np.asarray(kind, dtype=np.int32).tobytes())  # (items as Python ints: a stream looks up every split's)

    def __len__(self) -> int:
        return len(self._kind)

    def _item(self, index: int) -> np.ndarray:
        return self._views[self._kind[index]]

    def __getitem__(self, index: Any) -> Any:
        if type(index) is int and index >= 0:  # the common case first (the array raises past the end)
            return self._views[self._kind[index]]
        return super().__getitem__(index)


class SplitTable(Column[Split]):
    """Splits as columns: file index, row range and whether the split is the whole file. Items
    are ``Split`` (paths from the layouts); ``rows`` views the same splits as ``SplitRows``."""

    __slots__ = ("paths", "file", "start", "stop", "whole")

    def __init__(self, paths: Sequence[str], file: np.ndarray, start: np.ndarray, stop: np.ndarray, whole: np.ndarray):
        # (arrays of Python's array module: an item is a Python int without NumPy's scalar)
        self.paths = paths
        self.file, self.start, self.stop = (array("q", np.asarray(a, dtype=np.int64).tobytes()) for a in (file, start, stop))
        self.whole = array("b", np.asarray(whole, dtype=np.int8).tobytes())

    def __len__(self) -> int:
        return len(self.file)

    def _item(self, index: int) -> Split:
        path = self.paths[self.file[index]]
        if self.whole[index]:
            return Split(path)
        start = self.start[index]
        return Split(path, start, self.stop[index] - start)

    def entries(self, indices: Iterable[int]) -> list[list]:
        """``list(split.to_dict().values())`` of the splits at ``indices``, without making each split."""
        item, file, start, stop, whole = self.paths.__getitem__, self.file, self.start, self.stop, self.whole
        return [[item(file[i]), None, None] if whole[i] else [item(file[i]), start[i], stop[i] - start[i]] for i in indices]

    def lengths(self) -> np.ndarray:
        """Every split's row count."""
        return np.frombuffer(self.stop, dtype=np.int64) - np.frombuffer(self.start, dtype=np.int64)

    @property
    def rows(self) -> Sequence[SplitRows]:
        return _SplitRowsView(self)


class _SplitRowsView(Column[SplitRows]):
    __slots__ = ("_table",)

    def __init__(self, table: SplitTable):
        self._table = table

    def __len__(self) -> int:
        return len(self._table)

    def _item(self, index: int) -> SplitRows:
        t = self._table
        return SplitRows(t.file[index], t.start[index], t.stop[index])

    def __getitem__(self, index: Any) -> Any:
        if type(index) is int and index >= 0:  # the common case first (the arrays raise past the end)
            t = self._table
            return SplitRows(t.file[index], t.start[index], t.stop[index])
        return super().__getitem__(index)

    def lengths(self) -> np.ndarray:
        return self._table.lengths()


def unit_rows_at(layouts: Sequence[FileLayout], file: int, unit: int) -> int:
    """Rows of unit ``unit`` of file ``file`` (without making the file's layout: a reader asks
    for every piece it reads)."""
    if isinstance(layouts, LayoutTable):
        return layouts.unit_rows_at(file, unit)
    return layouts[file].unit_rows[unit]


def split_entries(splits: Sequence[Split], indices: Iterable[int]) -> list[list]:
    """The state entries' values (``to_dict``) of the splits at ``indices``."""
    if isinstance(splits, SplitTable):
        return splits.entries(indices)
    return [list(splits[i].to_dict().values()) for i in indices]


def split_lengths(split_rows: Sequence[SplitRows], indices: Sequence[int]) -> np.ndarray:
    """The row counts of the splits at ``indices``."""
    if isinstance(split_rows, _SplitRowsView):
        return split_rows.lengths()[np.asarray(indices, dtype=np.int64)]
    return np.fromiter((split_rows[s].num_rows for s in indices), dtype=np.int64, count=len(indices))


def plan_split_table(layouts: LayoutTable, split_bytes: int, split_rows: int | None = None) -> SplitTable:
    """``plan_splits`` of the layouts, as a SplitTable: files within both limits are one
    whole-file split each (worked out on the columns), the others are cut by ``plan_splits``."""
    plan_splits([], split_bytes, split_rows)  # the same checks of the limits
    max_rows = split_rows or MAX_FILE_ROWS
    kept = layouts.rows > 0
    whole = kept & (layouts.sizes <= split_bytes) & (layouts.rows <= max_rows)
    files = [np.flatnonzero(whole)]
    starts = [np.zeros(len(files[0]), dtype=np.int64)]
    stops = [layouts.rows[files[0]]]
    for index in np.flatnonzero(kept & ~whole).tolist():
        cut = plan_splits([layouts[index]], split_bytes, split_rows)
        files.append(np.full(len(cut), index, dtype=np.int64))
        starts.append(np.array([s.row_offset for s in cut], dtype=np.int64))
        stops.append(np.array([(s.row_offset or 0) + (s.row_length or 0) for s in cut], dtype=np.int64))
    file = np.concatenate(files)
    order = np.argsort(file, kind="stable")  # file order; a file's splits stay in row order
    is_whole = np.concatenate([np.ones(len(files[0]), bool), np.zeros(len(file) - len(files[0]), bool)])
    return SplitTable(layouts.paths, file[order], np.concatenate(starts)[order], np.concatenate(stops)[order], is_whole[order])


def row_counts(layouts: Sequence[FileLayout]) -> np.ndarray:
    """Every file's row count (without making each layout of a LayoutTable)."""
    if isinstance(layouts, LayoutTable):
        return layouts.rows
    return np.fromiter((layout.num_rows for layout in layouts), dtype=np.int64, count=len(layouts))


def flat_unit_rows(layouts: Sequence[FileLayout]) -> tuple[np.ndarray, np.ndarray]:
    """(each file's unit count, all unit rows end to end): see ``LayoutTable.flat_unit_rows``."""
    if isinstance(layouts, LayoutTable):
        return layouts.flat_unit_rows()
    counts = np.fromiter((len(layout.unit_rows) for layout in layouts), dtype=np.int64, count=len(layouts))
    return counts, np.fromiter((n for layout in layouts for n in layout.unit_rows), dtype=np.int64, count=int(counts.sum()))


