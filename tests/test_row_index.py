"""plan/row_index.py: global rows -> (file, unit, row), pure."""

from __future__ import annotations

import numpy as np
import pytest

from torch_dataloader_utils.plan.row_index import RowIndex, normalize_rows, unit_groups


def index_of(unit_rows: list[list[int]]) -> RowIndex:
    """The index of files whose units hold ``unit_rows[file][unit]`` rows."""
    units = np.array([len(file) for file in unit_rows], dtype=np.int64)
    return RowIndex.from_flat(units, np.array([rows for file in unit_rows for rows in file], dtype=np.int64))


def test_locate_skips_units_and_files_without_rows():
    index = index_of([[3, 0, 2], [], [0], [4]])
    assert index.num_rows == 9
    located = index.locate(np.arange(9))
    assert located.file.tolist() == [0, 0, 0, 0, 0, 3, 3, 3, 3]
    assert located.unit.tolist() == [0, 0, 0, 2, 2, 0, 0, 0, 0]
    assert located.row_in_unit.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    assert located.row_in_file.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3]


def test_normalize_rows_counts_negatives_from_the_end_and_names_the_first_bad_index():
    assert normalize_rows(np.array([-1, 0, -9, 8]), 9).tolist() == [8, 0, 0, 8]
    with pytest.raises(IndexError, match=r"row index 9 is out of range for a dataset of 9 rows"):
        normalize_rows(np.array([1, 9, -10]), 9)
    with pytest.raises(IndexError, match=r"-10"):
        normalize_rows(np.array([-10]), 9)
    with pytest.raises(IndexError, match="no rows"):
        normalize_rows(np.array([0]), 0)
    assert normalize_rows(np.zeros(0, np.int64), 0).tolist() == []


def test_unit_groups_keep_request_positions_per_unit_in_unit_order():
    index = index_of([[2, 2], [3]])
    groups = unit_groups(index.locate(np.array([5, 0, 3, 1, 5, 2])))
    assert [(f, u, p.tolist()) for f, u, p in groups] == [(0, 0, [1, 3]), (0, 1, [2, 5]), (1, 0, [0, 4])]
    assert unit_groups(index.locate(np.zeros(0, np.int64))) == []
