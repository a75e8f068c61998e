"""Parquet: row groups are the units."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..planner import FileLayout
from .io import open_input


class _ParquetReader:
    def __init__(self, source: Any, footer: pq.FileMetaData, use_threads: bool):
        self._file = pq.ParquetFile(source, metadata=footer)
        self._use_threads = use_threads

    def read_unit(self, unit: int, columns: list[str] | None) -> pa.Table:
        return self._file.read_row_group(unit, columns=columns, use_threads=self._use_threads)


class ParquetFormat:
    name = "parquet"
    extensions = (".parquet", ".pq", ".parq")

    def read_footer(self, fs: Any, path: str, size: int, tag: str | None, url: str) -> tuple[FileLayout, Any]:
        with open_input(fs, path) as source:
            footer = pq.ParquetFile(source).metadata
        rows = tuple(footer.row_group(i).num_rows for i in range(footer.num_row_groups))
        sizes = tuple(
            sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
            for rg in (footer.row_group(i) for i in range(footer.num_row_groups))
        )
        return FileLayout(url, size, rows, sizes, tag), footer

    def open(self, fs: Any, path: str, footer: Any, use_threads: bool) -> _ParquetReader:
        return _ParquetReader(open_input(fs, path), footer, use_threads)


PARQUET = ParquetFormat()
