"""The order in which a rank delivers its lanes' rows: a pure function of the progress.

Each lane is cut into chunks of ``chunk_rows`` rows (a whole number of batches),
aligned to the start of the lane. Chunks are delivered in cycles: chunk c of lane
0, 1, ..., W-1, then chunk c+1, skipping finished lanes. Given the rows delivered
per lane and the lane that is next, ``lane_schedule`` returns exactly the rest of
the uninterrupted run's sequence. Padding (for equal batch counts across ranks)
comes after all real rows. ``quick_start`` reads a pass's first chunk in two pieces
(the same rows in the same order), so that its first batches come sooner.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from .lanes import Segment

PADDING_LANE = -1

#: (lane, start, stop) of each chunk, in delivery order
Schedule = list[tuple[int, int, int]]


def chunk_end(position: int, length: int, chunk_rows: int) -> int:
    """Where the chunk holding row ``position`` of a lane of ``length`` rows ends: chunks are
    aligned to the lane's start, so a resume cuts the same chunks as the uninterrupted run."""
    return min(length, (position // chunk_rows + 1) * chunk_rows)


class ChunkTask(NamedTuple):
    """Rows [start, stop) of lane ``lane`` and the stream segments that hold them.

    ``lane == PADDING_LANE`` marks repeated rows that only even out batch counts.
    A task with start == stop is an empty slot that keeps workers on their lanes.
    """

    lane: int
    start: int
    stop: int
    segments: tuple[Segment, ...]


def lane_schedule(
    positions: Sequence[int],
    lengths: Sequence[int],
    next_lane: int,
    chunk_rows: int,
    keep_slots: bool,
) -> Schedule:
    """(lane, start, stop) of the chunks still to deliver, in delivery order.

    With ``keep_slots`` every cycle has one entry per lane (empty for finished
    lanes), so that entry i always lands on DataLoader process i % W and each
    process keeps reading the same lane.
    """
    lanes = len(positions)
    pos = list(positions)
    out: Schedule = []
    lane = next_lane
    while any(p < n for p, n in zip(pos, lengths)):
        if pos[lane] < lengths[lane]:
            stop = chunk_end(pos[lane], lengths[lane], chunk_rows)
            out.append((lane, pos[lane], stop))
            pos[lane] = stop
        elif keep_slots:
            out.append((lane, pos[lane], pos[lane]))
        lane = (lane + 1) % lanes
    return out


def cap_batches(schedule: Schedule, batch_size: int, budget: int) -> Schedule:
    """The schedule cut after ``budget`` batches (empty slots kept until then)."""
    out = []
    for lane, start, stop in schedule:
        if budget <= 0:
            break
        batches = -(-(stop - start) // batch_size)
        if batches > budget:
            stop = start + budget * batch_size
            batches = budget
        out.append((lane, start, stop))
        budget -= batches
    return out


def quick_start(schedule: Schedule, first_rows: int, processes: int) -> Schedule:
    """The schedule with its first chunk cut after ``first_rows`` rows, so that the first batches
    wait for the decoding of those rows only, not of a whole chunk.

    The rows and their order stay the same. ``processes - 1`` empty slots follow the first piece,
    so that the rest of the chunk and every later entry go to the same DataLoader process as
    before (entry i goes to process i % processes). Padding is not cut.
    """
    if not schedule or processes < 1:
        return schedule
    lane, start, stop = schedule[0]
    if lane == PADDING_LANE or stop - start <= first_rows:
        return schedule
    cut = start + first_rows
    waiting = [(next_lane, at, at) for next_lane, at, _ in schedule[1:processes]]
    waiting += [(lane, cut, cut)] * (processes - 1 - len(waiting))
    return [(lane, start, cut), *waiting, (lane, cut, stop), *schedule[1:]]


def padding_schedule(position: int, rows: int, chunk_rows: int) -> Schedule:
    """Chunks of the padding lane from ``position`` to ``rows``."""
    out = []
    while position < rows:
        stop = chunk_end(position, rows, chunk_rows)
        out.append((PADDING_LANE, position, stop))
        position = stop
    return out
