"""Small units of many object-store files decoded concurrently before a read needs them.

A read that crosses many small remote files (thousands of tiny Parquet files in a bucket) would
otherwise wait for each file's requests in turn: about one round trip per file, 20-50 ms on a
cloud store. ``decode_ahead`` decodes the units a read will take, one thread per file; the reader
then takes them instead of reading them itself. A unit that fails here comes back as its error,
which the reader reports as it reports any of its own reads' (``on_error`` applies there): the
unit is not fetched again, with its retries.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import pyarrow as pa

from ..catalog.build import Catalog
from ..plan.streams import Piece, Stream
from ..storage.paths import is_remote
from .conform import read_conformed
from .filtering import read_filtered

log = logging.getLogger(__name__)

#: files decoded at once
THREADS = 16
#: units larger than this (stored bytes) are read by the reader alone: each of them already
#: fetches its column chunks concurrently, and decoding many at once would hold them all in memory
UNIT_BYTES = 4 << 20
#: the most stored bytes decoded ahead for one read
BUDGET_BYTES = 64 << 20

UnitKey = tuple[int, int]  # (file, unit)


def pieces_between(stream: Stream, start: int, stop: int, skip: Callable[[int, tuple[Piece, ...]], bool]) -> list[Piece]:
    """The pieces of the windows that hold stream rows [start, stop), but those of windows to
    ``skip`` (given the window and its pieces: a window decoded already, or one streamed)."""
    if stop <= start:
        return []
    windows = range(stream.window_of(start), stream.window_of(stop - 1) + 1)
    return [piece for window in windows if not skip(window, pieces := stream.window_pieces_of(window)) for piece in pieces]


def units_to_decode(catalog: Catalog, pieces: Sequence[Piece], known: Callable[[UnitKey], bool]) -> dict[int, list[int]]:
    """file -> its units among ``pieces`` worth decoding ahead: on an object store, small, not
    ``known`` (decoded already), within the budget; empty unless they span two files or more."""
    if not is_remote(catalog.fs):
        return {}
    wanted: dict[int, list[int]] = {}
    budget = BUDGET_BYTES
    for piece in pieces:
        key = (piece.file, piece.unit)
        size = catalog.layouts[piece.file].unit_bytes[piece.unit]
        if not piece.num_rows or size > UNIT_BYTES or known(key) or piece.unit in wanted.get(piece.file, ()):
            continue
        if size > budget:
            break
        budget -= size
        wanted.setdefault(piece.file, []).append(piece.unit)
    return wanted if len(wanted) > 1 else {}


def decode_ahead(
    catalog: Catalog, columns: list[str] | None, wanted: dict[int, list[int]], open_file: Callable[[int], Any]
) -> dict[UnitKey, pa.Table | Exception]:
    """The units ``wanted`` decoded and conformed as the reader would (``open_file``: a new reader of
    a file, one per thread); a unit that fails as its error, and its file's later units left out."""
    read = read_conformed if catalog.row_filter is None else read_filtered

    def decode(item: tuple[int, list[int]]) -> list[tuple[UnitKey, pa.Table | Exception]]:
        file, units = item
        done: list[tuple[UnitKey, pa.Table | Exception]] = []
        try:
            reader = open_file(file)
            for unit in units:
                done.append(((file, unit), read(reader, unit, columns, catalog, file)))
        except Exception as error:  # noqa: BLE001 - raised by the reader, where it takes this unit
            log.debug("decoding ahead stopped at file %s: %s", catalog.files[file].url, error)
            done.append(((file, units[len(done)]), error))
        return done

    with ThreadPoolExecutor(max_workers=min(THREADS, len(wanted)), thread_name_prefix="tdu-decode-ahead") as pool:
        return {key: table for done in pool.map(decode, wanted.items()) for key, table in done}
