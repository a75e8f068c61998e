"""Hive-style partitions: ``key=value`` directories below the dataset's root become columns.

``partitioning="hive"`` wraps the format (``PartitionedFormat``): every file's schema gains the
partition columns and every table read gains their values, so that selection (``columns=``),
schema unification and batches treat them like the file's own columns. Values are typed per
key over all files: integers (int64), floats (float64), dates (YYYY-MM-DD, date32), else
strings; ``__HIVE_DEFAULT_PARTITION__`` is null. Values are URL-decoded (``%20``).

``directory_guarantee`` is what a file's directories say of its rows: ``filters=`` prunes with it
(catalog/filter_prune.py), so files of directories the filter rules out are neither counted nor read.
"""

from __future__ import annotations

import datetime
import posixpath
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    from ..formats._lazy import compute as pc  # imported when first used

from ..errors import UnsupportedFileError
from ..formats import FileFormat
from ..plan.splits import FileLayout
from ..storage.versions import FileEntry
from .discovery import _glob_root

NULL_VALUE = "__HIVE_DEFAULT_PARTITION__"
# ASCII digits only (re.ASCII): "٣" or full-width "１２" stay strings, as pyarrow reads them
_INT = re.compile(r"^[+-]?\d+$", re.ASCII)
_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$", re.ASCII)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$", re.ASCII)


@dataclass(frozen=True)
class Partitions:
    """The partition keys (in directory order), their Arrow types, and every file's values by URL."""

    keys: tuple[str, ...]
    types: tuple[pa.DataType, ...]
    values: Mapping[str, tuple[Any, ...]]

    @property
    def fields(self) -> list[pa.Field]:
        return [pa.field(key, kind, nullable=True) for key, kind in zip(self.keys, self.types)]


def _roots(fs: Any, paths: Sequence[str]) -> list[str]:
    """The directory below which each user path's partition directories start."""
    roots = []
    for user_path in paths:
        stripped = fs._strip_protocol(user_path)
        if any(c in stripped for c in "*?["):
            roots.append(_glob_root(stripped))
        elif fs.isdir(stripped.rstrip("/") or stripped):
            roots.append(stripped.rstrip("/"))
        else:
            roots.append(posixpath.dirname(stripped))
    return roots


def _segments(entry: FileEntry, roots: Sequence[str]) -> list[str]:
    root = max((r for r in roots if entry.fs_path.startswith(r.rstrip("/") + "/") or not r), key=len, default="")
    relative = entry.fs_path[len(root.rstrip("/")) + 1 :] if root else entry.fs_path
    return relative.split("/")[:-1]


def _typed(texts: list[str | None]) -> tuple[pa.DataType, list[Any]]:
    present = [t for t in texts if t is not None]
    integers = [int(t) for t in present if _INT.match(t)]
    fit = all(-(2**63) <= i < 2**63 for i in integers)  # an integer beyond int64 keeps its digits: a string (a float would round it)
    if present and len(integers) == len(present) and fit:
        return pa.int64(), [None if t is None else int(t) for t in texts]
    if present and fit and all(_FLOAT.match(t) for t in present):
        return pa.float64(), [None if t is None else float(t) for t in texts]
    if present and all(_DATE.match(t) for t in present):
        try:
            return pa.date32(), [None if t is None else datetime.date.fromisoformat(t) for t in texts]
        except ValueError:
            pass  # not real dates (2024-13-45): strings
    return pa.string(), texts


def parse_partitions(files: Sequence[FileEntry], roots: Sequence[str]) -> Partitions:
    """Every file's ``key=value`` directories, typed; a ValueError names a file outside the layout."""
    keys: tuple[str, ...] | None = None
    texts: list[list[str | None]] = []
    first = ""
    for entry in files:
        segments = _segments(entry, roots)
        pairs = [segment.split("=", 1) for segment in segments]
        bad = [s for s, pair in zip(segments, pairs) if len(pair) != 2 or not pair[0]]
        names = tuple(unquote(pair[0]) for pair in pairs)
        if not bad and keys == () and names:  # the first file sits above the layout: it is the stray one
            layout = "/".join(f"{k}=..." for k in names)
            raise ValueError(
                f"{first} is outside the hive layout (partitioning='hive'): it has no key=value directories, but "
                f"{entry.url} has {layout}. Move or remove the file, or pass partitioning=None"
            )
        if bad or (keys is not None and names != keys):
            expected = "/".join(f"{k}=..." for k in keys) if keys is not None else "key=value directories"
            why = f"directory {bad[0]!r} is not key=value" if bad else f"its directories are {'/'.join(segments) or 'none'}"
            raise ValueError(
                f"{entry.url} is outside the hive layout (partitioning='hive'): {why}, but {first or 'the files'} "
                f"{'has' if first else 'need'} {expected}. Move or remove the file, or pass partitioning=None"
            )
        if keys is None:
            keys, first = names, entry.url
        texts.append([None if pair[1] == NULL_VALUE else unquote(pair[1]) for pair in pairs])
    keys = keys or ()
    columns = [_typed([row[i] for row in texts]) for i in range(len(keys))]
    values = {entry.url: tuple(column[1][row] for column in columns) for row, entry in enumerate(files)}
    return Partitions(keys, tuple(kind for kind, _ in columns), values)


def directory_guarantee(partitions: Partitions, url: str) -> pc.Expression:
    """What every row of the file at ``url`` satisfies by its directories: each key equals its
    value (or is null), for pruning files by ``filters=`` without opening them."""
    guarantee = None
    for key, kind, value in zip(partitions.keys, partitions.types, partitions.values[url]):
        term = pc.field(key).is_null() if value is None else pc.field(key) == pa.scalar(value, kind)
        guarantee = term if guarantee is None else guarantee & term
    return guarantee if guarantee is not None else pc.scalar(True)


