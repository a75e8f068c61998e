"""Opening files: native files for local paths, range-backed files for object stores.

For a remote file, readers fetch the byte ranges they will need up front
(concurrently, through ``RemoteStore``) and hand pyarrow a ``RangeFile`` that
serves reads from those ranges; a read outside them is fetched on demand.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..storage.paths import is_local, is_remote

if TYPE_CHECKING:
    from typing_extensions import Self

COALESCE_GAP = 64 * 1024
COALESCE_MAX = 64 * 1024 * 1024


def open_input(fs: Any, path: str, readahead: int = 0) -> Any:
    """A seekable binary file for pyarrow: native for local paths, a RangeFile for object
    stores (holding the tail prefetched at planning, if any; ``readahead``: see RangeFile),
    else fsspec's file."""
    if is_local(fs):
        return pa.OSFile(path, "rb")
    if is_remote(fs):
        handle = RangeFile(fs, path, readahead)
        tail = fs.take_tail(path)
        if tail is not None:
            handle.add(*tail)
        return handle
    return fs.open(path, "rb")


def coalesce(ranges: Iterable[tuple[int, int]], gap: int = COALESCE_GAP, max_block: int = COALESCE_MAX) -> list[tuple[int, int]]:
    """Sorted [start, end) ranges with neighbours at most ``gap`` apart merged, as long as the
    merged range stays within ``max_block`` bytes; a range wider than ``max_block`` stays whole,
    and a range inside the last merged one adds nothing. Empty ranges are dropped.

    This is what ``fsspec.utils.merge_offset_ranges(paths, starts, ends, max_gap=gap,
    max_block=max_block)`` returns in fsspec 2026.9, but not in the older versions this package
    allows (fsspec>=2023.1): up to 2026.1 a range nested in the previous one cuts the merged
    range's end back to its own, so bytes of the outer range go unfetched; 2026.2 to 2026.7 drop
    both copies of a range given twice. Every range must be covered, so the merge stays here."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if merged and end <= merged[-1][1]:
            continue  # inside the last merged range (sorted by start)
        if merged and start - merged[-1][1] <= gap and max(end, merged[-1][1]) - merged[-1][0] <= max_block:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


class RangeFile:
    """A read-only, seekable file over known byte ranges of a remote file.

    pyarrow reads it like any Python file; reads inside added ranges are served
    from memory, others are fetched (exactly the bytes asked for) and counted
    in ``on_demand``. With ``readahead``, a read outside them fetches at least that
    many bytes and drops what was fetched on demand before: for a scan through a
    file in small reads (one request per block, one block held).
    """

    def __init__(self, store: Any, path: str, readahead: int = 0):
        self._store = store
        self._path = path
        self._ident = store.ident(path)
        self._size = self._ident[2]
        self._starts: list[int] = []
        self._parts: dict[int, bytes] = {}
        self._pos = 0
        self.closed = False
        self.on_demand = 0  # reads served by a request of their own
        self._fetched_on_demand: list[tuple[int, bytes]] = []
        self._readahead = readahead

    # ---------------------------------------------------------- ranges
    def add(self, start: int, data: bytes) -> None:
        if start not in self._parts:
            bisect.insort(self._starts, start)
        self._parts[start] = data

    def fetch(self, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, bytes]]:
        """Fetch these ranges concurrently (retried, cached) and keep them; returns them as
        (start, bytes) for ``forget``."""
        ranges = [(s, min(e, self._size)) for s, e in ranges if s < min(e, self._size)]
        fetched = list(zip((start for start, _ in ranges), self._store.read_ranges(self._path, ranges, self._ident)))
        for start, data in fetched:
            self.add(start, data)
        return fetched

    def forget(self, fetched: Iterable[tuple[int, bytes]]) -> None:
        """Drop ranges that ``fetch`` returned, unless a later fetch replaced them, and every
        range fetched on demand so far."""
        on_demand, self._fetched_on_demand = self._fetched_on_demand, []
        for start, data in [*fetched, *on_demand]:
            if self._parts.get(start) is data:
                del self._parts[start]
        self._starts = sorted(self._parts)

    def keep_only(self, starts: Iterable[int]) -> None:
        """Forget all ranges but those starting at ``starts`` (bounds memory between units)."""
        keep = set(starts)
        self._parts = {s: d for s, d in self._parts.items() if s in keep}
        self._starts = sorted(self._parts)
        self._fetched_on_demand = [(s, d) for s, d in self._fetched_on_demand if self._parts.get(s) is d]

    def _slice(self, start: int, end: int) -> Any:
        for index in range(bisect.bisect_right(self._starts, start) - 1, -1, -1):  # (parts may overlap)
            first = self._starts[index]
            data = self._parts[first]
            if end <= first + len(data):
                return memoryview(data)[start - first : end - first]
        self.on_demand += 1
        if self._readahead:
            self.forget([])
        fetch_end = min(self._size, max(end, start + self._readahead))
        (data,) = self._store.read_ranges(self._path, [(start, fetch_end)], self._ident)
        self.add(start, data)
        self._fetched_on_demand.append((start, data))
        return memoryview(data)[: end - start]

    def read_range(self, start: int, end: int) -> Any:
        """Bytes [start, end) as a memoryview (fetched if not held)."""
        return self._slice(start, end)

    def read_at(self, nbytes: int, offset: int) -> Any:
        """``nbytes`` bytes from ``offset`` (fewer at the end of the file), as pyarrow's files
        read them (parquet_seek reads page indexes and headers this way)."""
        return self._slice(offset, min(self._size, offset + nbytes)) if offset < self._size else b""

    # ------------------------------------------------------ file protocol
    def read(self, nbytes: int = -1) -> Any:
        end = self._size if nbytes is None or nbytes < 0 else min(self._size, self._pos + nbytes)
        if end <= self._pos:
            return b""
        data = self._slice(self._pos, end)
        self._pos = end
        return data

    def readinto(self, buffer: Any) -> int:
        """Read into ``buffer`` (a writable bytes-like object); the bytes read, fewer at the end."""
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer)[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self._parts, self._starts, self._fetched_on_demand = {}, [], []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
