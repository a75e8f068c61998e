"""plan/columns.py and catalog/file_table.py: per-file records in columns read back as the
records they replace, the split table equals plan_splits, and planning keeps no per-file objects."""

from __future__ import annotations

import gc
import itertools
import pickle
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.catalog.file_table import FileTable
from torch_dataloader_utils.plan.columns import LayoutTable, Strings, flat_unit_rows, plan_split_table, row_counts, unit_rows_at
from torch_dataloader_utils.plan.row_index import RowIndex
from torch_dataloader_utils.plan.splits import FileLayout, plan_splits
from torch_dataloader_utils.plan.streams import SplitRows
from torch_dataloader_utils.storage.versions import FileEntry

LAYOUTS = [
    FileLayout("/d/a.parquet", 100, (10, 20), (50, 50)),
    FileLayout("/d/b.parquet", 900, (30, 30, 30), (300, 300, 300)),  # cut by split_bytes
    FileLayout("/d/\udcff-not-utf8.parquet", 0, (), ()),  # no rows: no split
    FileLayout("/d/c.parquet", 100, (10, 20), (50, 50)),
    FileLayout("/d/d.parquet", 40, (25,), (40,)),  # cut by split_rows
]


def test_strings_round_trip_with_none_and_names_that_are_not_utf8():
    items = ["a", None, "", "é/\udcff", "z" * 300]
    strings = Strings(items)
    assert list(strings) == items and strings[-1] == items[-1] and strings[1:3] == items[1:3]
    assert pickle.loads(pickle.dumps(strings)) == items
    with pytest.raises(IndexError):
        strings[5]


def test_a_layout_table_reads_back_the_layouts_and_their_offsets():
    table = LayoutTable(LAYOUTS)
    assert list(table) == LAYOUTS and table == LAYOUTS
    assert [o.tolist() for o in table.offsets] == [[0, *itertools.accumulate(layout.unit_rows)] for layout in LAYOUTS]
    assert row_counts(table).tolist() == row_counts(LAYOUTS).tolist() == [30, 90, 0, 30, 25]
    counts, rows = flat_unit_rows(table)
    assert counts.tolist() == [2, 3, 0, 2, 1] and rows.tolist() == [10, 20, 30, 30, 30, 10, 20, 25]
    assert [a.tolist() for a in flat_unit_rows(table)] == [a.tolist() for a in flat_unit_rows(LAYOUTS)]
    assert pickle.loads(pickle.dumps(table)) == LAYOUTS
    assert [unit_rows_at(t, 1, 2) for t in (table, LAYOUTS)] == [30, 30]
    with pytest.raises(IndexError):
        unit_rows_at(table, 4, 1)


@pytest.mark.parametrize("split_bytes, split_rows", [(500, None), (500, 12), (10**9, None), (1, 1)])
def test_the_split_table_is_plan_splits(split_bytes, split_rows):
    table = plan_split_table(LayoutTable(LAYOUTS), split_bytes, split_rows)
    expected = plan_splits(LAYOUTS, split_bytes, split_rows)
    assert list(table) == expected
    index = {layout.path: i for i, layout in enumerate(LAYOUTS)}
    rows = [
        SplitRows(index[s.path], s.row_offset or 0, (s.row_offset or 0) + (s.row_length if s.row_length is not None else LAYOUTS[index[s.path]].num_rows))
        for s in expected
    ]
    assert list(table.rows) == rows


def test_the_row_index_of_flat_units_numbers_every_unit_of_every_file():
    lists = [[10, 20], [], [5], [0, 7]]
    index = RowIndex.from_flat(*flat_unit_rows([FileLayout("p", 1, tuple(r), tuple(r)) for r in lists]))
    assert index.starts.tolist() == [0, 10, 30, 35, 35, 42]
    assert index.unit_file.tolist() == [0, 0, 2, 3, 3] and index.unit_number.tolist() == [0, 1, 0, 0, 1]
    assert index.file_starts.tolist() == [0, 30, 30, 35, 42]


def test_a_file_table_reads_back_the_entries():
    entries = [FileEntry("/d/a", "/d/a", 10, "mtime:1.000000"), FileEntry("bucket/b", "s3://bucket/b", 0, None)]
    table = FileTable(entries)
    assert list(table) == entries and pickle.loads(pickle.dumps(table)) == entries


def test_planning_keeps_no_per_file_python_objects(tmp_path):
    """Per file the catalog keeps a few bytes in arrays and blobs (the path, the tag, the split),
    not a FileEntry, FileLayout, Split and SplitRows with their strings (about 530 bytes)."""
    table = pa.table({"id": np.arange(3, dtype=np.int64)})
    files = 2000
    for i in range(files):
        pq.write_table(table, tmp_path / f"part-{i:05d}.parquet")
    StructuredDataset(str(tmp_path), num_workers=2)  # imports and caches warmed up
    gc.collect()
    tracemalloc.start()
    try:
        dataset = StructuredDataset(str(tmp_path), num_workers=2)
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(dataset.files) == files
    assert held / files < 300, held / files  # (about 200 measured; 530 with an object per record)
