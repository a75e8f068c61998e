"""Reading in threads of the loop's own process (``worker_mode="thread"``).

pyarrow releases the GIL while it decodes, so Parquet and ORC decoding needs no separate
process: W threads take the place of W worker processes, each reading the tasks a worker would
(task i goes to thread i % W, as the DataLoader deals them to processes), and the chunks arrive
in task order. Nothing crosses a process boundary, so the loop receives memory its own process
wrote, without shared-memory transfer. The plan, the order and the state are the same as with
processes: a state saved in one mode resumes exactly in the other.
"""

from __future__ import annotations

import copy
import threading
import warnings
from concurrent.futures import Future
from typing import Iterator, Sequence

from ..plan.schedule import ChunkTask
from ..read.chunks import Chunk, ChunkReader
from . import background
from .local_buffers import LocalBuffers, read_into

_TAKEN: Future = Future()


class ThreadedChunks:
    """Reads the chunk tasks of a pass in ``threads`` threads, each up to ``ahead`` chunks ahead of the loop."""

    def __init__(self, reader: ChunkReader, threads: int, ahead: int = 2, pin_memory: bool = False):
        self._readers = [_own_reader(reader) for _ in range(threads)]
        self._buffers = LocalBuffers()
        self._ahead = ahead
        self._pin = pin_memory and _can_pin()
        self._stop: threading.Event | None = None
        self._threads: list[threading.Thread] = []

    def chunks(self, tasks: Sequence[ChunkTask]) -> Iterator[Chunk]:
        """The chunks of ``tasks``, in order."""
        self.close()
        stop = threading.Event()
        results: list[Future] = [Future() for _ in tasks]
        count = len(self._readers)
        permits = [threading.Semaphore(self._ahead) for _ in range(count)]
        self._stop = stop
        shares = [(self._readers[w], self._buffers, tasks, results, w, count, permits[w], stop, self._pin) for w in range(count)]
        self._threads = [threading.Thread(target=_read_share, args=share, name=f"tdu-reader-{w}", daemon=True) for w, share in enumerate(shares)]
        for thread in self._threads:
            background.start(thread, stop)
        try:
            for index in range(len(results)):
                chunk = results[index].result()
                results[index] = _TAKEN  # the pass's list must not keep every chunk of the epoch alive
                permits[index % count].release()
                yield chunk
                del chunk
        finally:
            stop.set()

    def close(self, timeout: float | None = None) -> None:
        """Stop the threads of an earlier pass (each finishes the chunk it is reading)."""
        if self._stop is not None:
            self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
        self._threads = []


def _can_pin() -> bool:
    """Whether pinned memory is there to use; without an accelerator pin_memory=True is ignored
    with the DataLoader's own warning, as worker processes do."""
    import torch

    if torch.accelerator.is_available():
        return True
    warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then device pinned memory won't be used.", stacklevel=3)
    return False


def _own_reader(reader: ChunkReader) -> ChunkReader:
    """A reader of the same plan with its own open files and decoder state (readers keep the
    current window of each stream, so threads must not share one)."""
    own = copy.copy(reader)
    own.use_threads = False  # the threads are the parallelism; pyarrow's own pool would oversubscribe the cores
    own.reset()
    return own


def _read_share(
    reader: ChunkReader,
    buffers: LocalBuffers,
    tasks: Sequence[ChunkTask],
    results: list[Future],
    first: int,
    step: int,
    permit: threading.Semaphore,
    stop: threading.Event,
    pin: bool,
) -> None:
    """Read tasks first, first + step, ... into their futures, at most the permit's count ahead."""
    for index in range(first, len(tasks), step):
        while not permit.acquire(timeout=0.1):
            if stop.is_set():
                return
        if stop.is_set():
            return
        try:
            chunk = read_into(reader, buffers, tasks[index])
            results[index].set_result(chunk.pin_memory() if pin else chunk)
        except BaseException as error:  # noqa: BLE001 - raised in the loop when it reaches this chunk
            results[index].set_exception(error)
            return