def _constant(value: Any, kind: pa.DataType, rows: int) -> pa.Array:
    if value is None:
        return pa.nulls(rows, kind)
    return pa.array([value], kind).take(pa.array(np.zeros(rows, dtype=np.int64)))


class _PartitionedReader:
    def __init__(self, inner: Any, partitions: Partitions, values: tuple[Any, ...]):
        self._inner, self._partitions, self._values = inner, partitions, values

    def _split(self, columns: list[str] | None) -> tuple[list[str] | None, list[int]]:
        keys = self._partitions.keys
        if columns is None:
            return None, list(range(len(keys)))
        return [c for c in columns if c not in keys], [keys.index(c) for c in columns if c in keys]

    def _with_values(self, table: pa.Table, wanted: list[int], columns: list[str] | None) -> pa.Table:
        for i in wanted:
            table = table.append_column(self._partitions.fields[i], _constant(self._values[i], self._partitions.types[i], table.num_rows))
        return table if columns is None else table.select(columns)

    def read_unit(self, unit: int, columns: list[str] | None) -> pa.Table:
        inner, wanted = self._split(columns)
        return self._with_values(self._inner.read_unit(unit, inner), wanted, columns)

    def iter_unit(self, unit: int, columns: list[str] | None, batch_rows: int, first_row: int = 0) -> Iterator[pa.Table]:
        inner, wanted = self._split(columns)
        for table in self._inner.iter_unit(unit, inner, batch_rows, first_row):
            yield self._with_values(table, wanted, columns)


class PartitionedFormat:
    """A format whose files also hold their partition columns (``FileFormat``)."""

    def __init__(self, inner: FileFormat, partitions: Partitions, paths: Mapping[str, str]):
        self.inner, self.partitions = inner, partitions
        self.name, self.suffixes, self.streams_units = inner.name, inner.suffixes, inner.streams_units
        self.schema_advice = getattr(inner, "schema_advice", "")
        self.options = getattr(inner, "options", None)  # a text format's reader options
        self._urls = paths  # a file's path on its filesystem -> its URL (the key of its values)

    def read_footer(self, fs: Any, path: str, size: int, url: str) -> tuple[FileLayout, Any]:
        layout, footer = self.inner.read_footer(fs, path, size, url)
        return layout, (footer, self.partitions.values[url], sum(layout.unit_rows))

    def schema(self, fs: Any, path: str, footer: Any) -> pa.Schema:
        return self.with_partitions(self.inner.schema(fs, path, footer[0]))

    def stored_schema(self, schema: pa.Schema) -> pa.Schema:
        """A file's schema as the file stores it (``schema`` without the partition columns): what
        the plan cache keeps, since the partition columns' types depend on every file listed."""
        return pa.schema(list(schema)[: len(schema) - len(self.partitions.keys)], metadata=schema.metadata)

    def with_partitions(self, schema: pa.Schema) -> pa.Schema:
        """A file's stored schema with the partition columns appended."""
        clash = [key for key in self.partitions.keys if key in schema.names]
        if clash:  # (UnsupportedFileError: planning names the file, and adds no advice about damaged files)
            raise UnsupportedFileError(
                f"column {clash[0]!r} is both a column of the file and a partition directory (partitioning='hive'), as "
                "writers that keep the partition columns in the files make it (polars' partition_by); rename one, or "
                "pass partitioning=None"
            )
        for field in self.partitions.fields:
            schema = schema.append(field)
        return schema

    def null_counts(self, footer: Any, names: Sequence[str]) -> dict[str, int]:
        """Nulls per column among ``names`` where planning knows them: every row of a null partition
        value (``__HIVE_DEFAULT_PARTITION__``), and the file's own statistics for its columns."""
        inner_footer, values, rows = footer
        counts_of = getattr(self.inner, "null_counts", None)
        stored = [name for name in names if name not in self.partitions.keys]
        counts = dict(counts_of(inner_footer, stored)) if counts_of is not None and stored else {}
        counts.update({key: count for key, count in self._null_values(values, rows).items() if key in names})
        return counts

    def nulls_by_column(self, footer: Any) -> dict[str, int]:
        """Nulls per column of a footer that will not be kept: the file's statistics' and every row
        of a null partition value."""
        inner_footer, values, rows = footer
        counts_of = getattr(self.inner, "nulls_by_column", None)
        counts = dict(counts_of(inner_footer)) if counts_of is not None else {}
        counts.update(self._null_values(values, rows))
        return counts

    def partition_nulls(self, url: str, rows: int) -> dict[str, int]:
        """Nulls the file at ``url`` holds in its partition columns (every row of a null value)."""
        return self._null_values(self.partitions.values[url], rows)

    def _null_values(self, values: tuple[Any, ...], rows: int) -> dict[str, int]:
        return {key: rows for key, value in zip(self.partitions.keys, values) if value is None}

    def open(self, fs: Any, path: str, footer: Any, use_threads: bool) -> _PartitionedReader:
        """A reader; with ``footer`` None (a local file whose footer was not kept) the inner format
        reads it again."""
        if footer is None:
            return _PartitionedReader(self.inner.open(fs, path, None, use_threads), self.partitions, self.partitions.values[self._urls[path]])
        return _PartitionedReader(self.inner.open(fs, path, footer[0], use_threads), self.partitions, footer[1])


def hive_format(fmt: FileFormat, fs: Any, paths: Sequence[str], files: Sequence[FileEntry]) -> PartitionedFormat:
    """``fmt`` reading the partition columns of ``files`` below the roots of ``paths`` too."""
    return PartitionedFormat(fmt, parse_partitions(files, _roots(fs, paths)), {entry.fs_path: entry.url for entry in files})
