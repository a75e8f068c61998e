"""The main process's side of moving chunks through workers' shared buffers (``transfer.py``):
mapping a worker's buffer when its first chunk comes, building each chunk's tensors as views of
it, and posting the buffer's release once the last view is gone (``ReleaseBoard``), for the
sampler to carry to the workers on the next tasks.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
import weakref
from typing import Any, ClassVar, NamedTuple

import torch

from .packing import packed_views
from .transfer_files import Inherited, InheritedFiles

# madvise(MADV_POPULATE_READ) (Linux 5.14+): the page-table entries of the bytes a chunk came in
# are filled when it is received (in the thread that takes chunks in, host_feed.py), at once, not
# one fault at a time as the training loop first reads each batch. Only the written part: a read
# fault on an unwritten page of shared memory would allocate it.
MADV_POPULATE_READ = 22

Handle = Any  # how the main process maps a buffer: Inherited, a multiprocessing DupFd, or None (mapped already)


class Release(NamedTuple):
    """Buffer ``buffer`` of worker pool ``pool`` is free again after its use number ``use``."""

    pool: str
    buffer: int
    use: int


class ReleaseBoard:
    """Main-process side: collects releases of received buffers and hands them to the sampler.

    Each release is attached to the next ``spread`` tasks (the DataLoader deals tasks round
    robin, so every worker sees it once ``spread`` >= num_workers), then dropped.
    """

    _boards: ClassVar[weakref.WeakValueDictionary[int, ReleaseBoard]] = weakref.WeakValueDictionary()
    _ids = itertools.count()

    def __init__(self, spread: int):
        self.id = next(self._ids)
        self.spread = max(1, spread)
        self._lock = threading.Lock()
        self._pending: dict[Release, int] = {}  # release -> tasks it still rides on
        self._mappings: dict[tuple[str, int], mmap.mmap] = {}  # (pool, buffer) -> this process's mapping
        self._populated: dict[tuple[str, int], int] = {}  # (pool, buffer) -> bytes whose page-table entries are filled
        self._can_populate = hasattr(mmap.mmap, "madvise")
        self.received = 0  # chunks received through shared buffers
        self.recycled = 0  # ... of which in a buffer used before
        self.mapped = {"inherited": 0, "sent": 0}  # buffers mapped, by how their file came
        self._boards[self.id] = self

    @classmethod
    def find(cls, board: int) -> ReleaseBoard | None:
        """The live board with id ``board`` (None once its loader is gone)."""
        return cls._boards.get(board)

    def post(self, release: Release) -> None:
        """A received buffer is free again: tell the workers with the next tasks."""
        with self._lock:
            self._pending[release] = self.spread

    def take(self) -> tuple[Release, ...]:
        """The releases for the next task."""
        with self._lock:
            if not self._pending:
                return ()
            out = tuple(self._pending)
            for release in out:
                left = self._pending[release] - 1
                if left:
                    self._pending[release] = left
                else:
                    del self._pending[release]
            return out

    def clear(self) -> None:
        """Forget everything about the current workers (they are gone or about to be)."""
        with self._lock:
            self._pending.clear()
        self.forget_mappings()

    def forget_mappings(self) -> None:
        """Drop the mappings of buffers of workers that are gone (mapped chunks keep their own)."""
        with self._lock:
            self._mappings.clear()
            self._populated.clear()

    def mapping(self, release: Release, handle: Handle, capacity: int, retired: tuple[int, ...], size: int = 0) -> mmap.mmap:
        """The buffer of ``release``, mapped when its first chunk comes (once per buffer), then kept;
        its first ``size`` bytes have their page-table entries filled."""
        with self._lock:
            for number in retired:
                self._mappings.pop((release.pool, number), None)
                self._populated.pop((release.pool, number), None)
            key = (release.pool, release.buffer)
            if handle is not None:
                descriptor = _descriptor(handle)
                self.mapped["inherited" if isinstance(handle, Inherited) else "sent"] += 1
                try:
                    self._mappings[key] = mmap.mmap(descriptor, capacity)
                    self._populated[key] = 0
                finally:
                    os.close(descriptor)
            memory = self._mappings.get(key)
            if memory is not None and size > self._populated.get(key, 0):
                self._populate(memory, key, size)
        if memory is None:
            raise RuntimeError(f"internal error: a chunk came in buffer {key} of a worker, which this process has not mapped")
        return memory

    def _populate(self, memory: mmap.mmap, key: tuple[str, int], size: int) -> None:
        """Fill the page-table entries of ``memory``'s bytes up to ``size`` not filled before."""
        if not self._can_populate:
            return
        start = self._populated.get(key, 0) // mmap.PAGESIZE * mmap.PAGESIZE
        try:
            memory.madvise(MADV_POPULATE_READ, start, min(len(memory), size) - start)
        except OSError:  # a kernel before 5.14: pages fault in as they are read
            self._can_populate = False
            return
        self._populated[key] = size


def _descriptor(handle: Handle) -> int:
    """A descriptor of a buffer's file, owned by the caller."""
    if not isinstance(handle, Inherited):
        return handle.detach()
    files = InheritedFiles.find(handle.files)
    fd = files.take(handle.worker, handle.index) if files is not None else None
    if fd is None:
        raise RuntimeError(f"internal error: a chunk came in file {handle}, which is closed or was mapped already")
    return fd


def receive(
    layout: dict[str, Any], handle: Handle, capacity: int, size: int, release: Release, board: int, retired: tuple[int, ...]
) -> dict[str, Any]:
    """Unpickling a packed chunk in the main process: the columns as views of the worker's buffer."""
    owner = ReleaseBoard.find(board)
    if owner is None:
        raise RuntimeError("internal error: a chunk arrived for a loader that no longer exists")
    if isinstance(handle, Inherited) and InheritedFiles.find(handle.files) is None:
        # Its pass has ended (the files go with it), but a traceback kept torch's iterator, whose
        # pin-memory thread still takes chunks off the queue: nothing will read this one.
        return {}
    view = memoryview(owner.mapping(release, handle, capacity, retired, size))[:size]
    owner.received += 1
    owner.recycled += release.use > 1
    # The tensors below hold `view`; when the last of them is gone, the buffer may be reused.
    weakref.finalize(view, owner.post, release).atexit = False
    columns = packed_views(layout, torch.frombuffer(view, dtype=torch.uint8))
    del view
    return columns
