"""Lanes: what one logical worker of one rank delivers in an epoch, as ranges of streams.

Normally a lane is one whole stream (the worker's splits for this topology). After an
elastic resume a lane is a list of segments of the *old* topology's streams: the rows
the old run had not delivered, dealt to the new ranks and workers. Either way a
lane's progress is one integer, and every stream is a pure function of its key.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from ..lru import Lru
from .columns import split_lengths
from .splits import assign_splits, epoch_order
from .streams import Piece, SplitRows, Stream, build_stream, split_rows_array, split_rows_between

_CACHED_STREAMS = 16


class StreamKey(NamedTuple):
    """Identifies a stream: worker ``worker`` of ``rank`` under (world_size, num_workers) in ``epoch``."""

    epoch: int
    rank: int
    world_size: int
    num_workers: int
    worker: int


class Segment(NamedTuple):
    """Rows [start, stop) of the stream ``key``."""

    key: StreamKey
    start: int
    stop: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.start

    def to_list(self) -> list[int]:
        return [*self.key, self.start, self.stop]


class Lane(NamedTuple):
    segments: tuple[Segment, ...]
    dealt: bool = False  # dealt by an elastic resume: its rows were already cut to whole batches (drop_last)

    @property
    def num_rows(self) -> int:
        return sum(s.num_rows for s in self.segments)

    def slice(self, start: int, stop: int) -> list[Segment]:
        """The segments holding lane rows [start, stop), clipped."""
        out, offset = [], 0
        for segment in self.segments:
            lo, hi = max(start, offset), min(stop, offset + segment.num_rows)
            if hi > lo:
                out.append(Segment(segment.key, segment.start + lo - offset, segment.start + hi - offset))
            offset += segment.num_rows
            if offset >= stop:
                break
        return out


class StreamBook:
    """Builds streams from their keys (cached): the plan a whole job shares."""

    #: decoded windows a reader keeps: a lane reads one stream at a time (canonical lanes read several in turn)
    reader_windows = 2
    #: whether ``assignment`` deals splits (a mixture's book deals blocks of several splits)
    deals_splits = True

    def __init__(self, split_rows: Sequence[SplitRows], file_offsets: Sequence[np.ndarray], shuffle: bool, seed: int, buffer_rows: int):
        self._split_rows = split_rows
        self._file_offsets = file_offsets
        self._shuffle = shuffle
        self._seed = seed
        self._buffer_rows = buffer_rows
        self._assignments: Lru[tuple, list[list[int]]] = Lru(4 * _CACHED_STREAMS)
        self._orders: Lru[int, np.ndarray] = Lru(2)  # epoch -> order of the split list
        self._streams: Lru[StreamKey, Stream] = Lru(_CACHED_STREAMS)
        self._lane_rows: Lru[Lane, np.ndarray] = Lru(_CACHED_STREAMS)  # rows of each split in a lane

    def assignment(self, epoch: int, rank: int, world_size: int, num_workers: int) -> list[list[int]]:
        """Split indices per worker of ``rank`` under this topology."""
        key = (epoch, rank, world_size, num_workers)
        return self._assignments.get(key, lambda: assign_splits(self.epoch_order(epoch), rank, world_size, num_workers))

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The split list's order in ``epoch`` (one permutation per epoch, shared by every rank's assignment)."""
        return self._orders.get(epoch, lambda: epoch_order(len(self._split_rows), self._shuffle, self._seed, epoch))

    @property
    def shuffled(self) -> bool:
        """Whether streams shuffle their pieces (and rows)."""
        return self._shuffle

    def split_lengths(self, splits: Sequence[int]) -> np.ndarray:
        """Rows of each of these splits."""
        return split_lengths(self._split_rows, splits)

    def stream_rows(self, key: StreamKey) -> int:
        """Rows of a stream, without building its pieces."""
        splits = self.assignment(key.epoch, key.rank, key.world_size, key.num_workers)[key.worker]
        return int(split_lengths(self._split_rows, splits).sum())

    def stream(self, key: StreamKey) -> Stream:
        return self._streams.get(key, lambda: self._build_stream(key))

    def _build_stream(self, key: StreamKey) -> Stream:
        splits = self.assignment(key.epoch, key.rank, key.world_size, key.num_workers)[key.worker]
        seed_key = (self._seed, key.epoch, key.rank, key.worker)
        return build_stream(seed_key, splits, self._split_rows, self._file_offsets, self._shuffle, self._buffer_rows)

    def canonical_lanes(self, epoch: int, rank: int, world_size: int, num_workers: int) -> list[Lane]:
        """One whole stream per worker: the lanes of an epoch that was not resized."""
        lanes = []
        for worker in range(max(1, num_workers)):
            key = StreamKey(epoch, rank, world_size, num_workers, worker)
            lanes.append(Lane((Segment(key, 0, self.stream_rows(key)),)))
        return lanes

    def rows_done(self, lane: Lane, position: int) -> dict[int, tuple[int, int]]:
        """Per split touched by the lane: (rows delivered, rows in the lane) at ``position``."""
        out: dict[int, list[int]] = {}
        offset = 0
        for segment in lane.segments:
            stream = self.stream(segment.key)
            totals = split_rows_between(stream, segment.start, segment.stop)
            delivered = min(max(position - offset, 0), segment.num_rows)
            if delivered == segment.num_rows:
                reached = totals
            else:  # only the segment holding the position is part-way
                reached = split_rows_between(stream, segment.start, segment.start + delivered)
            for split, total in totals.items():
                entry = out.setdefault(split, [0, 0])
                entry[0] += reached.get(split, 0)
                entry[1] += total
            offset += segment.num_rows
        return {split: (done, total) for split, (done, total) in out.items()}

    def split_progress(self, lane: Lane, position: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``rows_done`` as arrays: (the splits the lane touches, ascending; rows of each delivered at
        ``position``; rows of each in the lane), counted with numpy: state_dict asks after every
        batch, and a lane of a shuffled epoch over many files holds tens of thousands of pieces."""
        totals = self._lane_rows.get(lane, lambda: self._rows_reached(lane, lane.num_rows))
        done = np.zeros_like(totals)
        reached = self._rows_reached(lane, position)
        done[: len(reached)] = reached[: len(totals)]
        splits = np.flatnonzero(totals)
        return splits, done[splits], totals[splits]

    def _rows_reached(self, lane: Lane, position: int) -> np.ndarray:
        """Rows of each split (an array indexed by split) among the lane's first ``position`` rows."""
        parts, offset = [], 0
        for segment in lane.segments:
            delivered = min(max(position - offset, 0), segment.num_rows)
            if delivered:
                parts.append(split_rows_array(self.stream(segment.key), segment.start, segment.start + delivered))
            offset += segment.num_rows
        out = np.zeros(max((len(part) for part in parts), default=0), dtype=np.int64)
        for part in parts:
            out[: len(part)] += part
        return out

    def files_of(self, segments: Sequence[Segment]) -> list[int]:
        """Indices of the files holding the rows of these segments (for messages)."""
        return sorted({piece.file for piece in self._pieces_of(segments)})

    def splits_of(self, segments: Sequence[Segment]) -> list[int]:
        """Indices of the splits holding the rows of these segments (for messages)."""
        return sorted({piece.split for piece in self._pieces_of(segments)})

    def _pieces_of(self, segments: Sequence[Segment]) -> list[Piece]:
        """The pieces of the windows these segments touch."""
        pieces: list[Piece] = []
        for segment in segments:
            stream = self.stream(segment.key)
            first, last = stream.window_of(segment.start), stream.window_of(max(segment.start, segment.stop - 1))
            pieces.extend(stream.pieces[int(stream.window_pieces[first]) : int(stream.window_pieces[last + 1])])
        return pieces

    def deal_units(self, segment: Segment) -> list[Segment]:
        """Cut a segment into the units an elastic resume deals out: whole windows when
        shuffling (a partly delivered window stays one unit), else runs of one split."""
        stream = self.stream(segment.key)
        if segment.num_rows <= 0:
            return []
        if stream.shuffle:
            bounds = stream.window_rows
        else:
            piece_rows = np.concatenate([[0], np.cumsum([p.num_rows for p in stream.pieces])])
            changes = [i for i in range(1, len(stream.pieces)) if stream.pieces[i].split != stream.pieces[i - 1].split]
            bounds = piece_rows[[0, *changes, len(stream.pieces)]]
        cuts = sorted({segment.start, segment.stop, *(int(b) for b in bounds if segment.start < b < segment.stop)})
        return [Segment(segment.key, a, b) for a, b in zip(cuts, cuts[1:])]
