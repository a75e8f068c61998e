"""The loader: a torch DataLoader over chunk tasks, sliced into batches in the main process.

Workers read and convert whole chunks (many batches) so that one transfer
between processes carries many batches; the main process slices them into
batches (views) and counts each batch as delivered when the loop receives it.
The order of tasks comes from the dataset's progress at the start of every
pass, which is how a resumed run continues exactly where the saved one was.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import sys
from typing import TYPE_CHECKING, Any, Iterator, cast

from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from ..plan.schedule import ChunkTask
from ..read.chunks import Chunk, ChunkReader
from . import transfer
from .device_feed import DeviceFeed, check_device
from .host_feed import HostFeed
from .local_buffers import LocalBuffers, read_into
from .packing import buffer_scale
from .stats import LoaderStats
from .thread_reader import ThreadedChunks
from .worker_stream import check_picklable

if TYPE_CHECKING:
    from ..dataset import StructuredDataset

_Index = tuple[ChunkTask, tuple[transfer.Release, ...]]  # task, buffer releases


class _ChunkSource(Dataset):
    """Map-style view of a chunk reader whose indices are chunk tasks (with buffer releases).

    In a worker process the chunk's tensors are packed into one of the worker's recycled
    shared buffers (transfer.py); in the main process they are used as they are.
    """

    def __init__(self, reader: ChunkReader, board: int | None):
        self.reader = reader
        self.board = board
        self.files: transfer.InheritedFiles | None = None  # for the workers forked next
        self._pickle_checked = False  # (per worker process)
        self._buffers: LocalBuffers | None = None  # chunks read in this process (num_workers=0)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_buffers": None}

    def __getitem__(self, index: _Index) -> Chunk:
        task, releases = index
        worker = get_worker_info()
        if worker is None:  # num_workers=0
            if self._buffers is None:
                self._buffers = LocalBuffers()
            return read_into(self.reader, self._buffers, task)
        if self.board is None:
            return self.reader.read(task)
        pool = transfer.worker_pool(self.files, worker.id)
        pool.release(releases)
        chunk = self.reader.read(task, joined=True)
        chunk.columns = pool.pack(chunk.columns, self.board, scale=buffer_scale(self.reader.chunk_rows, task.stop - task.start))
        if not self._pickle_checked:  # the first chunk of a worker: an output format's or a transform's values are alike
            self._pickle_checked = True
            check_picklable(chunk, self.reader, task)
        return chunk

    def __len__(self) -> int:
        return 0


class _TaskSampler(Sampler):
    """Yields the task list set just before each pass, each task with the buffer releases
    posted since (the DataLoader asks for the next task only when it dispatches one)."""

    def __init__(self, board: transfer.ReleaseBoard | None) -> None:
        self.tasks: list[ChunkTask] = []
        self.board = board

    def __iter__(self) -> Iterator[_Index]:
        for task in self.tasks:
            yield task, self.board.take() if self.board else ()

    def __len__(self) -> int:
        return len(self.tasks)


def _identity(chunk: Chunk) -> Chunk:
    return chunk


def _preload_worker_imports() -> None:
    """pyarrow imports pandas (when it is installed) at its first numpy conversion. Doing that
    once here means forked workers inherit it instead of each paying about a second for it
    before their first chunk (every epoch, unless workers are persistent)."""
    import numpy as np
    import pyarrow as pa

    pa.array(np.zeros(1))


WORKER_MODES = ("process", "thread")
PR_SET_THP_DISABLE = 41  # linux/prctl.h
WORKER_SWITCH_INTERVAL_S = 0.0005  # sys.setswitchinterval in worker processes (Python's default: 0.005)


class _WorkerStart:
    """The ``worker_init_fn``: runs first in every worker process.

    - No transparent huge pages for the worker (Linux). pyarrow's allocator asks for huge pages;
      with the kernel's usual ``defrag=madvise`` a fault in such a region compacts and zeroes
      2 MiB at once, and the workers' many short-lived decode buffers would pay that over and over.
    - A shorter GIL switch interval (``WORKER_SWITCH_INTERVAL_S``). A finished chunk is pickled into
      torch's queue by the queue's feeder thread, which otherwise waits for the GIL while the worker
      goes on with the next chunk, up to the default 5 ms, before the main process can see the chunk.
    - A forked worker whose process is already gone exits. torch's worker notices its parent's
      death by comparing ``os.getppid()`` with the parent pid it reads only after this function,
      so a worker whose process died (``kill -9``, ``os._exit``) while it started would wait
      forever, and its inherited stdout would keep a launcher such as torchrun's caller waiting too.
    """

    def __init__(self, parent: int | None):
        self.parent = parent  # the loader's process when workers are forked from it, else None

    def __call__(self, worker_id: int) -> None:
        if self.parent is not None and os.getppid() != self.parent:
            os._exit(0)
        sys.setswitchinterval(WORKER_SWITCH_INTERVAL_S)
        if not sys.platform.startswith("linux"):
            return
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)
        except (AttributeError, OSError):  # no prctl here: keep the kernel's default
            pass


def _forks(context: Any) -> bool:
    """Whether DataLoader workers start by fork (then their parent is this process)."""
    if context is None:  # the default, read without fixing it
        return (multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]) == "fork"
    return (context if isinstance(context, str) else context.get_start_method()) == "fork"


class StructuredDataLoader:
    """Iterates a StructuredDataset's batches for the current epoch with exact progress tracking."""

    def __init__(
        self,
        dataset: StructuredDataset,
        *,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        timeout: float = 0,
        multiprocessing_context: Any = None,
        device: Any = None,
        worker_mode: str = "process",
    ):
        if worker_mode not in WORKER_MODES:
            raise ValueError(f"worker_mode must be one of {WORKER_MODES}, got {worker_mode!r}")
        self.worker_mode = worker_mode
        """Where the num_workers readers run: DataLoader worker processes, or threads of this process."""
        self.device = check_device(device)
        """Where batches arrive: None for host memory, else the CUDA device they are copied to."""
        self._feed = DeviceFeed(self.device) if self.device is not None else None
        self._ahead = HostFeed() if self.device is None and dataset.num_workers else None
        """Takes chunks in and cuts them into batches in a thread of this process (host_feed.py); None: the loop's thread does."""
        self.dataset = dataset
        """The StructuredDataset this loader reads (state_dict, load_state_dict and set_epoch are its)."""
        self.stats = LoaderStats()
        """Delivery statistics (batches, rows, time waiting for data), separate from the checkpoint state."""
        self._threads: ThreadedChunks | None = None
        workers = dataset.num_workers
        self._generation = dataset.delivery.reader.generation  # the plan the workers or threads read
        if worker_mode == "thread" and workers:
            self._thread_options: dict[str, Any] = dict(threads=workers, ahead=prefetch_factor or 2, pin_memory=pin_memory)
            self._threads = ThreadedChunks(dataset.delivery.reader, **self._thread_options)
            workers = 0  # the DataLoader below stays unused
        self._forks = workers > 0 and _forks(multiprocessing_context)
        self._board = transfer.ReleaseBoard(spread=2 * workers) if workers and transfer.SUPPORTED else None
        self._sampler = _TaskSampler(self._board)
        if workers:
            _preload_worker_imports()
        self._loader_kwargs: dict[str, Any] = dict(
            batch_size=None,
            sampler=self._sampler,
            num_workers=workers,
            collate_fn=_identity,
            pin_memory=pin_memory,
            prefetch_factor=prefetch_factor if workers else None,
            persistent_workers=persistent_workers and workers > 0,
            timeout=timeout,
            multiprocessing_context=multiprocessing_context if workers else None,
            worker_init_fn=_WorkerStart(os.getpid() if self._forks else None) if workers else None,
        )
        self._loader = DataLoader(self._source(), **self._loader_kwargs)

    def _chunk_source(self) -> _ChunkSource:
        return cast(_ChunkSource, self._loader.dataset)

    def _source(self) -> _ChunkSource:
        if self._board is not None:
            self._board.clear()  # releases meant for workers that are gone
        self._workers_started = False
        return _ChunkSource(self.dataset.delivery.reader, self._board.id if self._board else None)

    @property
    def batch_size(self) -> int:
        """Rows per batch (the dataset's ``batch_size``)."""
        return self.dataset.batch_size

    @property
    def num_workers(self) -> int:
        """Reader workers (the dataset's ``num_workers``)."""
        return self.dataset.num_workers

    def __len__(self) -> int:
        """Batches this rank delivers in the current epoch."""
        return self.dataset.num_batches()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """One pass over the current epoch from where the dataset's progress stands (a fresh
        epoch, or the point a loaded state restored); a batch counts as delivered when yielded."""
        if self._board is not None and not self._loader_kwargs["persistent_workers"]:
            self._board.forget_mappings()  # this pass starts new workers with new buffers
        delivery = self.dataset.delivery
        self._follow_replan()
        tasks = delivery.begin_pass(keep_slots=self.dataset.num_workers > 0, warn_if_nothing_restored=True)
        self._sampler.tasks = tasks
        chunks = self._chunks() if self._threads is None else self._threads.chunks(tasks)
        if self._feed is not None:
            chunks = self._feed.chunks(chunks, len(tasks))
        elif self._ahead is not None:
            # a finished pass's workers are gone: their buffers are unmapped in the feed's thread, not at the next iter()
            unmap = self._board.forget_mappings if self._board is not None and not self._loader_kwargs["persistent_workers"] else None
            chunks = self._ahead.chunks(chunks, len(tasks), delivery.plan().batching.batch_size, at_end=unmap)
        return delivery.deliver(tasks, chunks, self.stats)

    def _follow_replan(self) -> None:
        """After the dataset re-planned (a table's other snapshot), readers that hold a copy of the old
        plan are replaced: reader threads, and persistent workers (others start anew with each pass)."""
        reader = self.dataset.delivery.reader
        if reader.generation == self._generation:
            return
        self._generation = reader.generation
        if self._threads is not None:
            self._threads.close()
            self._threads = ThreadedChunks(reader, **self._thread_options)
        elif self._loader_kwargs["num_workers"]:
            self._loader = DataLoader(self._source(), **self._loader_kwargs)

    def _new_workers_files(self) -> transfer.InheritedFiles | None:
        """Files for the buffers of the workers the next ``iter()`` forks (None when it forks
        none: persistent workers already running, or workers that are spawned)."""
        if self._board is None or not self._forks or self._workers_started:
            return None
        self._workers_started = self._loader_kwargs["persistent_workers"]
        files = transfer.InheritedFiles(self.dataset.num_workers)
        self._chunk_source().files = files
        return files

    def _chunks(self) -> Iterator[Chunk]:
        """The torch DataLoader's chunks; a dead worker becomes one clear error, and the
        next pass starts new worker processes (persistent ones included, after any error:
        torch's persistent iterator does not recover from a timeout or a worker's exception)."""
        chunks = None
        files = self._new_workers_files()  # held while this pass's workers may send chunks
        try:
            try:
                chunks = iter(self._loader)  # forks the workers (they copy the files)
            finally:
                if not self._loader_kwargs["persistent_workers"]:
                    self._chunk_source().files = None  # this pass holds them: they close when it ends
            yield from chunks
        except (KeyboardInterrupt, SystemExit):
            # Interrupted inside torch's iterator (Ctrl-C, a signal handler's exception): a persistent
            # one is left half-reset and fails the next pass (KeyError: _ResumeIteration), so the next
            # pass starts new workers.
            if self._loader_kwargs["persistent_workers"]:
                chunks = None
                self._loader = DataLoader(self._source(), **self._loader_kwargs)
            raise
        except Exception as error:  # noqa: BLE001 - re-raised below
            if not self.dataset.num_workers:
                raise
            # Drop every reference to torch's iterator now, so that its worker processes shut down
            # here and not in some later garbage collection: the traceback pins its frames too.
            # (An error raised in a worker carries the worker's traceback in its message.)
            chunks = None
            _drop_tracebacks(error)
            death = _is_worker_death(error)
            if death or self._loader_kwargs["persistent_workers"]:
                self._loader = DataLoader(self._source(), **self._loader_kwargs)
            if not death:
                raise error
            raise RuntimeError(
                f"a DataLoader worker process died ({type(error).__name__}: {error}); was it killed or out of memory? "
                "dataset.state_dict() still counts exactly the batches you received: iterate the loader "
                "again to continue, or resume from your last checkpoint"
            ) from error
        finally:
            chunks = None  # torch's iterator first (its workers shut down), then the files they sent chunks in
            del files


def _drop_tracebacks(error: BaseException | None) -> None:
    """Clear the tracebacks of ``error`` and the exceptions it chains: torch's own errors chain
    ones raised inside its iterator, whose frames would keep the iterator, and so its workers,
    alive as long as the error is kept."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        error.__traceback__ = None
        error = error.__cause__ or error.__context__


def _is_worker_death(error: BaseException) -> bool:
    if isinstance(error, (ConnectionError, EOFError)):
        return True
    return "exited unexpectedly" in str(error)
