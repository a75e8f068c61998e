"""The epoch plan of one rank: its lanes, how many rows and batches each delivers, the equal
batch count every rank meets (padding or dropping), and the order of the chunks still to deliver.

An ``EpochPlan`` is an immutable value computed from the stream book and the settings; the
same plan answers for any progress (positions) within its epoch. Planning another epoch, or a
topology of a saved state, builds another ``EpochPlan``: nothing is swapped and restored.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Sequence

from .lanes import Lane, Segment, StreamBook
from .schedule import PADDING_LANE, ChunkTask, Schedule, cap_batches, chunk_end, lane_schedule, padding_schedule

EQUALIZE_POLICIES = ("pad", "drop", "none")


@dataclass(frozen=True)
class Topology:
    """Where a plan's rows go: ``rank`` of ``world_size`` ranks, each with ``num_workers`` lanes
    (at least one: 0 workers reads in the main process, as one lane)."""

    rank: int
    world_size: int
    num_workers: int

    @property
    def lanes(self) -> int:
        return max(1, self.num_workers)


@dataclass(frozen=True)
class Batching:
    """How a plan's lanes become batches."""

    batch_size: int
    chunk_rows: int  # a whole number of batches
    drop_last: bool = False
    equalize: str = "pad"  # one of EQUALIZE_POLICIES


