"""ORC: stripes are the units, with exact row counts from the file's footer."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.orc as orc

from ..planner import FileLayout
from .io import RangeFile, is_remote, open_input
from .orc_tail import _fields, read_stripes

_ORC_TAIL_MIN = 16 * 1024  # what the ORC reader fetches first when opening a file


class _OrcReader:
    def __init__(self, source: Any):
        self._file = orc.ORCFile(source)

    def read_unit(self, unit: int, columns: list[str] | None) -> pa.Table:
        return pa.Table.from_batches([self._file.read_stripe(unit, columns=columns)])


class _RemoteOrcReader:
    """Fetches one whole stripe per unit (one request); the file tail comes from planning."""

    def __init__(self, store: Any, path: str, footer: tuple):
        tail_start, tail, self._stripes = footer
        self._tail_start = tail_start
        self._source = RangeFile(store, path)
        self._source.add(tail_start, tail)
        self._file: orc.ORCFile | None = None

    def read_unit(self, unit: int, columns: list[str] | None) -> pa.Table:
        offset, length = self._stripes[unit]
        self._source.fetch([(offset, offset + length)])
        try:
            if self._file is None:
                self._file = orc.ORCFile(self._source)
            return pa.Table.from_batches([self._file.read_stripe(unit, columns=columns)])
        finally:
            self._source.keep_only([self._tail_start])  # decoded: drop the stripe's bytes


def _remote_footer(source: RangeFile, size: int, stripes: list) -> tuple:
    """(tail start, tail bytes, stripe ranges): what a worker needs to open the file without a request."""
    last = source.read_at(size - 1, size)[0]
    postscript = dict(_fields(bytes(source.read_at(size - 1 - last, size - 1))))
    need = last + 1 + int(postscript.get(1, 0)) + int(postscript.get(5, 0))
    start = max(0, size - max(_ORC_TAIL_MIN, need))
    return start, bytes(source.read_at(start, size)), tuple((s.offset, s.length) for s in stripes)


class OrcFormat:
    name = "orc"

    def read_footer(self, fs: Any, path: str, size: int, url: str) -> tuple[FileLayout, Any]:
        footer = None
        with open_input(fs, path) as source:
            stripes = read_stripes(source, size)
            if is_remote(fs):
                footer = _remote_footer(source, size, stripes)
        layout = FileLayout(url, size, tuple(s.rows for s in stripes), tuple(s.length for s in stripes))
        return layout, footer

    def open(self, fs: Any, path: str, footer: Any, use_threads: bool) -> Any:
        if is_remote(fs):
            return _RemoteOrcReader(fs, path, footer)
        return _OrcReader(open_input(fs, path))


ORC = OrcFormat()
