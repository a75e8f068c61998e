"""Recycled buffers of the loop's own process for the chunks read in it (reader threads of
``worker_mode="thread"``, and ``num_workers=0``).

A chunk read in this process must still be copied out of pyarrow's memory: batches are writable
tensors of their own, and Arrow's buffers are immutable and may be re-delivered. Copied into
fresh memory, every page of every chunk costs a page fault (the allocator hands large blocks
back to the kernel when they are freed). Here a chunk is copied into a buffer an earlier chunk
used, whose pages are mapped already, and its tensors are views of that buffer. A buffer is
reused only after the last view of its previous chunk is gone, so a batch the loop still holds
is never overwritten; a loop that keeps every batch only makes the pool allocate new buffers.
"""

from __future__ import annotations

import mmap
import threading
import weakref
from typing import Any

import torch

from ..plan.schedule import ChunkTask
from ..read.chunks import Chunk, ChunkReader
from ..read.convert import build_columns
from .packing import buffer_capacity, buffer_scale, packed_size, packed_views, write_packed

FREE_BUFFERS_KEPT = 8  # buffers kept for reuse; a reader holds prefetch_factor + 2 or so at once


class LocalBuffers:
    """A pool of this process's chunk buffers, shared by the threads that read chunks."""

    def __init__(self, keep: int = FREE_BUFFERS_KEPT):
        self._keep = keep
        self._free: list[mmap.mmap] = []
        # Re-entrant: a buffer comes back from a finalizer, which garbage collection may run in
        # the middle of _take in the same thread.
        self._lock = threading.RLock()
        self.made = 0  # buffers allocated
        self.packed = 0  # chunks packed

    def pack(self, columns: dict[str, Any], scale: float = 1.0) -> dict[str, Any]:
        """``columns`` (from ``table_to_joined``) built as views of a recycled buffer. A new buffer
        is made ``scale`` times larger than these columns need (``scale`` > 1 for a part of a chunk)."""
        size = packed_size(columns)
        if not size:
            return build_columns(columns)
        memory = self._take(size, max(size, int(size * scale)))
        view = memoryview(memory)[:size]
        target = torch.frombuffer(view, dtype=torch.uint8)
        layout = write_packed(columns, target)
        # The tensors built below hold `view`; when the last of them is gone, the buffer is free.
        weakref.finalize(view, self._give_back, memory).atexit = False
        del view
        self.packed += 1
        return packed_views(layout, target)

    def _take(self, size: int, new_size: int) -> mmap.mmap:
        with self._lock:
            fitting = [memory for memory in self._free if len(memory) >= size]
            chosen = min(fitting, key=len) if fitting else None
            for index, memory in enumerate(self._free):  # (a finalizer run meanwhile may have dropped it)
                if memory is chosen:
                    del self._free[index]
                    return memory
            self.made += 1
        # Private: a process forked from this one (a DataLoader worker of the user's own) gets its
        # own copy of a batch it inherited, as with ordinary memory, not this buffer's pages.
        capacity = buffer_capacity(new_size)
        return mmap.mmap(-1, capacity, flags=mmap.MAP_PRIVATE) if hasattr(mmap, "MAP_PRIVATE") else mmap.mmap(-1, capacity)

    def _give_back(self, memory: mmap.mmap) -> None:
        with self._lock:
            if len(self._free) < self._keep:
                self._free.append(memory)
                return
            smallest = min(self._free, key=len)
            if len(smallest) < len(memory):
                self._free.remove(smallest)
                self._free.append(memory)


def read_into(reader: ChunkReader, buffers: LocalBuffers, task: ChunkTask) -> Chunk:
    """Read ``task`` in this process, its tensors in one of ``buffers`` (finished batches of an
    output format or a transform are made where they are read, as they are)."""
    if reader.output is not None and reader.output.prepared:
        return reader.read(task)
    chunk = reader.read(task, joined=True)
    chunk.columns = buffers.pack(chunk.columns, scale=buffer_scale(reader.chunk_rows, task.stop - task.start))
    return chunk
