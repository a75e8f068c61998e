"""Moving converted chunks from worker processes to the main process through recycled shared memory.

Sending a tensor through torch's DataLoader queue copies it into fresh shared memory, and
every page of fresh memory costs a page fault (measured: ~5 ms per 4.4 MB chunk, about as
much as the copy is worth). Here a worker instead packs all tensors of a chunk into one
buffer of its own pool (an anonymous ``memfd``), and the main process maps that buffer and
builds the chunk's tensors as views of it. The main process maps a buffer when its first
chunk comes and keeps the mapping until the worker names the buffer retired (or a pass
starts new workers). When the last of a chunk's views is gone, the main
process posts a release of (buffer, use); the release rides to the workers on the next tasks
the sampler hands out, and the owning worker reuses the buffer, whose pages are already
mapped. A buffer is written again only after its release for the same use arrived, so a
batch the training loop still holds is never overwritten; a release that never arrives
only costs a new buffer.

The main process gets a buffer's file one of two ways. With forked workers it creates each
worker's first files (``InheritedFiles``) just before the fork, so both sides hold them and a
chunk names its file by number. Otherwise (spawned workers, a worker's later buffers) the
first chunk carries the file descriptor, through multiprocessing's resource sharer: a socket,
a handshake and a thread in the worker that waits for the worker's GIL. Measured on the
0.25 GiB benchmark set (8 buffers per epoch): 22 to 44 ms of the main process's time per
epoch, up to 26 ms for a single buffer (the first batch's too); with inherited files 2 to
5 ms. Paired epochs: numeric 1.02x and 1.03x rows/s, text 0.97x to 1.14x (noise); first batch
57 -> 53 ms numeric, 70 -> 52 ms text.

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

from ..read.convert import Joined, build_columns, leaves, replace_leaves, tensor_nbytes

log = logging.getLogger(__name__)

ALIGN = 64
MAX_POOLED_BUFFERS = 8  # per worker; in use at once: about prefetch_factor + 3
INHERITED_BUFFERS = 4  # per worker: files the main process creates for the first buffers (worker 0 used 4 in a benchmark pass)
SPARE_DESCRIPTORS = 64  # left free for torch's pipes and the rest, besides 8 per worker, when creating them
SUPPORTED = hasattr(os, "memfd_create")
_FILE_NAME = "torch_dataloader_utils-chunk"


class Release(NamedTuple):
    """Buffer ``buffer`` of worker pool ``pool`` is free again after its use number ``use``."""

    pool: str
    buffer: int
    use: int


class Inherited(NamedTuple):
    """A buffer in file ``index`` of worker ``worker``'s share of the ``InheritedFiles`` ``files``."""

    files: int
    worker: int
    index: int


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


# --------------------------------------------------- files for the buffers
def _close_files(rows: list[list[int | None]]) -> None:
    """Close every descriptor still in ``rows`` and empty the rows (in place: a finalizer holds them)."""
    for row in rows:
        for fd in row:
            if fd is not None:
                os.close(fd)
        row.clear()


def _not_inherited() -> None:
    return None


def _free_descriptors() -> int | None:
    """How many more file descriptors this process may open (None: no limit, or unknown)."""
    import resource

    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return None
        return soft - len(os.listdir("/proc/self/fd"))
    except (OSError, ValueError):
        return None


