"""Taking chunks in and cutting them into batches ahead of the training loop, in a thread of
the loop's process, so that the loop's own thread only takes finished batches.

Without it, the loop's thread pays for every chunk's arrival (torch's ``DataLoader.__next__``,
unpickling, mapping the worker's buffer: about 0.6 ms a chunk) and for cutting it into batch
views. Here a background thread does that for the next chunk while the loop trains on the
current one; the loop's thread takes the chunk's finished batches (``Chunk.prepared``).

A chunk with string columns is left uncut: the loop's thread builds each batch's Python strings
as it takes the batch, right before it reads them. Built here a chunk ahead, they would be cold
in the loop's caches by the time it reads them (reading them would cost the loop as much as
building them), and this thread would hold the GIL for them while the loop waits.

The first chunk of a pass is taken in the loop's thread, before the feed's thread starts: worker
processes fork when it is asked for, and forking from a process with one thread avoids the
hazards of forking a multi-threaded one. At most ``depth`` chunks wait finished beyond the one
the loop is on. A chunk whose slicing fails (a string that is not UTF-8) is handed over as it
came, and the loop meets the error at the batch that holds it, as without the feed.

Counting is unchanged: batches are cut ahead, and counted when the loop receives them.
"""

from __future__ import annotations

import collections
import queue
import threading
from typing import Callable, Iterable, Iterator

from ..read.chunks import Chunk
from ..read.convert import StringColumn
from . import background

_END = object()


def prepare(chunk: Chunk, size: int) -> Chunk:
    """The chunk with its batches of ``size`` rows cut (``prepared``), where that can be done ahead."""
    if chunk.prepared is not None or chunk.present is not None or chunk.ready is not None or chunk.num_read == 0:
        return chunk  # finished already; rows skipped (each batch's end depends on them); waits for a device copy; empty
    if any(isinstance(column, StringColumn) for column in chunk.columns.values()):
        return chunk  # its strings are built by the loop's thread, which reads them next
    try:
        batches = [batch for batch, _ in chunk.batches(size)]
    except Exception:  # noqa: BLE001 - the loop slices this chunk itself and meets the error at its batch
        return chunk
    return Chunk(chunk.lane, chunk.start, chunk.stop, {}, chunk.present, chunk.skipped, prepared=batches)


class HostFeed:
    """Receives and cuts the chunks of one pass in a background thread, ``depth`` chunks ahead of the loop."""

    def __init__(self, depth: int = 1):
        self.depth = depth
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def chunks(self, source: Iterable[Chunk], count: int, size: int, at_end: Callable[[], None] | None = None) -> Iterator[Chunk]:
        """The first ``count`` chunks of ``source``, cut into batches of ``size`` rows, in order; then
        ``source`` is run to its end in the thread (as the delivery does without the feed) and closed,
        the loop is told the pass ended, and ``at_end`` is called in the thread (not when the pass is
        abandoned or fails; a later ``chunks`` or ``close`` waits for it)."""
        self.close()
        source = iter(source)
        if count <= 0:
            yield from source
            return
        first = next(source)  # in this thread: where the workers fork
        stop = self._stop = threading.Event()
        ready: queue.SimpleQueue = queue.SimpleQueue()
        returned: queue.SimpleQueue = queue.SimpleQueue()  # one item per chunk the loop took: a chunk it is done with, or None
        for _ in range(self.depth):
            returned.put(None)
        self._thread = threading.Thread(target=_run, args=(source, count - 1, size, ready, returned, stop, at_end), name="tdu-host-feed", daemon=True)
        background.start(self._thread, stop)
        done: collections.deque[Chunk] = collections.deque([first])
        del first
        try:
            yield done[0]
            while True:
                item = ready.get()
                # The chunk before the one the loop just finished (the delivery still holds that one)
                # goes back to the thread, where it and its batches are freed.
                returned.put(done.popleft() if len(done) > 1 else None)
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                done.append(item)
                del item
                yield done[-1]
        finally:
            stop.set()

    def close(self, timeout: float | None = None) -> None:
        """Stop the thread of an earlier pass (it finishes the chunk it is waiting for)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout)
            self._thread = None


def _run(
    source: Iterator[Chunk],
    count: int,
    size: int,
    ready: queue.SimpleQueue,
    returned: queue.SimpleQueue,
    stop: threading.Event,
    at_end: Callable[[], None] | None,
) -> None:
    try:
        for _ in range(count):
            while True:  # a chunk the loop is done with (dropped here), or None, for every chunk it took
                try:
                    returned.get(timeout=0.1)
                    break
                except queue.Empty:
                    if stop.is_set():
                        return
            if stop.is_set():
                return
            ready.put(prepare(next(source), size))
        for _ in source:
            pass
        _close(source)
    except BaseException as error:  # noqa: BLE001 - handed to the loop, which raises it
        ready.put(error)
        return
    finally:
        _close(source)
    ready.put(_END)
    if at_end is not None:  # after the loop has its end: freeing the finished workers' buffers takes ~8 ms of kernel time
        at_end()


def _close(source: Iterator[Chunk]) -> None:
    close = getattr(source, "close", None)
    if close is not None:
        close()
