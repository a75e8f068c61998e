"""Cutting a converted chunk into its batches in the training loop's process.

Every batch of a chunk is a view of the chunk's memory. Columns that are one tensor (numbers,
and lists whose rows all have one length) are split into all their batch views by one call when
the chunk's first batch is asked for; strings and ragged lists are sliced batch by batch, as
each needs work of its own (Python strings, its rows' offsets).
"""

from __future__ import annotations

from typing import Any

import torch

from .convert import ListColumn, Where, slice_columns


def _split(column: Any, size: int) -> tuple[torch.Tensor, ...] | None:
    """The column's batch views of ``size`` rows (the last one shorter), or None when the column
    must be sliced batch by batch."""
    if isinstance(column, torch.Tensor) and column.dim() > 0:
        return column.split(size)
    if isinstance(column, ListColumn) and column.width is not None:
        values = column.values
        return values.view(-1, column.width, *values.shape[1:]).split(size)
    return None


class BatchSlicer:
    """The batches of ``size`` rows of a chunk's columns, by index."""

    def __init__(self, columns: dict[str, Any], size: int, where: Where | None = None):
        self._size = size
        self._where = where
        self._split = {name: _split(column, size) for name, column in columns.items()}
        self._sliced = {name: column for name, column in columns.items() if self._split[name] is None}

    def batch(self, index: int, rows: int) -> dict[str, Any]:
        """Batch ``index``: rows [index * size, index * size + rows) of the chunk."""
        start = index * self._size
        sliced = slice_columns(self._sliced, start, start + rows, self._where) if self._sliced else {}
        return {name: views[index] if views is not None else sliced[name] for name, views in self._split.items()}
