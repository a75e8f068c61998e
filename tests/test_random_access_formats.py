"""Random access with output_format "numpy", "arrow" and "dict": ``dataset[rows]`` is the batch
the loader yields in that format, ``dataset[i]`` that batch's row (each column's item), and
``dataset.rows`` serves them to a DataLoader's workers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from datagen import write_dataset
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from torch_dataloader_utils import StructuredDataset

LAYOUT = [[120, 80], [150]]
ROWS = sum(map(sum, LAYOUT))
COLUMNS = ["text", "vec", "id"]


@pytest.fixture(scope="module", params=["parquet", "orc"])
def data(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    write_dataset(root, LAYOUT, request.param, paged=request.param == "parquet")
    return str(root), request.param


def assert_same(left, right) -> None:
    assert type(left) is type(right)
    if isinstance(left, pa.RecordBatch):
        assert left.equals(right)
        return
    assert list(left) == list(right)
    for name in left:
        a, b = left[name], right[name]
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert [x.tolist() if isinstance(x, np.ndarray) else x for x in a] == [x.tolist() if isinstance(x, np.ndarray) else x for x in b], name
        else:
            assert a == b, name


@pytest.mark.parametrize("output_format", ["numpy", "arrow", "dict"])
def test_a_slice_is_the_batch_the_loader_yields_in_that_format(data, output_format):
    path, fmt = data
    dataset = StructuredDataset(path, fmt, num_workers=0, batch_size=40, columns=COLUMNS, output_format=output_format)
    for number, batch in enumerate(dataset):
        assert_same(dataset[number * 40 : (number + 1) * 40], batch)
        assert_same(dataset[list(range(number * 40, min(ROWS, (number + 1) * 40)))], batch)
    assert number == (ROWS - 1) // 40
    first = next(iter(dataset))
    row = dataset[3]
    assert list(row) == COLUMNS
    if output_format == "arrow":
        assert all(row[name] == first.column(name)[3] and isinstance(row[name], pa.Scalar) for name in COLUMNS)
    elif output_format == "numpy":
        assert row["id"] == first["id"][3] and isinstance(row["id"], np.integer)
        assert row["text"] == first["text"][3] and isinstance(row["text"], str)
        assert row["vec"].tolist() == first["vec"][3].tolist()
    else:
        assert row == {name: first[name][3] for name in COLUMNS}


def test_a_numpy_batch_does_not_alias_the_cache(data):
    path, fmt = data
    dataset = StructuredDataset(path, fmt, num_workers=0, output_format="numpy")
    batch = dataset[0:10]
    batch["id"] += 1000
    assert dataset[0:10]["id"].tolist() == list(range(10))


@pytest.mark.parametrize("output_format", ["numpy", "arrow"])
def test_batches_in_workers_with_a_batch_sampler(tmp_path, output_format):
    write_dataset(tmp_path, LAYOUT)
    dataset = StructuredDataset(str(tmp_path), num_workers=2, output_format=output_format)
    rows = dataset.rows
    loader = DataLoader(rows, sampler=BatchSampler(RandomSampler(rows), 32, drop_last=False), batch_size=None, num_workers=2)
    ids = []
    for batch in loader:
        ids += batch.column("id").to_pylist() if output_format == "arrow" else batch["id"].tolist()
    assert sorted(ids) == list(range(ROWS))