class InheritedFiles:
    """Empty shared-memory files that the main process creates just before it forks a pass's
    workers, ``per_worker`` for each: a worker builds its first buffers in its share, and the
    main process maps a buffer through its own descriptor when the first chunk names it (then
    closes that descriptor; the mapping keeps the file). Descriptors not yet mapped close when
    this object is collected. A pickled copy (workers that are spawned, not forked) is None."""

    _live: weakref.WeakValueDictionary[int, InheritedFiles] = weakref.WeakValueDictionary()
    _ids = itertools.count()

    def __init__(self, workers: int, per_worker: int = INHERITED_BUFFERS):
        self.id = next(self._ids)
        self.creator = os.getpid()
        self._lock = threading.Lock()
        self._rows: list[list[int | None]] = [[] for _ in range(workers)]
        self._closer = weakref.finalize(self, _close_files, self._rows)
        spare = _free_descriptors()
        if spare is not None and workers:  # the files count against this process's limit, and every fork's
            affordable = max(0, (spare - SPARE_DESCRIPTORS - 8 * workers) // workers)
            if affordable < per_worker:
                log.info("%d free file descriptors: %d of %d shared files per worker made in advance", spare, affordable, per_worker)
                per_worker = affordable
        try:
            for _ in range(per_worker):
                for row in self._rows:
                    row.append(os.memfd_create(_FILE_NAME, os.MFD_CLOEXEC))
        except OSError as error:  # out of descriptors after all: none, so that torch can still make its pipes
            log.info("no shared files made in advance: %s", error)
            _close_files(self._rows)
        self._live[self.id] = self

    def __reduce__(self) -> tuple:
        return (_not_inherited, ())

    @classmethod
    def find(cls, files: int) -> InheritedFiles | None:
        return cls._live.get(files)

    def adopt(self, worker: int) -> list[tuple[int, int]]:
        """In a forked worker: its share as (index, descriptor) pairs, now owned by the caller; the
        other workers' descriptors are closed in this process."""
        if os.getpid() == self.creator:
            raise RuntimeError("internal error: InheritedFiles.adopt() called in the process that created them")
        self._closer.detach()
        mine = [(index, fd) for index, fd in enumerate(self._rows[worker]) if fd is not None]
        self._rows[worker] = []
        _close_files(self._rows)
        return mine

    def take(self, worker: int, index: int) -> int | None:
        """In the main process: the descriptor of a file, given up by this object (None if taken)."""
        with self._lock:
            row = self._rows[worker] if 0 <= worker < len(self._rows) else []
            fd = row[index] if 0 <= index < len(row) else None
            if fd is not None:
                row[index] = None
            return fd


# ---------------------------------------------------------- worker side
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
        for release in releases:
            buffer = self._buffers.get(release.buffer) if release.pool == self.name else None
            if buffer is not None and buffer.use == release.use:
                buffer.free = True

    def pack(self, columns: dict[str, Any], board: int, scale: float = 1.0) -> Any:
        """``columns`` (from ``table_to_joined``) as a picklable object that becomes the built
        columns in the main process. A new buffer is made ``scale`` times larger than these
        columns need, for the larger chunks that will reuse it (``scale`` > 1 for a part of a chunk)."""
        size = _packed_size(columns)
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
        layout = _write(columns, target)
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
        capacity = -(-size * 5 // 4 // mmap.PAGESIZE) * mmap.PAGESIZE  # room for chunks a little larger
        origin = None
        if self._spare:
            index, fd = self._spare.pop(0)
            origin = Inherited(self._files_id, self._worker, index)
        else:
            fd = os.memfd_create(_FILE_NAME, os.MFD_CLOEXEC)
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


Handle = Any  # how the main process maps a buffer: Inherited, a DupFd, or None (mapped already)


class _PackedColumns:
    """Pickles as the layout and which buffer holds it (the first time also how to map the
    buffer: which inherited file, or the file descriptor itself); unpickles as columns."""

    def __init__(self, layout: dict[str, Any], handle: Handle, capacity: int, size: int, release: Release, board: int, retired: tuple[int, ...]):
        self.layout, self.handle, self.capacity, self.size = layout, handle, capacity, size
        self.release, self.board, self.retired = release, board, retired

    def __reduce__(self) -> tuple:
        return (_receive, (self.layout, self.handle, self.capacity, self.size, self.release, self.board, self.retired))


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
        self.mapped = {"inherited": 0, "sent": 0}  # buffers mapped, by how their file came
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

    def mapping(self, release: Release, handle: Inherited | DupFd | None, capacity: int, retired: tuple[int, ...]) -> mmap.mmap:
        """The buffer of ``release``, mapped when its first chunk comes (once per buffer), then kept."""
        with self._lock:
            for number in retired:
                self._mappings.pop((release.pool, number), None)
            key = (release.pool, release.buffer)
            if handle is not None:
                descriptor = _descriptor(handle)
                self.mapped["inherited" if isinstance(handle, Inherited) else "sent"] += 1
                try:
                    self._mappings[key] = mmap.mmap(descriptor, capacity)
                finally:
                    os.close(descriptor)
            memory = self._mappings.get(key)
        if memory is None:
            raise RuntimeError(f"internal error: a chunk came in buffer {key} of a worker, which this process has not mapped")
        return memory


def _descriptor(handle: Inherited | DupFd) -> int:
    """A descriptor of a buffer's file, owned by the caller."""
    if not isinstance(handle, Inherited):
        return handle.detach()
    files = InheritedFiles.find(handle.files)
    fd = files.take(handle.worker, handle.index) if files is not None else None
    if fd is None:
        raise RuntimeError(f"internal error: a chunk came in file {handle}, which is closed or was mapped already")
    return fd


def _receive(layout: dict[str, Any], handle: Inherited | DupFd | None, capacity: int, size: int, release: Release, board: int, retired: tuple[int, ...]) -> dict[str, Any]:
    """Unpickling in the main process: the columns as views of the worker's buffer."""
    owner = ReleaseBoard.find(board)
    if owner is None:
        raise RuntimeError("internal error: a chunk arrived for a loader that no longer exists")
    if isinstance(handle, Inherited) and InheritedFiles.find(handle.files) is None:
        # Its pass has ended (the files go with it), but a traceback kept torch's iterator, whose
        # pin-memory thread still takes chunks off the queue: nothing will read this one.
        return {}
    view = memoryview(owner.mapping(release, handle, capacity, retired))[:size]
    owner.received += 1
    owner.recycled += release.use > 1
    # The tensors below hold `view`; when the last of them is gone, the buffer may be reused.
    weakref.finalize(view, owner.post, release).atexit = False
    columns = _read(layout, torch.frombuffer(view, dtype=torch.uint8))
    del view
    return columns
