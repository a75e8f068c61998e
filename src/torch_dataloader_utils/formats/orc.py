"""ORC: stripes are the units, with exact row counts from the file's footer."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.orc as orc

from ..planner import FileLayout
from .io import open_input
from .orc_tail import read_stripes


class _OrcReader:
    def __init__(self, source: Any):
        self._file = orc.ORCFile(source)

    def read_unit(self, unit: int, columns: list[str] | None) -> pa.Table:
        return pa.Table.from_batches([self._file.read_stripe(unit, columns=columns)])


class OrcFormat:
    name = "orc"
    extensions = (".orc",)

    def read_footer(self, fs: Any, path: str, size: int, tag: str | None, url: str) -> tuple[FileLayout, Any]:
        with open_input(fs, path) as source:
            stripes = read_stripes(source, size)
        layout = FileLayout(url, size, tuple(s.rows for s in stripes), tuple(s.length for s in stripes), tag)
        return layout, None

    def open(self, fs: Any, path: str, footer: Any, use_threads: bool) -> _OrcReader:
        return _OrcReader(open_input(fs, path))


ORC = OrcFormat()
