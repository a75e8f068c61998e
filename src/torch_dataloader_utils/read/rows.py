"""Rows read from a range of a stream, as the reader hands them to the chunk reader."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .picks import Picked


class Rows:
    """Rows read from a range. ``present`` holds each row's offset in the range when some
    rows were skipped (None: every row is there, in order); ``skipped`` maps split -> error.
    ``picked``: rows not yet put in order (read/picks.py); ``table`` then gathers them."""

    def __init__(self, table: pa.Table | None, present: np.ndarray | None = None, skipped: dict[int, str] | None = None, picked: Picked | None = None):
        self._table = table
        self.present = present
        self.skipped = {} if skipped is None else skipped
        self.picked = picked

    @property
    def table(self) -> pa.Table:
        if self._table is None:
            assert self.picked is not None
            self._table = self.picked.table()
        return self._table

    @property
    def unordered(self) -> bool:
        """Whether the rows are still picked, not yet gathered into a table."""
        return self._table is None and self.picked is not None

    @property
    def num_rows(self) -> int:
        return self.picked.num_rows if self._table is None and self.picked is not None else self.table.num_rows
