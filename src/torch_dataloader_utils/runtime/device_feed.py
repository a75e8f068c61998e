"""Feeding an accelerator: chunks are copied to the device ahead of the training loop, so the
copy of the next chunk overlaps the step on the current one.

A background thread takes each chunk as it arrives from the DataLoader, packs its tensors into
one pinned staging buffer, and copies that buffer to the device on a side CUDA stream; the
chunk's tensors become views of the device buffer. When the loop receives the chunk's first
batch, its stream waits for the copy (an event), and the device buffer is recorded as used by
that stream, so the caching allocator reuses it only after the loop's work on it. A staging
buffer is written again only after its last copy finished. Strings stay in host memory (lists
of Python strings); list columns keep their offsets on the host too, for slicing.

Counting is unchanged: chunks are copied ahead, batches are counted when the loop receives them.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterator

import torch

from ..read.chunks import Chunk
from ..read.convert import ListColumn
from . import background

_ALIGN = 64
_END = object()


def check_device(device: Any) -> torch.device | None:
    """The device batches go to, or None for host memory; a ValueError for one this loader cannot feed."""
    if device is None:
        return None
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device must be None, 'cpu', 'cuda' or a torch.device, got {device!r} ({error})") from None
    if device.type == "cpu":
        return None
    if device.type != "cuda":
        raise ValueError(f"device={str(device)!r}: this loader feeds CUDA devices only; pass device=None and move batches yourself")
    if not torch.cuda.is_available():
        raise ValueError(
            f"device={str(device)!r} but torch.cuda.is_available() is False (no CUDA GPU, or a CPU build of torch); "
            "pass device=None to get batches in host memory"
        )
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class _Staging:
    """A pinned host buffer and the event of its last copy to the device."""

    def __init__(self, nbytes: int, pin: bool):
        self.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        self.done: Any = None

    def wait(self) -> None:
        if self.done is not None:
            self.done.synchronize()
            self.done = None


class DeviceFeed:
    """Copies the chunks of one pass to ``device``, up to ``depth`` chunks ahead of the loop.

    On a CPU device (tests) the same threads and buffers are used, with plain copies.
    """

    def __init__(self, device: torch.device, depth: int = 2):
        self.device = device
        self.depth = depth
        self._cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device) if self._cuda else None
        self._staging: list[_Staging] = []
        self._next_staging = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def chunks(self, source: Iterator[Chunk], count: int) -> Iterator[Chunk]:
        """The first ``count`` chunks of ``source`` on the device, in order; then ``source`` is run
        to its end in the thread (as the delivery does without a device)."""
        self.close()
        self._stop = threading.Event()
        ready: queue.Queue = queue.Queue(maxsize=self.depth)
        self._thread = threading.Thread(target=self._run, args=(source, count, ready, self._stop), name="tdu-device-feed", daemon=True)
        background.start(self._thread, self._stop)
        try:
            while True:
                item = ready.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._stop.set()

    def close(self, timeout: float | None = None) -> None:
        """Stop the thread of an earlier pass (it finishes the chunk it is waiting for)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout)
            self._thread = None

    def _run(self, source: Iterator[Chunk], count: int, ready: queue.Queue, stop: threading.Event) -> None:
        try:
            for _ in range(count):
                if stop.is_set():
                    return
                chunk = next(source)
                if not _put(ready, self._to_device(chunk), stop):
                    return
            for _ in source:
                pass
            _put(ready, _END, stop)
        except BaseException as error:  # noqa: BLE001 - handed to the loop, which raises it
            _put(ready, error, stop)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def _to_device(self, chunk: Chunk) -> Chunk:
        tensors: list[torch.Tensor] = []
        for column in chunk.columns.values():
            if isinstance(column, torch.Tensor):
                tensors.append(column)
            elif isinstance(column, ListColumn):
                tensors += [column.values, column.offsets]
        if not tensors:
            return chunk
        offsets, total = [], 0
        for tensor in tensors:
            offsets.append(total)
            total += -(-tensor.numel() * tensor.element_size() // _ALIGN) * _ALIGN
        staging = self._take_staging(total)
        for tensor, offset in zip(tensors, offsets):
            nbytes = tensor.numel() * tensor.element_size()
            staging.buffer[offset : offset + nbytes].copy_(tensor.contiguous().reshape(-1).view(torch.uint8))
        if self._cuda:
            assert self._stream is not None
            with torch.cuda.stream(self._stream):
                target = torch.empty(total, dtype=torch.uint8, device=self.device)
                target.copy_(staging.buffer[:total], non_blocking=True)
                staging.done = torch.cuda.Event()
                staging.done.record(self._stream)
            done = staging.done
        else:
            target = staging.buffer[:total].clone()
            done = None
        views = iter(
            target[offset : offset + tensor.numel() * tensor.element_size()].view(tensor.dtype).reshape(tensor.shape)
            for tensor, offset in zip(tensors, offsets)
        )
        columns: dict[str, Any] = {}
        for name, column in chunk.columns.items():
            if isinstance(column, torch.Tensor):
                columns[name] = next(views)
            elif isinstance(column, ListColumn):
                values, device_offsets = next(views), next(views)
                columns[name] = ListColumn(values, device_offsets, column.offsets.clone(), column.width)  # not a view of the worker's buffer
            else:
                columns[name] = column
        moved = Chunk(chunk.lane, chunk.start, chunk.stop, columns, chunk.present, chunk.skipped)
        moved.ready = _Handover(target, done) if self._cuda else None
        return moved

    def _take_staging(self, nbytes: int) -> _Staging:
        """A staging buffer whose last copy has finished, grown when too small (depth + 1 in turn)."""
        if len(self._staging) < self.depth + 1:
            self._staging.append(_Staging(nbytes, self._cuda))
            return self._staging[-1]
        staging = self._staging[self._next_staging]
        self._next_staging = (self._next_staging + 1) % len(self._staging)
        staging.wait()
        if staging.buffer.numel() < nbytes:
            staging.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self._cuda)
        return staging


class _Handover:
    """Called when the loop receives a chunk's first batch: the loop's stream waits for the copy,
    and the device buffer is not reused before the loop's work on it is done."""

    def __init__(self, target: torch.Tensor, done: Any):
        self.target = target
        self.done = done

    def __call__(self) -> None:
        stream = torch.cuda.current_stream(self.target.device)
        stream.wait_event(self.done)
        self.target.record_stream(stream)


def _put(ready: queue.Queue, item: Any, stop: threading.Event) -> bool:
    """Put ``item`` unless the loop stopped listening; False when it did."""
    while not stop.is_set():
        try:
            ready.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


__all__ = ["DeviceFeed", "check_device"]
