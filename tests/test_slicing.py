"""A chunk cut into batches: split columns and sliced columns give the rows slice_columns gives."""

import pyarrow as pa
import torch

from torch_dataloader_utils import Ragged
from torch_dataloader_utils.read.convert import slice_columns, table_to_columns
from torch_dataloader_utils.read.slicing import BatchSlicer


def _table(rows: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "fixed": pa.array([[i, i + 1] for i in range(rows)], pa.list_(pa.float32())),
            "ragged": pa.array([[i] * (i % 3) for i in range(rows)], pa.list_(pa.int32())),
            "text": pa.array([f"row {i}" for i in range(rows)]),
        }
    )


def _same(a, b) -> bool:
    if isinstance(a, Ragged):
        return isinstance(b, Ragged) and torch.equal(a.values, b.values) and torch.equal(a.offsets, b.offsets)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def test_every_batch_equals_the_slice_of_its_rows_and_shares_the_chunk_memory():
    columns = table_to_columns(_table(10), lambda: "test")
    slicer = BatchSlicer(columns, 4)
    for index, (start, stop) in enumerate([(0, 4), (4, 8), (8, 10)]):
        batch, expected = slicer.batch(index, stop - start), slice_columns(columns, start, stop)
        assert list(batch) == list(expected)
        assert all(_same(batch[name], expected[name]) for name in batch), index
        assert batch["id"].tolist() == list(range(start, stop))
        assert batch["fixed"].shape == (stop - start, 2)
        assert batch["id"].untyped_storage().data_ptr() == columns["id"].untyped_storage().data_ptr()
