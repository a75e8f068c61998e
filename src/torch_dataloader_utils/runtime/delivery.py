"""Delivery: the chunk tasks of a pass, and counting each batch as delivered when the loop gets it.

A pass starts from the rank's progress (so a resumed run continues exactly where the saved
one stopped), slices chunks into batches and counts each batch just before handing it over.
Only the newest pass delivers: a newer ``iter(loader)``, ``load_state_dict`` or ``set_epoch``
supersedes older iterators, which then raise instead of counting rows twice.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..plan.epoch import EpochPlan
from ..plan.schedule import PADDING_LANE, ChunkTask, quick_start
from ..read import chunks as chunk_module
from ..read.chunks import Chunk, ChunkReader
from ..state.progress import Progress
from .stats import LoaderStats

log = logging.getLogger("torch_dataloader_utils.dataset")


class RankDelivery:
    """One rank's progress through its epoch, and the passes that deliver it."""

    def __init__(self, plan_for: Callable[[Progress], EpochPlan], reader: ChunkReader, num_workers: int, shuffle: bool, skip_errors: bool):
        self._plan_for = plan_for
        self.reader = reader
        self.num_workers = num_workers
        self._shuffle = shuffle
        self._skip_errors = skip_errors
        self._pass = (0, "")  # (number, what started it): an iterator delivers only while its pass is current
        self.progress = Progress.fresh(0, max(1, num_workers))
        self.last_batch_is_padding = False
        self.epoch_set_since_load = True  # set_epoch came after the last load_state_dict (or none came)
        self._warned_repeat = False
        self._warned_drop = False
        self.reset(0)

    # ------------------------------------------------------------ progress
    def plan(self) -> EpochPlan:
        """The plan of the epoch being delivered (with any lanes an elastic resume dealt)."""
        return self._plan_for(self.progress)

    def remaining(self, keep_slots: bool = False) -> list[tuple[int, int, int]]:
        progress = self.progress
        return self.plan().schedule(progress.positions, progress.next_lane, progress.padding_delivered, keep_slots)

    def reset(self, epoch: int, cause: str = "set_epoch") -> None:
        """Start ``epoch`` from its beginning."""
        self.supersede(cause)
        self.progress = Progress.fresh(epoch, max(1, self.num_workers))

    def restore(self, progress: Progress) -> None:
        """Continue from restored progress (load_state_dict)."""
        progress.restored = True
        self.progress = progress
        self.epoch_set_since_load = False
        self.supersede("load_state_dict")

    def restored_partly(self) -> bool:
        """Whether restored progress sits inside its epoch: some rows delivered (or dealt) and some left."""
        return self.progress.restored and self.progress.started and bool(self.remaining())

    def supersede(self, cause: str) -> None:
        """Start a new pass: iterators of earlier passes stop delivering."""
        self._pass = (self._pass[0] + 1, cause)

    def note_skipped(self, skipped: dict[int, str]) -> None:
        for split, message in skipped.items():
            if split not in self.progress.skipped:
                self.progress.skipped[split] = message
                where = self.reader.catalog.splits_at(self.progress.epoch)[split].describe()
                log.warning("on_error='skip': leaving out unreadable rows of split %s: %s", where, message)

    # ------------------------------------------------------------ passes
    def begin_pass(self, keep_slots: bool, warn_if_nothing_restored: bool = False) -> list[ChunkTask]:
        """Start (or continue) the epoch: the chunk tasks still to deliver, in order.

        An epoch whose every batch was delivered starts again (also when the loop stopped
        after the last batch without running the loader to its end); an epoch restored as
        complete by load_state_dict delivers nothing in the pass right after the load; with
        ``warn_if_nothing_restored`` (create_dataloader's loader) a warning says so when no
        set_epoch came in between. (torchdata's StatefulDataLoader asks again at once and reads
        the epoch anew, as docs/stateful-dataloader.md describes.)
        """
        restored, self.progress.restored = self.progress.restored, False
        schedule = self.remaining(keep_slots)
        epoch = self.progress.epoch
        if warn_if_nothing_restored and restored and not schedule and not self.epoch_set_since_load:
            log.warning(
                "load_state_dict restored epoch %d after its last batch, so this pass delivers nothing. To read epoch %d, "
                "call dataset.set_epoch(%d) first; a loop over range(dataset.epoch, num_epochs) that calls set_epoch "
                "every epoch does this (unlike the upstream package, set_epoch keeps a restored epoch's progress)",
                epoch,
                epoch + 1,
                epoch + 1,
            )
        if not restored and not schedule:  # (empty slots come only while some lane has rows left)
            if self._shuffle and not self._warned_repeat and (any(self.progress.positions) or self.progress.padding_delivered):
                self._warned_repeat = True
                log.warning(
                    "epoch %d is read again, and with shuffle=True in the previous pass's order exactly. Call "
                    "dataset.set_epoch(epoch) with each new epoch number before the epoch for a new order",
                    epoch,
                )
            self.reset(epoch)
            schedule = self.remaining(keep_slots)
        self.supersede("a newer iter(loader)")
        plan = self.plan()
        self._warn_if_drop_cuts_most(plan)
        if keep_slots and not self._skip_errors:  # (skipped rows would move the batch boundaries of a cut chunk)
            # the pass's first batches wait for one decode batch or a quarter of a chunk (whole batches), not a whole chunk
            size, chunk_rows = plan.batching.batch_size, plan.batching.chunk_rows
            first_rows = max(1, min(chunk_rows // 4, chunk_module.WORKER_DECODE_ROWS) // size) * size
            schedule = quick_start(schedule, first_rows, self.num_workers)
        return plan.tasks(schedule)

    def deliver(self, tasks: Sequence[ChunkTask], chunks: Iterable[Chunk], stats: LoaderStats | None = None) -> Iterator[dict[str, Any]]:
        """Slice chunks into batches and count each batch as delivered just before yielding it
        (and in ``stats``). The pass is taken now, not at the first next()."""
        return self._delivered(tasks, chunks, self._pass[0], stats)

    def _delivered(self, tasks: Sequence[ChunkTask], chunks: Iterable[Chunk], current: int, stats: LoaderStats | None) -> Iterator[dict[str, Any]]:
        following = _following_lanes(tasks)
        size = self.plan().batching.batch_size
        if stats is not None:
            stats.start_pass()
        for index, chunk in enumerate(self._pulled(chunks, len(tasks), current)):
            if chunk.stop <= chunk.start:
                continue
            progress = self.progress
            padding = chunk.lane == PADDING_LANE
            expected = progress.padding_delivered if padding else progress.positions[chunk.lane]
            if chunk.start != expected:
                raise RuntimeError(f"internal error: chunk of lane {chunk.lane} starts at row {chunk.start} but {expected} rows were delivered")
            self.note_skipped(chunk.skipped)
            if not padding:
                progress.next_lane = chunk.lane
            if chunk.num_read == 0:
                progress.advance(chunk.lane, chunk.stop, chunk.stop, following[index], padding=padding)
                continue
            if chunk.ready is not None:
                chunk.ready()
            task = tasks[index]
            previous = chunk.start
            for batch, end in chunk.batches(size, partial(self.reader.describe, task)):
                self._check_pass(current)
                if stats is not None:
                    stats.handing_out(batch, None if chunk.prepared is None else end - previous)
                    previous = end
                self.last_batch_is_padding = padding
                # Counted last, with nothing between the count and the hand-off: no outer generator,
                # no call after it, so an exception that strikes while the loop waits for a batch
                # (KeyboardInterrupt, a signal handler's) comes before the count or after the loop got it.
                progress.advance(chunk.lane, end, chunk.stop, following[index], batches=1, padding=padding)
                yield batch
                if stats is not None:
                    stats.asked()
        if stats is not None:
            stats.end_pass()

    def _pulled(self, chunks: Iterable[Chunk], count: int, current: int) -> Iterator[Chunk]:
        """The ``count`` chunks of a pass, each taken only while the pass is current (persistent
        workers serve every iterator of a loader from one stream, so a superseded iterator must not
        take the newer one's chunk), then the source run to its end."""
        source = iter(chunks)
        for _ in range(count):
            self._check_pass(current)
            yield next(source)
        yield from source

    def _check_pass(self, current: int) -> None:
        if self._pass[0] != current:
            raise RuntimeError(
                f"this iterator was superseded by {self._pass[1]} on the same dataset, which changed the progress "
                "it counts batches against; going on would deliver rows twice or book them to the wrong rows, so it "
                "stops. Use one iterator at a time, and iterate the loader anew (for batch in loader) after "
                "set_epoch or load_state_dict"
            )

    def _warn_if_drop_cuts_most(self, plan: EpochPlan) -> None:
        """Once: equalize="drop" leaves out more than half of this rank's batches."""
        target = plan.drop_target
        if target is None or self._warned_drop:
            return
        own = plan.own_batches
        if own and target * 2 < own:
            self._warned_drop = True
            log.warning(
                "equalize='drop': rank %d delivers %d of its %d batches in epoch %d, because the smallest rank has %d; "
                "the rest of its rows are left out this epoch. Use equalize='pad', a smaller split_bytes (more, "
                "evener splits), or fewer ranks",
                plan.topology.rank, target, own, plan.epoch, target,
            )


def _following_lanes(tasks: Sequence[ChunkTask]) -> list[int]:
    """For each task, the lane of the next task with rows (the lane after it in the cycle)."""
    following, upcoming = [0] * len(tasks), 0
    for i in range(len(tasks) - 1, -1, -1):
        following[i] = upcoming
        if tasks[i].stop > tasks[i].start and tasks[i].lane != PADDING_LANE:
            upcoming = tasks[i].lane
    return following
