"""Global row numbers: where row i of the whole dataset lives (pure; no I/O).

Rows are numbered over every file of the catalog (all ranks), in file order, and inside a
file in stored order: row i is the same row whatever the rank, workers, shuffle or epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class Located(NamedTuple):
    """Where each of some global rows lives: file, unit of the file, row within the unit and
    row within the file (arrays of equal length, int64)."""

    file: np.ndarray
    unit: np.ndarray
    row_in_unit: np.ndarray
    row_in_file: np.ndarray


@dataclass(frozen=True)
class RowIndex:
    """Every unit of every file laid end to end: ``starts[k]`` is the global row of unit k's
    first row (``starts[-1]`` the row count); ``unit_file``/``unit_number`` name unit k."""

    starts: np.ndarray
    unit_file: np.ndarray
    unit_number: np.ndarray
    file_starts: np.ndarray  # global row of each file's first row, plus the row count

    @classmethod
    def from_flat(cls, units: np.ndarray, rows: np.ndarray) -> RowIndex:
        """The index of files with ``units[file]`` units each, whose rows are ``rows`` (all
        files' units end to end)."""
        rows = np.asarray(rows, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        unit_file = np.repeat(np.arange(len(units), dtype=np.int64), units)
        first_unit = np.cumsum(units) - units
        unit_number = np.arange(len(rows), dtype=np.int64) - np.repeat(first_unit, units)
        file_starts = starts[np.concatenate([first_unit, [len(rows)]]).astype(np.int64)]
        return cls(starts, unit_file, unit_number, file_starts)

    @property
    def num_rows(self) -> int:
        return int(self.starts[-1])

    def locate(self, rows: np.ndarray) -> Located:
        """Where each of ``rows`` (global rows in [0, num_rows), int64) lives. Units without rows
        are never named: a row belongs to the last unit that starts at or before it."""
        unit = np.searchsorted(self.starts, rows, side="right") - 1
        file = self.unit_file[unit]
        return Located(file, self.unit_number[unit], rows - self.starts[unit], rows - self.file_starts[file])


def normalize_rows(rows: np.ndarray, num_rows: int) -> np.ndarray:
    """``rows`` with negative entries counted from the end; IndexError naming the first entry
    outside [-num_rows, num_rows)."""
    rows = np.asarray(rows, dtype=np.int64)
    if num_rows == 0 and len(rows):
        raise IndexError(f"row index {int(rows[0])} is out of range: the dataset has no rows")
    bad = (rows < -num_rows) | (rows >= num_rows)
    if bad.any():
        first = int(rows[np.flatnonzero(bad)[0]])
        raise IndexError(f"row index {first} is out of range for a dataset of {num_rows:,} rows (valid: -{num_rows} to {num_rows - 1})")
    return np.where(rows < 0, rows + num_rows, rows)


def unit_groups(located: Located) -> list[tuple[int, int, np.ndarray]]:
    """The requested rows grouped by unit, in file and unit order: (file, unit, positions of the
    request that unit serves, in request order)."""
    if not len(located.file):
        return []
    key = located.file * (int(located.unit.max()) + 1) + located.unit
    order = np.argsort(key, kind="stable")
    bounds = np.flatnonzero(np.diff(key[order])) + 1
    groups = []
    for positions in np.split(order, bounds):
        first = positions[0]
        groups.append((int(located.file[first]), int(located.unit[first]), positions))
    return groups
