"""The shared-memory files that chunk buffers live in (``transfer.py``), and the ones the main
process creates for forked workers in advance.

A worker's buffer is an anonymous ``memfd``. The main process can map it in two ways: a file
it created itself just before forking the worker (``InheritedFiles``: both sides hold the
descriptor, and a chunk names the file by number), or a descriptor the worker sends with the
buffer's first chunk (multiprocessing's resource sharer: a socket, a handshake and a thread in
the worker that waits for the worker's GIL, all on the way to the first batch). Forked workers
use inherited files for their first buffers; spawned workers, and a worker's later buffers,
send their descriptors.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import weakref
from typing import ClassVar, NamedTuple

log = logging.getLogger(__name__)

INHERITED_BUFFERS = 4  # per worker: files the main process creates for the first buffers (about the buffers a worker builds in a pass)
SPARE_DESCRIPTORS = 64  # left free for torch's pipes and the rest, besides 8 per worker, when creating them
FILE_NAME = "torch_dataloader_utils-chunk"


def new_file() -> int:
    """A new, empty shared-memory file (closed on exec)."""
    return os.memfd_create(FILE_NAME, os.MFD_CLOEXEC)


class Inherited(NamedTuple):
    """A buffer in file ``index`` of worker ``worker``'s share of the ``InheritedFiles`` ``files``."""

    files: int
    worker: int
    index: int  # type: ignore[assignment]  # (a field, in place of tuple.index)


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

    _live: ClassVar[weakref.WeakValueDictionary[int, InheritedFiles]] = weakref.WeakValueDictionary()
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
                    row.append(new_file())
        except OSError as error:  # out of descriptors after all: none, so that torch can still make its pipes
            log.info("no shared files made in advance: %s", error)
            _close_files(self._rows)
        self._live[self.id] = self

    def __reduce__(self) -> tuple:
        return (_not_inherited, ())

    @classmethod
    def find(cls, files: int) -> InheritedFiles | None:
        """The live object with id ``files`` (None once it is collected: its pass has ended)."""
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
