"""StructuredDataset: the plan, the progress of one rank, and reading in any process."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import torch
from torch.utils.data import IterableDataset, get_worker_info

from .catalog import Catalog, build_catalog
from .convert import slice_columns, table_to_columns
from .planner import DEFAULT_SPLIT_BYTES, assign_splits, epoch_order
from .reader import StreamReader
from .state import (
    build_rank_state,
    build_worker_state,
    check_header,
    validate_rank_state,
    validate_worker_state,
)
from .streams import Stream, build_stream
from .tasks import ChunkTask, remaining_tasks

log = logging.getLogger(__name__)

DEFAULT_SHUFFLE_BUFFER_ROWS = 1 << 18
DEFAULT_CHUNK_ROWS = 1 << 16


@dataclass
class Chunk:
    """Converted rows [start, stop) of one worker's stream, sent from a worker to the main process."""

    worker: int
    start: int
    stop: int
    columns: dict[str, Any]


def default_topology(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world_size): the given values, else torch.distributed's when initialized, else (0, 1)."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        initialized = dist.is_available() and dist.is_initialized()
        if rank is None:
            rank = dist.get_rank() if initialized else 0
        if world_size is None:
            world_size = dist.get_world_size() if initialized else 1
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size): got rank={rank}, world_size={world_size}")
    return rank, world_size


