"""One rank's epoch plan under canonical lanes: which global steps each of its logical workers
delivers, and where each rank lane stands after any number of global steps. Pure.

Rank r delivers its share of global step s (plan/canonical.py: ``GlobalOrder``) as its batch
s. Its batches are dealt to its logical workers as the loader interleaves them: in chunks of
``chunk_rows / batch_size`` batches, round-robin (plan/schedule.py: ``lane_schedule``), so the
rank's batches come out in step order. A rank lane is therefore a list of step shares; its
segments are computed on demand, never stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterator, Sequence, cast

from .canonical import CanonicalBook, GlobalOrder
from .epoch import EpochPlan
from .lanes import Lane, Segment, StreamKey
from .schedule import ChunkTask, Schedule


def worker_steps(steps: int, worker: int, workers: int, chunk_batches: int) -> int:
    """How many of the first ``steps`` steps go to ``worker`` when steps are dealt in runs of
    ``chunk_batches``, round-robin over ``workers``."""
    full, rest = divmod(steps, chunk_batches * workers)
    return full * chunk_batches + min(max(rest - worker * chunk_batches, 0), chunk_batches)


@dataclass(frozen=True)
class CanonicalLane:
    """The rows one logical worker of one rank delivers: its batches are the rank's shares of the
    global steps dealt to it. Answers what a planned ``Lane`` answers (``slice``, ``num_rows``)."""

    order: GlobalOrder
    keys: tuple[StreamKey, ...]
    rank: int
    batch_size: int
    worker: int
    workers: int
    chunk_batches: int
    rank_steps: int  # steps in which this rank has rows
    dealt: bool = False
    canonical: bool = True

    def step_of(self, batch: int) -> int:
        """The global step of this lane's batch ``batch``."""
        m = self.chunk_batches
        return ((batch // m) * self.workers + self.worker) * m + batch % m

    def share(self, step: int) -> tuple[int, int]:
        """Global positions [start, stop) of this rank's share of ``step``."""
        start = step * self.order.global_batch + self.rank * self.batch_size
        return start, max(start, min(start + self.batch_size, self.order.end))

    @cached_property
    def batches(self) -> int:
        return worker_steps(self.rank_steps, self.worker, self.workers, self.chunk_batches)

    @cached_property
    def num_rows(self) -> int:
        if not self.batches:
            return 0
        start, stop = self.share(self.step_of(self.batches - 1))
        return (self.batches - 1) * self.batch_size + stop - start

    def slice(self, start: int, stop: int) -> list[Segment]:
        """The stream segments holding lane rows [start, stop)."""
        out: list[Segment] = []
        size = self.batch_size
        batch = start // size
        while batch < self.batches and batch * size < stop:
            first, last = self.share(self.step_of(batch))
            lo = first + max(start - batch * size, 0)
            hi = min(last, first + stop - batch * size)
            for segment in self.order.segments(self.keys, lo, hi) if hi > lo else []:
                if out and out[-1].key == segment.key and out[-1].stop == segment.start:
                    out[-1] = Segment(segment.key, out[-1].start, segment.stop)
                else:
                    out.append(segment)
            batch += 1
        return out

    @property
    def segments(self) -> tuple[Segment, ...]:
        return tuple(self.slice(0, self.num_rows))


@dataclass(frozen=True)
class LaneRows(Sequence[Segment]):
    """The segments of lane rows [start, stop), computed when first asked (in the process that
    reads them): a pass's tasks are planned for the whole epoch at once, and a canonical step has
    C/R segments per batch."""

    lane: CanonicalLane
    start: int
    stop: int
    _segments: list[list[Segment]] = field(default_factory=list, compare=False, repr=False)

    def _computed(self) -> list[Segment]:
        if not self._segments:
            self._segments.append(self.lane.slice(self.start, self.stop))
        return self._segments[0]

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        return self._computed()[index]

    def __len__(self) -> int:
        return len(self._computed())

    def __iter__(self) -> Iterator[Segment]:
        return iter(self._computed())

    def __getstate__(self) -> dict:
        return {"lane": self.lane, "start": self.start, "stop": self.stop, "_segments": []}

    def __setstate__(self, state: dict) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)


@dataclass(frozen=True, eq=False)
class CanonicalPlan(EpochPlan):
    """An ``EpochPlan`` whose lanes deal the global steps of canonical lanes. Every rank has the
    same number of steps by construction (the last step is padded, dropped or left short as
    ``equalize`` and ``drop_last`` say), so no batch target or padding lane is added."""

    @property
    def canonical_book(self) -> CanonicalBook:
        return cast(CanonicalBook, self.book)

    @cached_property
    def order(self) -> GlobalOrder:
        streams = self.canonical_book.lane_streams(self.epoch)
        batching = self.batching
        policy = "drop" if batching.drop_last or batching.equalize == "drop" else batching.equalize
        return GlobalOrder(self.epoch, tuple(s.num_rows for s in streams), batching.batch_size * self.topology.world_size, policy)

    @cached_property
    def rank_steps(self) -> int:
        """Global steps in which this rank has rows (with equalize="none" the last step may leave
        later ranks none)."""
        steps = self.order.steps
        if steps and self.topology.rank * self.batching.batch_size >= self.order.end - (steps - 1) * self.order.global_batch:
            return steps - 1
        return steps

    @cached_property
    def lanes(self) -> list[Lane]:
        book, t = self.canonical_book, self.topology
        keys = tuple(book.lane_key(self.epoch, lane) for lane in range(book.lanes))
        chunk_batches = self.batching.chunk_rows // self.batching.batch_size
        lanes = [
            CanonicalLane(self.order, keys, t.rank, self.batching.batch_size, worker, t.lanes, chunk_batches, self.rank_steps)
            for worker in range(t.lanes)
        ]
        return cast(list[Lane], lanes)

    @cached_property
    def batch_target(self) -> int | None:
        return None

    def tasks(self, schedule: Schedule) -> list[ChunkTask]:
        """The chunk tasks of a schedule; their segments are computed where the task is read."""
        lanes = self.lanes
        return [ChunkTask(lane, start, stop, cast(tuple, LaneRows(cast(CanonicalLane, lanes[lane]), start, stop))) for lane, start, stop in schedule]

    def worker_of(self, step: int) -> int:
        return (step // (self.batching.chunk_rows // self.batching.batch_size)) % self.topology.lanes

    def progress_after(self, steps: int) -> tuple[list[int], int]:
        """(rows delivered per lane, the lane whose chunk comes next) once this rank has delivered
        its batches of the first ``steps`` global steps: what its progress holds then."""
        steps = min(steps, self.rank_steps)
        positions = []
        for lane in cast(list[CanonicalLane], self.lanes):
            batches = worker_steps(steps, lane.worker, lane.workers, lane.chunk_batches)
            positions.append(lane.num_rows if batches == lane.batches else batches * lane.batch_size)
        return positions, (self.worker_of(steps) if steps < self.rank_steps else 0)
