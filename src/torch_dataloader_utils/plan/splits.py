"""Split planning and assignment: pure functions of their inputs (no I/O).

A file is described by its *units* (Parquet row groups, ORC stripes): the row
count and compressed byte size of each. ``plan_splits`` cuts files into splits
of at most ``split_bytes`` along unit boundaries; ``epoch_order`` and
``assign_splits`` decide which rank and worker reads which split in an epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

DEFAULT_SPLIT_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Split:
    """A row range of one file. ``row_offset=None, row_length=None`` is the whole file."""

    path: str
    row_offset: int | None = None
    row_length: int | None = None

    def to_dict(self) -> dict:
        """The split as states store it: path, row_offset, row_length."""
        return {"path": self.path, "row_offset": self.row_offset, "row_length": self.row_length}

    def describe(self) -> str:
        """The split for messages: its path and "full file" or its row range."""
        if self.row_offset is None:
            return f"{self.path}  full file"
        end = self.row_offset + (self.row_length or 0)
        return f"{self.path}  rows [{self.row_offset:,}, {end:,})"


@dataclass(frozen=True, slots=True)
class FileLayout:
    """What the planner needs to know of one file: identity and its units."""

    path: str
    size: int
    unit_rows: tuple[int, ...]
    unit_bytes: tuple[int, ...]

    @property
    def num_rows(self) -> int:
        return sum(self.unit_rows)


def plan_splits(files: Sequence[FileLayout], split_bytes: int = DEFAULT_SPLIT_BYTES, split_rows: int | None = None) -> list[Split]:
    """Cut files into splits of at most ``split_bytes`` compressed bytes and ``split_rows`` rows.

    A file within both limits is one whole-file split. Larger files are cut greedily along unit
    boundaries; a unit larger than ``split_bytes`` is its own split, and a unit with more than
    ``split_rows`` rows is cut into splits of ``split_rows`` rows. Files and splits without rows
    are left out.
    """
    if split_bytes <= 0:
        raise ValueError(f"split_bytes must be positive, got {split_bytes}")
    if split_rows is not None and split_rows <= 0:
        raise ValueError(f"split_rows must be positive, got {split_rows}")
    max_rows = split_rows or MAX_FILE_ROWS
    splits: list[Split] = []
    for layout in files:
        if layout.num_rows == 0:
            continue
        if layout.size <= split_bytes and layout.num_rows <= max_rows:
            splits.append(Split(layout.path))
            continue
        start_row = rows = size = 0
        for unit_rows, unit_bytes in zip(layout.unit_rows, layout.unit_bytes):
            if rows and (size + unit_bytes > split_bytes or rows + unit_rows > max_rows):
                splits.append(Split(layout.path, start_row, rows))
                start_row, rows, size = start_row + rows, 0, 0
            while unit_rows > max_rows:  # (rows == 0 here) a unit over split_rows: cut inside it
                splits.append(Split(layout.path, start_row, max_rows))
                start_row, unit_rows = start_row + max_rows, unit_rows - max_rows
                unit_bytes = 0  # the rest of the unit's bytes count once, in its last split
            rows += unit_rows
            size += unit_bytes
        if rows:
            splits.append(Split(layout.path, start_row, rows))
    return splits


#: The largest value of a permutation's seed words (shuffle_seed, epoch, ...): SeedSequence cuts
#: larger ints into 32-bit words and pads short entropy with zeros, so (2**32 + 5, 0) seeds like (5, 1).
MAX_SEED_WORD = 2**32 - 1
MAX_ROW_COUNT = 2**31 - 1  # batch_size, chunk_rows, shuffle_buffer_rows: Arrow and torch take row counts as C integers
MAX_SPLIT_BYTES = 2**62
MAX_FILE_ROWS = 2**63 - 1


def stable_permutation(seed_words: Sequence[int], size: int) -> np.ndarray:
    """A random permutation of ``range(size)`` that is the same on every machine and NumPy version.

    NumPy does not promise that ``Generator.permutation`` keeps its stream across releases,
    and a checkpoint must outlive an upgrade. SeedSequence and PCG64's raw output are fixed
    by their specifications, so we sort by raw 64-bit draws instead.
    """
    if not all(0 <= word <= MAX_SEED_WORD for word in seed_words):
        raise ValueError(f"seed words must be in [0, {MAX_SEED_WORD}], got {list(seed_words)}")
    if size <= 1:  # the only permutation (a source upsampled many times has a window per copy of each row)
        return np.arange(size, dtype=np.int64)
    bits = np.random.PCG64(np.random.SeedSequence(list(seed_words)))
    return np.argsort(bits.random_raw(size), kind="stable").astype(np.int64)


def epoch_order(num_splits: int, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The order of the split list in an epoch: identity, or a permutation from (seed, epoch)."""
    if not shuffle:
        return np.arange(num_splits, dtype=np.int64)
    return stable_permutation([seed, epoch], num_splits)


def assign_splits(order: Sequence[int] | np.ndarray, rank: int, world_size: int, num_workers: int) -> list[list[int]]:
    """Deal the epoch's splits round-robin to ranks, then to this rank's workers.

    Returns, for each worker of ``rank``, the split indices it reads in order.
    ``num_workers=0`` (reading in the main process) counts as one worker.
    """
    workers = max(1, num_workers)
    mine = np.asarray(order)[rank::world_size]
    return [mine[w::workers].tolist() for w in range(workers)]
