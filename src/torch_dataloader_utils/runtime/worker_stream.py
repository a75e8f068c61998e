"""The dataset inside a DataLoader worker of torchdata's StatefulDataLoader (or a plain DataLoader
with batch_size=None): each worker yields its own lane's batches and keeps its own position,
which the StatefulDataLoader saves per worker and hands back on resume."""

from __future__ import annotations

import pickle
from functools import partial
from typing import Any, Iterator

import torch

from ..plan.schedule import ChunkTask
from ..read.chunks import ChunkReader
from .delivery import RankDelivery


def check_picklable(value: Any, reader: ChunkReader, task: ChunkTask) -> None:
    """Raise in the worker what pickling ``value`` (read for ``task``) would raise in torch's queue
    thread, where the error is only printed and the value lost: the main process would wait forever.
    Torch batches without a transform hold only values that pickle. (Plain pickle: torch's own
    reductions would move tensors to shared memory for a handle never used.)"""
    output = reader.output
    if output is None or (output.transform is None and output.format == "torch"):
        return
    try:
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:  # noqa: BLE001 - whatever pickling raises
        what = "the transform's result" if output.transform is not None else "the batch"
        fmt = output.format
        raise TypeError(
            f"{what} for {reader.describe(task)} cannot leave the worker process (output_format={fmt!r}): pickling it "
            f"failed ({type(error).__name__}: {error}). Return picklable values from the transform, choose another "
            "output_format (a month_day_nano_interval column pickles only as 'arrow'), or leave the column out with columns=[...]"
        ) from error


class WorkerStream:
    """One worker's position in its lane, in a copy of the dataset that lives in the worker.

    ``epoch_cell`` is shared memory the main process writes on set_epoch, so that persistent
    workers learn the epoch to read.
    """

    def __init__(self, delivery: RankDelivery, epoch_cell: torch.Tensor):
        self.delivery = delivery
        self.epoch_cell = epoch_cell
        self._passes = 0  # passes this copy started inside a DataLoader worker
        self._restored_epoch: int | None = None  # epoch of a worker state loaded since the last pass

    def begin(self, worker: int) -> Iterator[dict[str, Any]]:
        """Where a worker's pass starts. The pass right after a worker state was loaded resumes
        that state's epoch; the first pass of a fresh copy continues the progress it was copied
        with; any later pass starts the selected epoch over, because rows this process read
        ahead in an abandoned pass may never have reached the training loop."""
        restored, self._restored_epoch = self._restored_epoch, None
        self._passes += 1
        epoch = int(self.epoch_cell[0]) if restored is None else restored
        if epoch != self.delivery.progress.epoch:
            self.delivery.reset(epoch)
        elif restored is None and self._passes > 1:
            self.delivery.progress.positions[worker] = 0
        return self._batches(worker)

    def load(self, epoch: int, worker: int, position: int) -> None:
        """Continue from a worker state (already checked against the plan)."""
        delivery = self.delivery
        if epoch != delivery.progress.epoch:
            delivery.reset(epoch)
        delivery.progress.positions[worker] = position
        delivery.progress.restored = True
        delivery.supersede("load_state_dict")
        self._restored_epoch = epoch

    def _batches(self, worker: int) -> Iterator[dict[str, Any]]:
        """One worker's batches, from its position in the epoch."""
        delivery = self.delivery
        plan = delivery.plan()
        positions = delivery.progress.positions
        size = plan.batching.batch_size
        checked = False
        for base, task in plan.worker_tasks(worker, positions[worker]):
            chunk = delivery.reader.read(task)
            delivery.note_skipped(chunk.skipped)
            if chunk.num_read == 0:
                positions[worker] = base + task.stop
            for batch, end in chunk.batches(size, partial(delivery.reader.describe, task)):
                if not checked:  # the first batch of a pass: an output format's or a transform's values are alike
                    checked = True
                    check_picklable(batch, delivery.reader, task)
                positions[worker] = base + end
                yield batch
