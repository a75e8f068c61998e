"""Remote Parquet files' footers (``KeptFooter`` bytes) in one block of shared memory.

A DataLoader worker that is spawned receives the dataset pickled: a list of 100,000 kept
footers would be 40 MB pickled into every worker, though each worker opens only the files of
its own splits. Kept in a shared-memory tensor, what a worker receives is a handle (torch's
multiprocessing pickling shares the block, whatever the number of files), and a worker copies
out a footer only when it opens that file. A forked worker shares the same pages instead of
copying a list whose objects' reference counts it writes to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..formats._parquet_tail import KeptFooter
from ..plan.columns import Column


class SharedFooters(Column[Any]):
    """Per file: its ``KeptFooter`` (made from the shared block on access), another kind of
    footer as it was (kept in a dict: a format that keeps parsed footers), or None."""

    __slots__ = ("_blob", "_ends", "_other")

    def __init__(self, footers: Sequence[Any]):
        parts: list[bytes] = []
        self._other: dict[int, Any] = {}
        for index, footer in enumerate(footers):
            parts.append(footer.data if isinstance(footer, KeptFooter) else b"")
            if footer is not None and not isinstance(footer, KeptFooter):
                self._other[index] = footer
        blob = bytearray(b"".join(parts))
        ends = np.cumsum(np.fromiter(map(len, parts), dtype=np.int64, count=len(parts)))
        del parts
        self._blob = (torch.frombuffer(blob, dtype=torch.uint8) if blob else torch.zeros(0, dtype=torch.uint8)).share_memory_()
        self._ends = torch.from_numpy(ends).share_memory_()

    def __len__(self) -> int:
        return len(self._ends)

    def _item(self, index: int) -> Any:
        ends = self._ends.numpy()
        start, stop = (int(ends[index - 1]) if index else 0), int(ends[index])
        if start == stop:
            return self._other.get(index)
        return KeptFooter(self._blob.numpy()[start:stop].tobytes())


def shared_footers(footers: list[Any]) -> Sequence[Any]:
    """``footers`` with the kept ones in shared memory (the list itself when none is kept)."""
    return SharedFooters(footers) if any(isinstance(footer, KeptFooter) for footer in footers) else footers