class StructuredDataset(IterableDataset):
    """Parquet or ORC files as a stream of batches (dicts of tensors) with exact resume.

    Use ``StructuredDataset.create_dataloader(...)`` for the fast loader. The dataset
    is also an ``IterableDataset`` of batches for torchdata's ``StatefulDataLoader``
    (``batch_size=None``, ``num_workers`` equal to the dataset's) or direct iteration.
    """

    def __init__(
        self,
        path: str | Sequence[str],
        format: str | None = "parquet",
        *,
        batch_size: int = 1024,
        num_workers: int = 2,
        shuffle: bool = False,
        shuffle_seed: int = 0,
        columns: Sequence[str] | None = None,
        split_bytes: int = DEFAULT_SPLIT_BYTES,
        rank: int | None = None,
        world_size: int | None = None,
        storage_options: dict | None = None,
        drop_last: bool = False,
        shuffle_buffer_rows: int = DEFAULT_SHUFFLE_BUFFER_ROWS,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if shuffle_seed < 0:
            raise ValueError(f"shuffle_seed must be >= 0, got {shuffle_seed}")
        if shuffle_buffer_rows < 1:
            raise ValueError(f"shuffle_buffer_rows must be >= 1, got {shuffle_buffer_rows}")
        self.rank, self.world_size = default_topology(rank, world_size)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.shuffle = shuffle
        self.shuffle_seed = shuffle_seed
        self.columns = list(columns) if columns is not None else None
        self.drop_last = drop_last
        self.shuffle_buffer_rows = shuffle_buffer_rows
        self.chunk_rows = batch_size * max(1, chunk_rows // batch_size)
        self._catalog: Catalog = build_catalog(path, format, storage_options, split_bytes)
        self._epoch = 0
        self._positions = [0] * self.logical_workers
        self._next_worker = 0
        self._pass_done = False
        self._epoch_cell = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._streams: tuple[int, list[Stream]] | None = None
        self._reader: StreamReader | None = None

    # ----------------------------------------------------------- public API
    @classmethod
    def create_dataloader(cls, path: str | Sequence[str], format: str | None = "parquet", **kwargs: Any):
        """Build the dataset and its loader; returns ``(loader, dataset)``.

        Takes the dataset's arguments plus the DataLoader's ``pin_memory``,
        ``prefetch_factor``, ``persistent_workers``, ``timeout`` and
        ``multiprocessing_context``.
        """
        from .loader import StructuredDataLoader

        loader_keys = ("pin_memory", "prefetch_factor", "persistent_workers", "timeout", "multiprocessing_context")
        loader_kwargs = {k: kwargs.pop(k) for k in loader_keys if k in kwargs}
        dataset = cls(path, format, **kwargs)
        return StructuredDataLoader(dataset, **loader_kwargs), dataset

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def logical_workers(self) -> int:
        """Streams per rank: num_workers, or 1 when reading in the main process."""
        return max(1, self.num_workers)

    @property
    def splits(self):
        """The planned splits (all ranks), in file order."""
        return list(self._catalog.splits)

    @property
    def files(self) -> list[str]:
        return [f.url for f in self._catalog.files]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to read. The epoch just restored by load_state_dict keeps its progress."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self._epoch:
            self._epoch = epoch
            self._reset_progress()
        self._epoch_cell[0] = epoch

    def __len__(self) -> int:
        """Rows this rank delivers in the current epoch."""
        return sum(self._lengths(self._epoch))

    def num_batches(self) -> int:
        """Batches this rank delivers in the current epoch."""
        size = self.batch_size
        return sum(-(-n // size) for n in self._lengths(self._epoch))

    def state_dict(self) -> dict:
        """JSON-serializable progress: a rank state in the main process, a worker state inside a worker."""
        info = get_worker_info()
        if info is not None:
            return build_worker_state(self._config(), self._catalog.files_digest, self._epoch, info.id, self._positions[info.id])
        state = build_rank_state(
            self._config(),
            self._catalog.fingerprint,
            self._epoch,
            self._positions,
            self._next_worker,
            self._streams_for(self._epoch),
            self._catalog.splits,
        )
        state["rows_total"] = self._lengths(self._epoch)  # per worker; lets `tdu inspect` report rows remaining
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore progress; raises CheckpointMismatchError when it cannot resume exactly."""
        if check_header(state) == "worker":
            epoch, worker, position = validate_worker_state(state, self._config(), self._catalog.files_digest, self.logical_workers)
            if position > self._lengths(epoch)[worker]:
                from .state import mismatch

                raise mismatch(
                    f"Checkpoint state of worker {worker} is out of range.",
                    [],
                    [f"rows_delivered={position} but the worker has {self._lengths(epoch)[worker]} rows in epoch {epoch}"],
                )
            if epoch != self._epoch:
                self._epoch = epoch
                self._reset_progress()
            self._positions[worker] = position
            self._pass_done = False
            return
        epoch, positions, next_worker = validate_rank_state(
            state, self._config(), self._catalog.fingerprint, self._streams_for, self._lengths, self._catalog.splits
        )
        self._epoch, self._positions, self._next_worker = epoch, positions, next_worker
        self._epoch_cell[0] = epoch
        self._pass_done = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        if info is None:
            tasks = self.begin_pass(keep_slots=False)
            return self.deliver(tasks, (self.read_chunk(task) for task in tasks))
        return self._iter_worker(info.id, info.num_workers)

    # ------------------------------------------------- used by the loader
    def begin_pass(self, keep_slots: bool) -> list[ChunkTask]:
        """Start (or continue) the epoch: the chunk tasks still to deliver, in order.

        A pass that ran to the end in this process starts the epoch again; an epoch
        restored as complete by load_state_dict delivers nothing more.
        """
        lengths = self._lengths(self._epoch)
        if self._pass_done and all(p >= n for p, n in zip(self._positions, lengths)):
            self._reset_progress()
        self._pass_done = False
        return remaining_tasks(self._epoch, self._positions, lengths, self._next_worker, self.chunk_rows, keep_slots)

    def read_chunk(self, task: ChunkTask) -> Chunk:
        """Read and convert one chunk (in whatever process runs it)."""
        if self._reader is None:
            self._reader = StreamReader(self._catalog, self.columns, use_threads=get_worker_info() is None)
        stream = self._streams_for(task.epoch)[task.worker]
        if task.stop <= task.start:
            return Chunk(task.worker, task.start, task.stop, {})
        table = self._reader.read(stream, task.start, task.stop)
        where = f"rows [{task.start}, {task.stop}) of worker {task.worker}'s stream (epoch {task.epoch})"
        return Chunk(task.worker, task.start, task.stop, table_to_columns(table, where))

    def deliver(self, tasks: Sequence[ChunkTask], chunks: Iterable[Chunk]) -> Iterator[dict[str, Any]]:
        """Slice chunks into batches and count each batch as delivered just before yielding it."""
        size = self.batch_size
        following = self._following_workers(tasks)
        for index, chunk in enumerate(chunks):
            if chunk.stop <= chunk.start:
                continue
            if chunk.start != self._positions[chunk.worker]:
                raise RuntimeError(
                    f"internal error: chunk of worker {chunk.worker} starts at row {chunk.start} "
                    f"but {self._positions[chunk.worker]} rows were delivered"
                )
            self._next_worker = chunk.worker
            rows = chunk.stop - chunk.start
            for offset in range(0, rows, size):
                stop = min(offset + size, rows)
                batch = slice_columns(chunk.columns, offset, stop)
                self._positions[chunk.worker] += stop - offset
                if stop == rows:
                    self._next_worker = following[index]
                yield batch
        self._pass_done = True

    # ------------------------------------------------------------ internals
    def _iter_worker(self, worker: int, num_workers: int) -> Iterator[dict[str, Any]]:
        if num_workers != self.logical_workers:
            raise ValueError(
                f"this dataset was planned for num_workers={self.num_workers} but runs in a DataLoader with "
                f"{num_workers} workers; create it with num_workers={num_workers}"
            )
        epoch = int(self._epoch_cell[0])
        if epoch != self._epoch:
            self._epoch = epoch
            self._reset_progress()
        length = self._lengths(epoch)[worker]
        if self._pass_done and self._positions[worker] >= length:
            self._positions[worker] = 0
        self._pass_done = False
        size = self.batch_size
        while self._positions[worker] < length:
            start = self._positions[worker]
            chunk = self.read_chunk(ChunkTask(epoch, worker, start, min(length, start + self.chunk_rows)))
            rows = chunk.stop - chunk.start
            for offset in range(0, rows, size):
                stop = min(offset + size, rows)
                batch = slice_columns(chunk.columns, offset, stop)
                self._positions[worker] = start + stop
                yield batch
        self._pass_done = True

    def _following_workers(self, tasks: Sequence[ChunkTask]) -> list[int]:
        following, upcoming = [0] * len(tasks), 0
        for i in range(len(tasks) - 1, -1, -1):
            following[i] = upcoming
            if tasks[i].stop > tasks[i].start:
                upcoming = tasks[i].worker
        return following

    def _reset_progress(self) -> None:
        self._positions = [0] * self.logical_workers
        self._next_worker = 0
        self._pass_done = False

    def _config(self) -> dict:
        return {
            "_num_workers": self.num_workers,
            "_shuffle": self.shuffle,
            "_shuffle_seed": self.shuffle_seed,
            "_world_size": self.world_size,
            "_rank": self.rank,
            "_split_bytes": self._catalog.split_bytes,
            "_drop_last": self.drop_last,
        }

    def _streams_for(self, epoch: int) -> list[Stream]:
        if self._streams is None or self._streams[0] != epoch:
            catalog = self._catalog
            order = epoch_order(len(catalog.splits), self.shuffle, self.shuffle_seed, epoch)
            assignment = assign_splits(order, self.rank, self.world_size, self.num_workers)
            streams = [
                build_stream(
                    (self.shuffle_seed, epoch, self.rank, worker),
                    splits,
                    catalog.split_rows,
                    catalog.file_offsets,
                    self.shuffle,
                    self.shuffle_buffer_rows,
                )
                for worker, splits in enumerate(assignment)
            ]
            self._streams = (epoch, streams)
        return self._streams[1]

    def _lengths(self, epoch: int) -> list[int]:
        rows = [stream.num_rows for stream in self._streams_for(epoch)]
        if self.drop_last:
            rows = [n - n % self.batch_size for n in rows]
        return rows

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_reader"] = None
        return state
