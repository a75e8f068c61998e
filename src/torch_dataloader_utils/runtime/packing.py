"""Laying a chunk's columns into one buffer and building them back as views of it: the shared
buffers of worker processes (``transfer.py``) and the recycled buffers of reader threads
(``local_buffers.py``) both carry a chunk this way."""

from __future__ import annotations

import mmap
from typing import Any, NamedTuple

import torch

from ..read.convert import Joined, leaves, replace_leaves, tensor_nbytes

ALIGN = 64


class Slot(NamedTuple):
    """Where a tensor sits in a packed buffer."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def buffer_scale(chunk_rows: int, rows: int) -> float:
    """How much larger than a chunk of ``rows`` rows to make a new buffer: a quick first piece or a
    lane's last chunk gets a buffer for whole chunks of ``chunk_rows``, which reuse it."""
    return chunk_rows / rows if rows else 1.0


def buffer_capacity(size: int) -> int:
    """Bytes of a new buffer for ``size`` bytes of packed columns: whole pages, with room for
    later chunks a little larger."""
    return -(-size * 5 // 4 // mmap.PAGESIZE) * mmap.PAGESIZE


def packed_size(columns: dict[str, Any]) -> int:
    """Bytes ``write_packed`` needs for ``columns`` (from ``table_to_joined``)."""
    return sum(_aligned(joined.nbytes) for value in columns.values() for joined in leaves(value, Joined))


def write_packed(columns: dict[str, Any], target: torch.Tensor) -> dict[str, Any]:
    """Write every ``Joined`` of ``columns`` into ``target`` (uint8); each becomes a ``Slot``."""
    offset = 0

    def place(joined: Joined) -> Slot:
        nonlocal offset
        if joined.nbytes:
            joined.write(target[offset : offset + joined.nbytes].view(joined.dtype).view(joined.shape))
        slot = Slot(offset, joined.dtype, joined.shape)
        offset += _aligned(joined.nbytes)
        return slot

    return {name: replace_leaves(value, Joined, place) for name, value in columns.items()}


def packed_views(layout: dict[str, Any], source: torch.Tensor) -> dict[str, Any]:
    """The columns of ``layout`` (from ``write_packed``) as views of ``source`` (uint8)."""

    def view(slot: Slot) -> torch.Tensor:
        nbytes = tensor_nbytes(slot.dtype, slot.shape)
        return source[slot.offset : slot.offset + nbytes].view(slot.dtype).view(slot.shape)

    return {name: replace_leaves(value, Slot, view) for name, value in layout.items()}
