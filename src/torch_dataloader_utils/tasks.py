"""The order in which a rank delivers its workers' rows: a pure function of the progress.

Each worker's stream is cut into chunks of ``chunk_rows`` rows (a whole number of
batches), aligned to the start of the stream. Chunks are delivered in cycles:
chunk c of worker 0, 1, ..., W-1, then chunk c+1, skipping workers whose stream
is done. Given the rows delivered per worker and the worker that is next, the
remaining tasks are exactly the rest of the uninterrupted run's sequence.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence


class ChunkTask(NamedTuple):
    """Rows [start, stop) of worker ``worker``'s stream in ``epoch``; start == stop is a no-op."""

    epoch: int
    worker: int
    start: int
    stop: int


def remaining_tasks(
    epoch: int,
    positions: Sequence[int],
    lengths: Sequence[int],
    next_worker: int,
    chunk_rows: int,
    keep_slots: bool,
) -> list[ChunkTask]:
    """The chunks still to deliver, in delivery order.

    With ``keep_slots`` every cycle has one task per worker (empty for finished
    workers), so that task i always lands on DataLoader process i % W and each
    process keeps reading the same stream.
    """
    workers = len(positions)
    pos = list(positions)
    tasks: list[ChunkTask] = []
    worker = next_worker
    while any(p < n for p, n in zip(pos, lengths)):
        if pos[worker] < lengths[worker]:
            stop = min(lengths[worker], (pos[worker] // chunk_rows + 1) * chunk_rows)
            tasks.append(ChunkTask(epoch, worker, pos[worker], stop))
            pos[worker] = stop
        elif keep_slots:
            tasks.append(ChunkTask(epoch, worker, pos[worker], pos[worker]))
        worker = (worker + 1) % workers
    return tasks
