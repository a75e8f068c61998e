"""Moving converted chunks from worker processes to the main process through recycled shared memory.

Sending a tensor through torch's DataLoader queue copies it into fresh shared memory, and
every page of fresh memory costs a page fault (measured: ~5 ms per 4.4 MB chunk, about as
much as the copy is worth). Here a worker instead packs all tensors of a chunk into one
buffer of its own pool (an anonymous ``memfd``), and the main process maps that buffer and
builds the chunk's tensors as views of it. A buffer's descriptor crosses with its first chunk
only; the main process keeps the mapping until the worker names the buffer retired (or a pass
starts new workers). When the last of a chunk's views is gone, the main
process posts a release of (buffer, use); the release rides to the workers on the next tasks
the sampler hands out, and the owning worker reuses the buffer, whose pages are already
mapped. A buffer is written again only after its release for the same use arrived, so a
batch the training loop still holds is never overwritten; a release that never arrives
only costs a new buffer.

Linux only (``os.memfd_create``); elsewhere, and for chunks without tensor data, chunks
travel the plain way.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import threading
import uuid
import weakref
from dataclasses import dataclass
from multiprocessing.reduction import DupFd
from typing import Any, NamedTuple

import torch

from .convert import Joined, build_columns, leaves, replace_leaves, tensor_nbytes

log = logging.getLogger(__name__)

ALIGN = 64
MAX_POOLED_BUFFERS = 8  # per worker; in use at once: about prefetch_factor + 3
SUPPORTED = hasattr(os, "memfd_create")


class Release(NamedTuple):
    """Buffer ``buffer`` of worker pool ``pool`` is free again after its use number ``use``."""

    pool: str
    buffer: int
    use: int


class _Slot(NamedTuple):
    """Where a tensor sits in a packed buffer."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]


# ---------------------------------------------------------------- layout
def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _packed_size(columns: dict[str, Any]) -> int:
    return sum(_aligned(joined.nbytes) for value in columns.values() for joined in leaves(value, Joined))


def _write(columns: dict[str, Any], target: torch.Tensor) -> dict[str, Any]:
    """Write every ``Joined`` of ``columns`` into ``target`` (uint8); each becomes a slot."""
    offset = 0

    def place(joined: Joined) -> _Slot:
        nonlocal offset
        if joined.nbytes:
            joined.write(target[offset : offset + joined.nbytes].view(joined.dtype).view(joined.shape))
        slot = _Slot(offset, joined.dtype, joined.shape)
        offset += _aligned(joined.nbytes)
        return slot

    return {name: replace_leaves(value, Joined, place) for name, value in columns.items()}


def _read(layout: dict[str, Any], source: torch.Tensor) -> dict[str, Any]:
    """The columns of ``layout`` as views of ``source`` (uint8)."""

    def view(slot: _Slot) -> torch.Tensor:
        nbytes = tensor_nbytes(slot.dtype, slot.shape)
        return source[slot.offset : slot.offset + nbytes].view(slot.dtype).view(slot.shape)

    return {name: replace_leaves(value, _Slot, view) for name, value in layout.items()}


# ---------------------------------------------------------- worker side
@dataclass
class _Buffer:
    number: int
    fd: int
    memory: mmap.mmap
    use: int = 0
    free: bool = False
    mapped_by_main: bool = False  # its descriptor went out with an earlier chunk

    @property
    def capacity(self) -> int:
        return len(self.memory)

    def close(self) -> None:
        try:
            self.memory.close()
        except BufferError:  # still exported somewhere in this process: let garbage collection unmap it
            pass
        os.close(self.fd)


