"""A worker's stream for one epoch: the ordered rows it delivers. Pure functions, no I/O.

A stream is a list of *pieces* (the part of one row group / stripe inside one
split) grouped into *windows*. Without shuffling every piece is its own window
and rows come out in file order. With shuffling the pieces are permuted and
grouped into windows of at most ``buffer_rows`` rows (at least one piece), and
the rows of each window come out in a permutation drawn from
(seed, epoch, rank, worker, window). A position in the stream is one integer,
the number of rows delivered, which is all a checkpoint needs to store.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .splits import stable_permutation


@dataclass(frozen=True, slots=True)
class SplitRows:
    """Where a split's rows lie: file index and the absolute row range in that file."""

    file: int
    start: int
    stop: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class Piece:
    """Rows [start, stop) of unit ``unit`` of file ``file``, belonging to split ``split``."""

    file: int
    unit: int
    start: int
    stop: int
    split: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Stream:
    """The rows one worker of one rank delivers in one epoch."""

    key: tuple[int, ...]
    splits: tuple[int, ...]
    pieces: tuple[Piece, ...]
    window_pieces: np.ndarray  # piece index where each window starts, plus the end
    window_rows: np.ndarray  # stream row where each window starts, plus the total
    shuffle: bool
    _owners: dict[int, np.ndarray] = field(default_factory=dict, compare=False, repr=False)  # see window_owners
    _piece_arrays: list[np.ndarray] = field(default_factory=list, compare=False, repr=False)  # see piece_arrays

    @property
    def num_rows(self) -> int:
        return int(self.window_rows[-1])

    @property
    def num_windows(self) -> int:
        return len(self.window_rows) - 1

    def window_of(self, row: int) -> int:
        """The window holding stream row ``row``."""
        return int(np.searchsorted(self.window_rows, row, side="right")) - 1

    def window_permutation(self, window: int) -> np.ndarray | None:
        """Output position -> row inside the window, or None when rows keep their order."""
        if not self.shuffle:
            return None
        size = int(self.window_rows[window + 1] - self.window_rows[window])
        return stable_permutation([*self.key, 2, window], size)

    def window_pieces_of(self, window: int) -> tuple[Piece, ...]:
        """The pieces of window ``window``, in their order."""
        return self.pieces[int(self.window_pieces[window]) : int(self.window_pieces[window + 1])]

    def piece_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(split, rows) of every piece, in stream order; made once (state_dict asks after every batch)."""
        if not self._piece_arrays:
            count = len(self.pieces)
            self._piece_arrays.append(np.fromiter((p.split for p in self.pieces), dtype=np.int64, count=count))
            self._piece_arrays.append(np.fromiter((p.num_rows for p in self.pieces), dtype=np.int64, count=count))
        return self._piece_arrays[0], self._piece_arrays[1]

    def window_owners(self, window: int) -> np.ndarray:
        """Per output position of a shuffled window, which of its pieces holds the row. Kept for
        the window asked last: state_dict() asks after every batch, and a permutation of 262,144
        rows takes about 40 ms to draw."""
        owners = self._owners.get(window)
        if owners is None:
            bounds = np.cumsum([p.num_rows for p in self.window_pieces_of(window)])
            permutation = self.window_permutation(window)
            assert permutation is not None, "only shuffled windows have owners"
            owners = np.searchsorted(bounds, permutation, side="right").astype(np.int32)
            self._owners.clear()
            self._owners[window] = owners
        return owners


def split_pieces(split: int, rows: SplitRows, offsets: np.ndarray) -> list[Piece]:
    """The pieces of one split, in file order (units without rows are left out)."""
    first = int(np.searchsorted(offsets, rows.start, side="right")) - 1
    pieces = []
    unit = max(first, 0)
    while unit < len(offsets) - 1 and offsets[unit] < rows.stop:
        lo, hi = max(rows.start, int(offsets[unit])), min(rows.stop, int(offsets[unit + 1]))
        if hi > lo:
            pieces.append(Piece(rows.file, unit, lo - int(offsets[unit]), hi - int(offsets[unit]), split))
        unit += 1
    return pieces


def build_stream(
    key: tuple[int, ...],
    splits: Sequence[int],
    split_rows: Sequence[SplitRows],
    file_offsets: Sequence[np.ndarray],
    shuffle: bool,
    buffer_rows: int,
) -> Stream:
    """The stream of a worker that reads ``splits`` (in this order).

    ``key`` is (seed, epoch, rank, worker): it seeds the piece order and the
    window permutations, so the same key always gives the same stream.
    """
    # A worker's 50,000 pieces would set off a full collection, which in a forked worker also
    # copies every page holding an object the parent made; the pieces hold no cycles.
    collecting = gc.isenabled()
    gc.disable()
    try:
        pieces = [p for s in splits for rows in (split_rows[s],) for p in split_pieces(s, rows, file_offsets[rows.file])]
    finally:
        if collecting:
            gc.enable()
    return stream_of_pieces(key, tuple(splits), pieces, shuffle, buffer_rows)


def stream_of_pieces(key: tuple[int, ...], splits: tuple[int, ...], pieces: Sequence[Piece], shuffle: bool, buffer_rows: int) -> Stream:
    """The stream of ``pieces`` (in this order): shuffled and grouped into windows by ``key``."""
    if shuffle:
        order = stable_permutation([*key, 1], len(pieces))
        pieces = [pieces[i] for i in order]
        starts, rows = [0], 0
        for i, piece in enumerate(pieces):
            if rows and rows + piece.num_rows > buffer_rows:
                starts.append(i)
                rows = 0
            rows += piece.num_rows
        window_pieces = np.array(starts + [len(pieces)], dtype=np.int64)
    else:
        window_pieces = np.arange(len(pieces) + 1, dtype=np.int64)
    piece_rows = np.concatenate([[0], np.cumsum([p.num_rows for p in pieces], dtype=np.int64)])
    return Stream(key, splits, tuple(pieces), window_pieces, piece_rows[window_pieces], shuffle)


def split_rows_between(stream: Stream, start: int, stop: int) -> dict[int, int]:
    """How many rows of each split lie at stream positions [start, stop) (splits with none are
    left out), in the order of their pieces. Costs the pieces of the windows it touches, not of
    the whole stream."""
    done: dict[int, int] = {}
    for lo, hi, counts in _pieces_in(stream, start, stop):
        for piece, count in zip(stream.pieces[lo:hi], counts if counts is not None else (p.num_rows for p in stream.pieces[lo:hi])):
            if count:
                done[piece.split] = done.get(piece.split, 0) + int(count)
    return done


def split_rows_array(stream: Stream, start: int, stop: int) -> np.ndarray:
    """``split_rows_between`` as an array indexed by split (as long as the largest split counted
    needs), counted with numpy over the pieces' arrays instead of piece by piece."""
    splits, rows = stream.piece_arrays()
    parts = [(splits[lo:hi], rows[lo:hi] if counts is None else counts) for lo, hi, counts in _pieces_in(stream, start, stop)]
    size = max((int(ids.max()) + 1 for ids, _ in parts if len(ids)), default=0)
    out = np.zeros(size, dtype=np.int64)
    for ids, counts in parts:  # (float weights hold row counts exactly up to 2**53)
        out += np.rint(np.bincount(ids, weights=counts, minlength=size)).astype(np.int64)
    return out


