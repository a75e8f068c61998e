"""Canonical lanes: an epoch's rows in an order that does not depend on the topology. Pure functions.

With ``canonical_lanes=C`` the epoch's rows are laid out as C *canonical lanes*, a function of the
files, ``split_bytes``, ``shuffle``, ``shuffle_seed``, ``shuffle_buffer_rows``, the epoch and C
only: the splits in the epoch's order are laid end to end and cut into C runs of equal length
(to a row; a unit cut there is read by both lanes), and each run is a stream (pieces shuffled
and grouped into windows as a worker's stream is).

The *global sequence* interleaves the lanes: with G rows per global step (batch_size x
world_size) and q = G / C, global step s holds rows [s*q, (s+1)*q) of every lane, lane after
lane, while every lane has q rows left (the *body*). The rows left after that (the *tail*: less
than q + 1 rows of each lane, under G + C rows in all) follow lane after lane. Global step s is
positions [s*G, (s+1)*G) of that sequence, and rank r's batch of step s is positions
[s*G + r*b, s*G + (r+1)*b): in the body, lanes [r*C/R, (r+1)*C/R). ``GlobalOrder`` maps
positions to stream segments.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import numpy as np

from ..lru import Lru
from .lanes import Segment, StreamBook, StreamKey
from .splits import MAX_SEED_WORD
from .streams import Piece, SplitRows, Stream, split_pieces, stream_of_pieces

#: StreamKey.num_workers of a canonical lane's stream (StreamKey.rank is the lane, world_size is C)
CANONICAL_STREAM = -1
_SEED_MARK = 0xCA  # keeps canonical streams' permutations apart from a worker stream's of the same numbers


def check_canonical(lanes: int, world_size: int, num_workers: int, batch_size: int) -> None:
    """ValueError unless ``lanes`` fits the topology: world_size x max(1, num_workers) divides
    it, and it divides the global batch G = batch_size x world_size; the message names a
    valid alternative."""
    workers = max(1, num_workers)
    logical = world_size * workers
    global_batch = batch_size * world_size
    if not (isinstance(lanes, int) and not isinstance(lanes, bool)) or not 1 <= lanes <= MAX_SEED_WORD:
        raise ValueError(f"canonical_lanes must be None or a positive integer, got {lanes!r}")
    if lanes % logical == 0 and global_batch % lanes == 0:
        return
    causes = []
    if lanes % logical:
        causes.append(f"world_size x max(1, num_workers) = {world_size} x {workers} = {logical} does not divide it")
    if global_batch % lanes:
        causes.append(f"it does not divide the global batch G = batch_size x world_size = {batch_size} x {world_size} = {global_batch}")
    options = []
    fitting_workers = [w for w in range(1, lanes + 1) if lanes % (world_size * w) == 0]
    if global_batch % lanes == 0 and fitting_workers:
        options.append(f"num_workers in {fitting_workers[-4:]} (with canonical_lanes={lanes})")
    fitting_lanes = [c for c in range(logical, global_batch + 1, logical) if global_batch % c == 0]
    if fitting_lanes:
        shown = [c for c in fitting_lanes if c <= 256][-5:] or fitting_lanes[:1]
        options.append(f"canonical_lanes in {shown} (each C gives its own order: keep one C for a whole job)")
    step = lanes // np.gcd(lanes, world_size)  # batch_size must be a multiple of this for C | G
    if lanes % logical == 0:
        options.append(f"batch_size={max(step, batch_size // step * step)} (a multiple of {step})")
    raise ValueError(
        f"canonical_lanes={lanes} does not fit world_size={world_size}, num_workers={num_workers}, global batch G={global_batch}: "
        + "; ".join(causes)
        + ". Valid: world_size x max(1, num_workers) divides canonical_lanes, and canonical_lanes divides batch_size x "
        "world_size. Try " + ", or ".join(options or ["another canonical_lanes"])
        + " (docs/reproducible-order.md)"
    )


def check_canonical_workers(lanes: int | None, loader_workers: int, chunk_rows: int, batch_size: int) -> None:
    """ValueError when a DataLoader of ``loader_workers`` workers that yields batches one by one
    (torchdata's StatefulDataLoader) reads canonical lanes in chunks of more than one batch."""
    if lanes is not None and loader_workers > 1 and chunk_rows != batch_size:
        raise ValueError(
            f"canonical_lanes with a DataLoader of {loader_workers} workers that yield batches one by one (torchdata's "
            f"StatefulDataLoader) needs chunk_rows=batch_size={batch_size} (got {chunk_rows}): the global steps are "
            "dealt to the workers in chunks, and such a loader takes one batch from each worker in turn"
        )


def lane_streams(
    split_rows: Sequence[SplitRows],
    file_offsets: Sequence[np.ndarray],
    order: np.ndarray,
    lanes: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    buffer_rows: int,
) -> list[Stream]:
    """The C canonical lanes of an epoch: the splits in ``order`` end to end, cut into ``lanes``
    runs of equal length (to one row), each a stream whose shuffle windows hold
    ``buffer_rows / lanes`` rows (at least one piece): a worker reads the lanes of its rank in
    turn and keeps one window of each, so it holds at most ``buffer_rows`` rows as without
    canonical lanes (plus whole pieces where a piece is larger)."""
    pieces = [p for s in order for p in split_pieces(int(s), split_rows[int(s)], file_offsets[split_rows[int(s)].file])]
    total = sum(p.num_rows for p in pieces)
    bounds = [lane * total // lanes for lane in range(lanes + 1)]
    per_lane: list[list[Piece]] = [[] for _ in range(lanes)]
    lane, row = 0, 0
    for piece in pieces:
        start = piece.start
        while start < piece.stop:
            while row >= bounds[lane + 1]:
                lane += 1
            take = min(piece.stop - start, bounds[lane + 1] - row)
            per_lane[lane].append(Piece(piece.file, piece.unit, start, start + take, piece.split))
            start += take
            row += take
    streams = []
    window = max(1, buffer_rows // lanes)  # a worker holds a window of each lane it reads: at most C per worker
    for lane, lane_pieces in enumerate(per_lane):
        splits = tuple(dict.fromkeys(p.split for p in lane_pieces))
        streams.append(stream_of_pieces((seed, epoch, lanes, lane, _SEED_MARK), splits, lane_pieces, shuffle, window))
    return streams


class CanonicalBook(StreamBook):
    """A stream book that also serves the canonical lanes' streams (StreamKey with num_workers
    CANONICAL_STREAM, rank = lane, world_size = C)."""

    def __init__(self, *args: Any, lanes: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lanes = lanes
        self._layouts: Lru[int, list[Stream]] = Lru(2)

    def lane_streams(self, epoch: int) -> list[Stream]:
        return self._layouts.get(
            epoch,
            lambda: lane_streams(
                self._split_rows, self._file_offsets, self.epoch_order(epoch), self.lanes, self._shuffle, self._seed, epoch, self._buffer_rows
            ),
        )

    def lane_key(self, epoch: int, lane: int) -> StreamKey:
        return StreamKey(epoch, lane, self.lanes, CANONICAL_STREAM, 0)

    def stream(self, key: StreamKey) -> Stream:
        if key.num_workers == CANONICAL_STREAM:
            return self.lane_streams(key.epoch)[key.rank]
        return super().stream(key)

    def stream_rows(self, key: StreamKey) -> int:
        if key.num_workers == CANONICAL_STREAM:
            return self.stream(key).num_rows
        return super().stream_rows(key)

    def split_progress(self, lane: Any, position: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As ``rows_done``: nothing for a rank lane of canonical lanes."""
        if getattr(lane, "canonical", False):
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        return super().split_progress(lane, position)

    def rows_done(self, lane: Any, position: int) -> dict[int, tuple[int, int]]:
        """A rank lane of canonical lanes holds slices of many streams: its state records the
        global step instead of the splits it completed (see state/canonical.py)."""
        if getattr(lane, "canonical", False):
            return {}
        return super().rows_done(lane, position)


@dataclass(frozen=True)
class GlobalOrder:
    """An epoch's global sequence under C lanes and G rows per global step (see the module doc).

    ``end`` is where the epoch stops: the rows (equalize="none"), whole global steps
    (equalize="drop" or drop_last), or whole steps with the last one completed by positions past
    the rows, which repeat the sequence from its start (equalize="pad").
    """

    epoch: int
    lane_rows: tuple[int, ...]
    global_batch: int
    policy: str  # "pad", "drop" or "none"

    @property
    def lanes(self) -> int:
        return len(self.lane_rows)

    @property
    def per_lane(self) -> int:
        """q: rows of each lane in a global step of the body."""
        return self.global_batch // self.lanes

    @cached_property
    def rows(self) -> int:
        return sum(self.lane_rows)

    @cached_property
    def body_steps(self) -> int:
        return min(self.lane_rows) // self.per_lane if self.lane_rows else 0

    @cached_property
    def tail_offsets(self) -> np.ndarray:
        """Position in the tail where each lane's rest starts, plus the tail's length."""
        rest = [n - self.body_steps * self.per_lane for n in self.lane_rows]
        return np.concatenate([[0], np.cumsum(rest, dtype=np.int64)])

    @property
    def steps(self) -> int:
        """Global steps of the epoch."""
        if self.policy == "drop":
            return self.rows // self.global_batch
        return -(-self.rows // self.global_batch)

    @property
    def end(self) -> int:
        return self.rows if self.policy == "none" else self.steps * self.global_batch

    def segments(self, keys: Sequence[StreamKey], start: int, stop: int) -> list[Segment]:
        """The stream segments of positions [start, stop) (``keys``: each lane's stream key)."""
        out: list[Segment] = []
        q, body = self.per_lane, self.body_steps * self.global_batch
        offsets = self.tail_offsets
        while start < stop:
            position = start % self.rows  # padding repeats the sequence from its start
            if position < body:
                step, offset = divmod(position, self.global_batch)
                lane, row = divmod(offset, q)
                row += step * q
                take = min(stop - start, q - offset % q)
            else:
                tail = position - body
                lane = int(np.searchsorted(offsets, tail, side="right")) - 1
                row = self.body_steps * q + tail - int(offsets[lane])
                take = min(stop - start, int(offsets[lane + 1]) - tail)
            take = min(take, self.rows - position)
            segment = Segment(keys[lane], row, row + take)
            if out and out[-1].key == segment.key and out[-1].stop == segment.start:
                out[-1] = Segment(segment.key, out[-1].start, segment.stop)
            else:
                out.append(segment)
            start += take
        return out