@dataclass(frozen=True, eq=False)
class EpochPlan:
    """What one rank delivers in one epoch.

    ``dealt`` (with ``dealt_target``) holds the lanes an elastic resume dealt to this rank,
    replacing the lanes the topology would give it; ``dealt_target`` is then the batch count
    every rank meets.
    """

    book: StreamBook
    epoch: int
    topology: Topology
    batching: Batching
    dealt: tuple[Lane, ...] | None = None
    dealt_target: int | None = None

    # ------------------------------------------------------------ lanes and counts
    @cached_property
    def lanes(self) -> list[Lane]:
        if self.dealt is not None:
            return list(self.dealt)
        t = self.topology
        return self.book.canonical_lanes(self.epoch, t.rank, t.world_size, t.num_workers)

    def lane_length(self, lane: Lane) -> int:
        """Rows a lane delivers: with drop_last, the whole batches of a planned lane; every row of a
        lane dealt by an elastic resume (the old plan already left out its partial batches)."""
        rows = lane.num_rows
        size = self.batching.batch_size
        return rows - rows % size if self.batching.drop_last and not lane.dealt else rows

    @cached_property
    def lengths(self) -> list[int]:
        return [self.lane_length(lane) for lane in self.lanes]

    def batches_of(self, lengths: Sequence[int]) -> int:
        size = self.batching.batch_size
        return sum(-(-n // size) for n in lengths)

    @cached_property
    def own_batches(self) -> int:
        """Batches of this rank's own rows, before equalizing."""
        return self.batches_of(self.lengths)

    @cached_property
    def batch_target(self) -> int | None:
        """Batches every rank delivers this epoch, or None when counts are not equalized."""
        if self.topology.world_size == 1 or self.batching.equalize == "none":
            return None
        if self.dealt_target is not None:
            return self.dealt_target
        return equal_batch_count(self.book, self.batching, self.epoch, self.topology.world_size, self.topology.num_workers)

    @property
    def drop_target(self) -> int | None:
        """The batch count this rank stops at under equalize="drop" (None: no cap)."""
        return self.batch_target if self.batching.equalize == "drop" else None

    @cached_property
    def padding_rows(self) -> int:
        """Rows this rank repeats at the end of the epoch so that it meets the batch target."""
        target = self.batch_target
        if target is None or self.batching.equalize != "pad":
            return 0
        return max(0, target - self.own_batches) * self.batching.batch_size

    @cached_property
    def padding_lane(self) -> Lane:
        """Rows to repeat as padding: this rank's own rows, cycled (another rank's if it has none)."""
        rows = self.padding_rows
        if rows == 0:
            return Lane(())
        source = [s for lane in self.lanes for s in lane.segments if s.num_rows]
        if not source:
            t = self.topology
            source = [
                s
                for rank in range(t.world_size)
                for lane in self.book.canonical_lanes(self.epoch, rank, t.world_size, t.num_workers)
                for s in lane.segments
                if s.num_rows
            ]
        segments: list[Segment] = []
        while rows > 0:
            for segment in source:
                take = min(rows, segment.num_rows)
                segments.append(Segment(segment.key, segment.start, segment.start + take))
                rows -= take
                if rows == 0:
                    break
        return Lane(tuple(segments))

    def lanes_done(self, positions: Sequence[int]) -> bool:
        """Whether every lane's own rows are delivered at ``positions``."""
        return all(p >= n for p, n in zip(positions, self.lengths))

    # ------------------------------------------------------------ the order of chunks
    def schedule(self, positions: Sequence[int], next_lane: int, padding_delivered: int, keep_slots: bool = False) -> Schedule:
        """(lane, start, stop) of the chunks still to deliver from this progress, in delivery order."""
        chunk_rows = self.batching.chunk_rows
        schedule = lane_schedule(positions, self.lengths, next_lane, chunk_rows, keep_slots)
        if self.drop_target is not None:
            schedule = self.capped(schedule, positions, self.drop_target)
        return schedule + padding_schedule(padding_delivered, self.padding_rows, chunk_rows)

    def capped(self, schedule: Schedule, positions: Sequence[int], target: int) -> Schedule:
        """The schedule cut where a rank at ``positions`` has delivered ``target`` batches (equalize="drop");
        positions are batch-aligned except at lane ends."""
        return cap_batches(schedule, self.batching.batch_size, target - self.batches_of(positions))

    def total_rows(self) -> int:
        """Rows this rank delivers in the epoch (padding included)."""
        return sum(stop - start for _, start, stop in self.schedule([0] * len(self.lanes), 0, 0))

    def total_batches(self) -> int:
        """Batches this rank delivers in the epoch (padding included)."""
        size = self.batching.batch_size
        return sum(-(-(stop - start) // size) for _, start, stop in self.schedule([0] * len(self.lanes), 0, 0))

    def tasks(self, schedule: Schedule) -> list[ChunkTask]:
        """The chunk tasks of a schedule, each with the stream segments holding its rows."""
        tasks = []
        for lane, start, stop in schedule:
            source = self.padding_lane if lane == PADDING_LANE else self.lanes[lane]
            tasks.append(ChunkTask(lane, start, stop, tuple(source.slice(start, stop))))
        return tasks

    # ------------------------------------------------------------ one worker's share
    def worker_parts(self, worker: int) -> list[tuple[Lane, int]]:
        """(lane, rows) a worker delivers when each worker yields its own batches (torchdata's
        StatefulDataLoader): its own rows, then its share of the padding.

        Under DDP the rank's batches still add up to the target: with equalize="pad" padding
        batch j goes to worker j % W; with "drop" the rank keeps the first target batches of a
        round-robin over its workers, batch by batch.
        """
        lanes, lengths, size = self.lanes, list(self.lengths), self.batching.batch_size
        if self.drop_target is not None:
            round_robin = lane_schedule([0] * len(lanes), lengths, 0, size, keep_slots=False)
            kept = [0] * len(lanes)
            for lane, _, stop in cap_batches(round_robin, size, self.drop_target):
                kept[lane] = stop
            lengths = kept
        parts = [(lanes[worker], lengths[worker])]
        padding = self.padding_rows // size
        if padding:
            source = self.padding_lane
            mine = range(worker, padding, len(lanes))
            parts.append((Lane(tuple(s for j in mine for s in source.slice(j * size, (j + 1) * size))), len(mine) * size))
        return parts

    def worker_rows(self, worker: int) -> int:
        return sum(rows for _, rows in self.worker_parts(worker))

    def worker_tasks(self, worker: int, position: int) -> list[tuple[int, ChunkTask]]:
        """(rows of the worker's earlier parts, task) from ``position`` on: chunks aligned to each
        part's start, as in the uninterrupted run."""
        out, base = [], 0
        chunk_rows = self.batching.chunk_rows
        for lane, length in self.worker_parts(worker):
            start = max(position - base, 0)
            while start < length:
                stop = chunk_end(start, length, chunk_rows)
                out.append((base, ChunkTask(worker, start, stop, tuple(lane.slice(start, stop)))))
                start = stop
            base += length
        return out

    def with_epoch(self, epoch: int) -> EpochPlan:
        """The same settings in another epoch (lanes dealt by an elastic resume belong to theirs only)."""
        return replace(self, epoch=epoch, dealt=None, dealt_target=None)


def equal_batch_count(book: StreamBook, batching: Batching, epoch: int, world_size: int, num_workers: int) -> int:
    """The batches every rank of a topology delivers in ``epoch``: the largest rank's count with
    equalize="pad", the smallest's with "drop"."""
    counts = [
        EpochPlan(book, epoch, Topology(rank, world_size, num_workers), batching).own_batches for rank in range(world_size)
    ]
    return max(counts) if batching.equalize == "pad" else min(counts)
