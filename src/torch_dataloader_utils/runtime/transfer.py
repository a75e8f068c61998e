"""Moving converted chunks from worker processes to the main process through recycled shared
memory; this module is the workers' side (their buffer pools), ``transfer_receive.py`` the main
process's and ``transfer_files.py`` the shared-memory files both map.

Sending a tensor through torch's DataLoader queue copies it into fresh shared memory, and every
page of fresh memory costs a page fault, about as much as the copy itself. Here a worker instead
packs all tensors of a chunk into one buffer of its own pool (an anonymous ``memfd``), and the
main process maps that buffer and builds the chunk's tensors as views of it. The main process
maps a buffer when its first chunk comes and keeps the mapping until the worker names the buffer
retired (or a pass starts new workers). When the last of a chunk's views is gone, the main
process posts a release of (buffer, use); the release rides to the workers on the next tasks the
sampler hands out, and the owning worker reuses the buffer, whose pages are already mapped. A
buffer is written again only after its release for the same use arrived, so a batch the
training loop still holds is never overwritten; a release that never arrives only costs a new
buffer.

The main process gets a buffer's file one of two ways (``transfer_files.py``): with forked
workers it creates each worker's first files just before the fork, so both sides hold them and a
chunk names its file by number; otherwise (spawned workers, a worker's later buffers) the first
chunk carries the file descriptor, which costs the main process a round trip through
multiprocessing's resource sharer.

Linux only (``os.memfd_create``); elsewhere, and for chunks without tensor data, chunks
travel the plain way.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import uuid
from dataclasses import dataclass
from multiprocessing.reduction import DupFd
from typing import Any

import torch

from ..read.convert import build_columns
from .packing import buffer_capacity, packed_size, write_packed
from .transfer_files import INHERITED_BUFFERS, Inherited, InheritedFiles, new_file
from .transfer_receive import Handle, Release, ReleaseBoard, receive

# Importable from here, where the loader and the tests take them: the files, the main side, and
# receive under the name the tests use.
__all__ = [
    "INHERITED_BUFFERS",
    "MAX_POOLED_BUFFERS",
    "SUPPORTED",
    "Inherited",
    "InheritedFiles",
    "Release",
    "ReleaseBoard",
    "WorkerPool",
    "_receive",
    "worker_pool",
]
_receive = receive

log = logging.getLogger(__name__)

MAX_POOLED_BUFFERS = 8  # per worker; in use at once: about prefetch_factor + 3
SUPPORTED = hasattr(os, "memfd_create")


@dataclass
class _Buffer:
    number: int
    fd: int
    memory: mmap.mmap
    origin: Inherited | None = None  # its file came from the main process
    use: int = 0
    free: bool = False
    mapped_by_main: bool = False  # the main process has it mapped (or an earlier chunk told it how)

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

    def __init__(self, files: InheritedFiles | None = None, worker: int = 0) -> None:
        self.name = uuid.uuid4().hex
        self._buffers: dict[int, _Buffer] = {}
        self._numbers = itertools.count()
        self._retired: list[int] = []  # closed since the last chunk: the main process can unmap them
        self._warned = False
        self._files_id = files.id if files is not None else -1
        self._worker = worker
        self._spare = files.adopt(worker) if files is not None else []  # (index, descriptor) not used yet

    def release(self, releases: tuple[Release, ...]) -> None:
        """Mark this pool's buffers named in ``releases`` free (those still at the released use)."""
        for release in releases:
            buffer = self._buffers.get(release.buffer) if release.pool == self.name else None
            if buffer is not None and buffer.use == release.use:
                buffer.free = True

    def pack(self, columns: dict[str, Any], board: int, scale: float = 1.0) -> Any:
        """``columns`` (from ``table_to_joined``) as a picklable object that becomes the built
        columns in the main process. A new buffer is made ``scale`` times larger than these
        columns need, for the larger chunks that will reuse it (``scale`` > 1 for a part of a chunk)."""
        size = packed_size(columns)
        if not size:
            return build_columns(columns, copy=False)  # pickled into torch's queue: copied there
        try:
            buffer = self._take(size, max(size, int(size * scale)))
        except OSError as error:  # out of file descriptors or memory for a new buffer: the plain way
            return self._plain(columns, error)
        handle: Handle = None if buffer.mapped_by_main else buffer.origin if buffer.origin is not None else buffer.fd
        if isinstance(handle, int):
            try:  # here, not when torch's feeder thread pickles the chunk: an error there loses the chunk
                handle = DupFd(handle)
            except OSError as error:
                buffer.free = True
                return self._plain(columns, error)
        target = torch.frombuffer(buffer.memory, dtype=torch.uint8, count=size)
        layout = write_packed(columns, target)
        del target  # no export of the mapping may outlive this call (the buffer may be closed later)
        buffer.mapped_by_main = True
        retired, self._retired = tuple(self._retired), []
        return _PackedColumns(layout, handle, buffer.capacity, size, Release(self.name, buffer.number, buffer.use), board, retired)

    def _plain(self, columns: dict[str, Any], error: OSError) -> dict[str, Any]:
        """The chunk's columns built in this process (torch's queue copies them), with one warning."""
        if not self._warned:
            self._warned = True
            log.warning("no shared buffer for a chunk (%s); sending chunks through torch's queue instead", error)
        return build_columns(columns, copy=False)

    def _take(self, size: int, new_size: int) -> _Buffer:
        fitting = [b for b in self._buffers.values() if b.free and b.capacity >= size]
        if fitting:
            buffer = min(fitting, key=lambda b: b.capacity)
        else:
            buffer = self._new(new_size)
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
        capacity = buffer_capacity(size)
        origin = None
        if self._spare:
            index, fd = self._spare.pop(0)
            origin = Inherited(self._files_id, self._worker, index)
        else:
            fd = new_file()
        try:
            os.ftruncate(fd, capacity)
            memory = mmap.mmap(fd, capacity)
        except OSError:
            os.close(fd)
            raise
        buffer = _Buffer(next(self._numbers), fd, memory, origin)
        self._buffers[buffer.number] = buffer
        return buffer


_POOL: tuple[int, WorkerPool] | None = None


def worker_pool(files: InheritedFiles | None, worker: int) -> WorkerPool:
    """This process's pool (a forked child gets its own, not its parent's), made with its
    share of ``files`` at the first call."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), WorkerPool(files, worker))
    return _POOL[1]


class _PackedColumns:
    """Pickles as the layout and which buffer holds it (the first time also how to map the
    buffer: which inherited file, or the file descriptor itself); unpickles as columns."""

    def __init__(self, layout: dict[str, Any], handle: Handle, capacity: int, size: int, release: Release, board: int, retired: tuple[int, ...]):
        self.layout, self.handle, self.capacity, self.size = layout, handle, capacity, size
        self.release, self.board, self.retired = release, board, retired

    def __reduce__(self) -> tuple:
        return (receive, (self.layout, self.handle, self.capacity, self.size, self.release, self.board, self.retired))
