"""A bounded cache of decoded units for random access: least recently used out first."""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import pyarrow as pa

#: Bytes of decoded (projected, conformed) rows the random-access cache of one process holds at
#: most: about four row groups of 64 MiB decoded. Each DataLoader worker has its own.
DEFAULT_ROW_CACHE_BYTES = 256 * 1024 * 1024


class CachedRows(NamedTuple):
    """Rows [first, first + table.num_rows) of one unit, decoded."""

    first: int
    table: pa.Table

    def covers(self, lo: int, hi: int) -> bool:
        """Whether rows lo..hi (inclusive) of the unit are here."""
        return self.first <= lo and hi < self.first + self.table.num_rows


class UnitCache:
    """Decoded rows of units by (file, unit), at most ``limit_bytes`` in all (the Arrow buffers
    they hold); a table larger than the limit is not kept. One entry per unit: a wider read
    replaces a narrower one."""

    def __init__(self, limit_bytes: int):
        if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 0:
            raise ValueError(f"row_cache_bytes must be an integer >= 0 (0: no cache), got {limit_bytes!r}")
        self.limit_bytes = limit_bytes
        self.nbytes = 0
        self._entries: OrderedDict[tuple[int, int], tuple[CachedRows, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self._entries

    def get(self, key: tuple[int, int], lo: int, hi: int) -> CachedRows | None:
        """The unit's cached rows when they cover rows lo..hi, else None."""
        entry = self._entries.get(key)
        if entry is None or not entry[0].covers(lo, hi):
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: tuple[int, int], rows: CachedRows) -> None:
        self.drop(key)
        size = rows.table.get_total_buffer_size()
        if size > self.limit_bytes:
            return
        self._entries[key] = (rows, size)
        self.nbytes += size
        while self.nbytes > self.limit_bytes:
            _, (_, old) = self._entries.popitem(last=False)
            self.nbytes -= old

    def drop(self, key: tuple[int, int]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.nbytes -= entry[1]

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0