def _pieces_in(stream: Stream, start: int, stop: int) -> list[tuple[int, int, np.ndarray | None]]:
    """The pieces holding stream positions [start, stop): (first piece, end piece, rows of each in
    the range, or None where every row of them is)."""
    if stop <= start:
        return []
    first, last = stream.window_of(start), min(stream.window_of(stop - 1), stream.num_windows - 1)
    whole_from = first if start == int(stream.window_rows[first]) else first + 1
    whole_to = last if stop >= int(stream.window_rows[last + 1]) else last - 1
    parts: list[tuple[int, int, np.ndarray | None]] = []
    if whole_from <= whole_to:
        parts.append((int(stream.window_pieces[whole_from]), int(stream.window_pieces[whole_to + 1]), None))
    for window in sorted({first, last} - set(range(whole_from, whole_to + 1))):  # windows only part in range
        base = int(stream.window_rows[window])
        counts = _window_counts(stream, window, min(stop, int(stream.window_rows[window + 1])) - base)
        counts = counts - _window_counts(stream, window, max(start, base) - base)
        parts.append((int(stream.window_pieces[window]), int(stream.window_pieces[window + 1]), counts))
    return parts


def _window_counts(stream: Stream, window: int, offset: int) -> np.ndarray:
    """Per piece of the window, its rows among the window's first ``offset`` output rows."""
    lo, hi = int(stream.window_pieces[window]), int(stream.window_pieces[window + 1])
    rows = stream.piece_arrays()[1][lo:hi]
    if stream.shuffle and 0 < offset < rows.sum():
        return np.bincount(stream.window_owners(window)[:offset], minlength=hi - lo)
    return np.clip(offset - (np.cumsum(rows) - rows), 0, rows)  # in piece order (or all of the window, or none)