class WorkerPool:
    """A worker process's shared buffers. Created in the worker (one per process)."""

    def __init__(self) -> None:
        self.name = uuid.uuid4().hex
        self._buffers: dict[int, _Buffer] = {}
        self._numbers = itertools.count()
        self._retired: list[int] = []  # closed since the last chunk: the main process can unmap them
        self._warned = False

    def release(self, releases: tuple[Release, ...]) -> None:
        for release in releases:
            buffer = self._buffers.get(release.buffer) if release.pool == self.name else None
            if buffer is not None and buffer.use == release.use:
                buffer.free = True

    def pack(self, columns: dict[str, Any], board: int) -> Any:
        """``columns`` (from ``table_to_joined``) as a picklable object that becomes the built
        columns in the main process."""
        size = _packed_size(columns)
        if not size:
            return build_columns(columns, copy=False)  # pickled into torch's queue: copied there
        try:
            buffer = self._take(size)
        except OSError as error:  # out of file descriptors or memory for a new buffer: the plain way
            if not self._warned:
                self._warned = True
                log.warning("no shared buffer for a chunk (%s); sending chunks through torch's queue instead", error)
            return build_columns(columns, copy=False)
        target = torch.frombuffer(buffer.memory, dtype=torch.uint8, count=size)
        layout = _write(columns, target)
        del target  # no export of the mapping may outlive this call (the buffer may be closed later)
        fd = None if buffer.mapped_by_main else buffer.fd
        buffer.mapped_by_main = True
        retired, self._retired = tuple(self._retired), []
        return _PackedColumns(layout, fd, buffer.capacity, size, Release(self.name, buffer.number, buffer.use), board, retired)

    def _take(self, size: int) -> _Buffer:
        fitting = [b for b in self._buffers.values() if b.free and b.capacity >= size]
        if fitting:
            buffer = min(fitting, key=lambda b: b.capacity)
        else:
            buffer = self._new(size)
        buffer.free = False
        buffer.use += 1
        return buffer

    def _new(self, size: int) -> _Buffer:
        while len(self._buffers) >= MAX_POOLED_BUFFERS:
            # Prefer dropping a free buffer (too small); else the longest-held one. Closing our
            # mapping never harms the main process: its own mapping keeps the pages alive.
            victim = min(self._buffers.values(), key=lambda b: (not b.free, b.number))
            del self._buffers[victim.number]
            victim.close()
            self._retired.append(victim.number)
        capacity = -(-size * 5 // 4 // mmap.PAGESIZE) * mmap.PAGESIZE  # room for chunks a little larger
        fd = os.memfd_create("torch_dataloader_utils-chunk", os.MFD_CLOEXEC)
        os.ftruncate(fd, capacity)
        buffer = _Buffer(next(self._numbers), fd, mmap.mmap(fd, capacity))
        self._buffers[buffer.number] = buffer
        return buffer


_POOL: tuple[int, WorkerPool] | None = None


def worker_pool() -> WorkerPool:
    """This process's pool (a forked child gets its own, not its parent's)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), WorkerPool())
    return _POOL[1]


class _PackedColumns:
    """Pickles as the layout and which buffer holds it (with the buffer's file descriptor the
    first time); unpickles as columns."""

    def __init__(self, layout: dict[str, Any], fd: int | None, capacity: int, size: int, release: Release, board: int, retired: tuple[int, ...]):
        self.layout, self.fd, self.capacity, self.size = layout, fd, capacity, size
        self.release, self.board, self.retired = release, board, retired

    def __reduce__(self) -> tuple:
        fd = None if self.fd is None else DupFd(self.fd)
        return (_receive, (self.layout, fd, self.capacity, self.size, self.release, self.board, self.retired))


# ------------------------------------------------------------ main side
class ReleaseBoard:
    """Main-process side: collects releases of received buffers and hands them to the sampler.

    Each release is attached to the next ``spread`` tasks (the DataLoader deals tasks round
    robin, so every worker sees it once ``spread`` >= num_workers), then dropped.
    """

    _boards: weakref.WeakValueDictionary[int, ReleaseBoard] = weakref.WeakValueDictionary()
    _ids = itertools.count()

    def __init__(self, spread: int):
        self.id = next(self._ids)
        self.spread = max(1, spread)
        self._lock = threading.Lock()
        self._pending: dict[Release, int] = {}  # release -> tasks it still rides on
        self._mappings: dict[tuple[str, int], mmap.mmap] = {}  # (pool, buffer) -> this process's mapping
        self.received = 0  # chunks received through shared buffers
        self.recycled = 0  # ... of which in a buffer used before
        self._boards[self.id] = self

    @classmethod
    def find(cls, board: int) -> ReleaseBoard | None:
        return cls._boards.get(board)

    def post(self, release: Release) -> None:
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

    def mapping(self, release: Release, fd: DupFd | None, capacity: int, retired: tuple[int, ...]) -> mmap.mmap:
        """The buffer of ``release``, mapped when its descriptor comes (once per buffer), then kept."""
        with self._lock:
            for number in retired:
                self._mappings.pop((release.pool, number), None)
            key = (release.pool, release.buffer)
            if fd is not None:
                descriptor = fd.detach()
                try:
                    self._mappings[key] = mmap.mmap(descriptor, capacity)
                finally:
                    os.close(descriptor)
            memory = self._mappings.get(key)
        if memory is None:
            raise RuntimeError(f"internal error: a chunk came in buffer {key} of a worker, which this process has not mapped")
        return memory


def _receive(layout: dict[str, Any], fd: DupFd | None, capacity: int, size: int, release: Release, board: int, retired: tuple[int, ...]) -> dict[str, Any]:
    """Unpickling in the main process: the columns as views of the worker's buffer."""
    owner = ReleaseBoard.find(board)
    if owner is None:
        raise RuntimeError("internal error: a chunk arrived for a loader that no longer exists")
    view = memoryview(owner.mapping(release, fd, capacity, retired))[:size]
    owner.received += 1
    owner.recycled += release.use > 1
    # The tensors below hold `view`; when the last of them is gone, the buffer may be reused.
    weakref.finalize(view, owner.post, release).atexit = False
    columns = _read(layout, torch.frombuffer(view, dtype=torch.uint8))
    del view
    return columns
