"""Elastic resume: the rows an interrupted epoch had not delivered, dealt to a new topology.

Pure functions: every rank of a resized job computes the same new lanes from the same
global state, without talking to the others.
"""

from __future__ import annotations

from typing import Sequence

from ..plan.lanes import Lane, Segment, StreamBook


def remaining_units(book: StreamBook, lanes: Sequence[Lane], positions: Sequence[int], lengths: Sequence[int]) -> list[list[Segment]]:
    """Per old lane, the units (segments) it had not delivered, in its order."""
    return [
        [unit for segment in lane.slice(position, length) for unit in book.deal_units(segment)]
        for lane, position, length in zip(lanes, positions, lengths)
    ]


def deal(units_per_lane: Sequence[Sequence[Segment]], world_size: int, num_workers: int, batch_size: int) -> list[list[Lane]]:
    """Deal remaining units to the new topology: [rank][worker] -> Lane.

    Units are taken round-robin across the old lanes (so each new lane mixes them) and laid end
    to end; the new lanes, rank by rank and worker by worker, take shares of that sequence in whole
    batches, and a unit is cut where a share ends. The batches are split evenly over the ranks
    first, then each rank's over its workers, so ranks end within one batch of each other (and
    a rank's workers too), whatever the units' sizes (whole shuffle windows may be larger than a
    share). A cut shuffle window is decoded by each lane that reads a part of it.
    """
    workers = max(1, num_workers)
    depth = max((len(u) for u in units_per_lane), default=0)
    order = [units[i] for i in range(depth) for units in units_per_lane if i < len(units)]
    total = sum(unit.num_rows for unit in order)
    batches = -(-total // batch_size)
    ends, taken = [], 0
    for rank in range(world_size):
        rank_batches = batches // world_size + (rank < batches % world_size)
        for worker in range(workers):
            taken += rank_batches // workers + (worker < rank_batches % workers)
            ends.append(min(total, taken * batch_size))
    dealt: list[list[Segment]] = [[] for _ in ends]
    lane = position = 0
    for unit in order:
        start = unit.start
        while start < unit.stop:
            while position >= ends[lane]:
                lane += 1
            take = min(unit.stop - start, ends[lane] - position)
            dealt[lane].append(Segment(unit.key, start, start + take))
            start += take
            position += take
    return [[Lane(tuple(_join(dealt[rank * workers + worker])), dealt=True) for worker in range(workers)] for rank in range(world_size)]


def _join(segments: list[Segment]) -> list[Segment]:
    out: list[Segment] = []
    for segment in segments:
        if out and out[-1].key == segment.key and out[-1].stop == segment.start:
            out[-1] = Segment(segment.key, out[-1].start, segment.stop)
        else:
            out.append(segment)
    return out
