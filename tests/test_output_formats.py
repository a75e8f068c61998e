"""output_format=: numpy, arrow and dict batches carry the same rows as torch's, built in the
workers, and resume exactly."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest
import torch
from datagen import write_dataset

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.read.output_formats import check_output, prepare_batches, to_numpy_columns
from torch_dataloader_utils.testing import assert_resumes_exactly

LAYOUT = [[23, 31, 17], [40, 9]]
ROWS = sum(map(sum, LAYOUT))
CONFIG = dict(batch_size=8, split_bytes=2500, chunk_rows=24)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("formats")
    write_dataset(root, LAYOUT)
    return str(root)


def ids(batch, fmt: str) -> list[int]:
    if fmt == "arrow":
        return batch.column("id").to_pylist()
    return list(map(int, batch["id"]))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fmt", ["numpy", "arrow", "dict"])
def test_every_format_delivers_the_torch_batches_rows(data, fmt, workers):
    torch_loader, _ = StructuredDataset.create_dataloader(data, num_workers=workers, **CONFIG)
    loader, dataset = StructuredDataset.create_dataloader(data, num_workers=workers, output_format=fmt, **CONFIG)
    assert dataset.output_format == fmt
    pairs = list(zip(torch_loader, loader, strict=True))
    for want, got in pairs:
        assert ids(got, fmt) == want["id"].tolist()
        if fmt == "arrow":
            assert isinstance(got, pa.RecordBatch) and got.schema.names == ["id", "label", "x", "vec", "text"]
            assert got.column("text").to_pylist() == want["text"]
        elif fmt == "numpy":
            assert got["id"].dtype == np.int64 and got["label"].dtype == np.int32
            assert got["vec"].shape == (len(want["id"]), 3) and np.array_equal(got["vec"], want["vec"].numpy())
            assert got["text"].dtype == object and got["text"].tolist() == want["text"]
        else:
            assert got["x"] == want["x"].tolist() and got["text"] == want["text"] and got["vec"] == want["vec"].tolist()
    assert sum(len(ids(got, fmt)) for _, got in pairs) == ROWS


@pytest.mark.parametrize(("fmt", "workers"), [("numpy", 2), ("arrow", 0), ("dict", 2)])
def test_every_format_resumes_exactly(data, fmt, workers):
    def make():
        return StructuredDataset.create_dataloader(data, num_workers=workers, shuffle=True, output_format=fmt, **CONFIG)

    points = None if workers == 0 else [(0, 0), (0, 6), (1, -2)]
    reference = assert_resumes_exactly(make, epochs=2, points=points, deep_stride=4)
    assert len(reference.batches[0]) == len(reference.batches[1]) == len(make()[0])


def test_arrow_batches_pickle_only_their_rows():
    """A worker's batch crosses in a pickle: it must not carry the whole chunk it was cut from."""
    table = pa.table({"id": np.arange(100_000), "text": [str(i) for i in range(100_000)]})
    batches = prepare_batches(table, check_output("arrow", None, 0, 1000), lambda: "", False, lambda a, b: "")
    assert len(batches) == 100 and batches[3].column("id").to_pylist() == list(range(3000, 4000))
    assert len(pickle.dumps(batches[3])) < 40_000


def test_numpy_forms_of_other_types():
    table = pa.table(
        {
            "maybe": pa.array([1, None, 3]),
            "when": pa.array(np.array(["2024-01-01", "2024-01-02", "2024-01-03"], dtype="datetime64[ms]")),
            "words": pa.array([["a"], [], ["b", "c"]]),
            "pair": pa.array([{"a": 1}, {"a": 2}, None], type=pa.struct([("a", pa.int64())])),
        }
    )
    columns = to_numpy_columns(table)
    assert columns["maybe"].dtype == np.float64 and np.isnan(columns["maybe"][1])
    assert columns["when"].dtype == np.dtype("datetime64[ms]")
    assert columns["words"].dtype == object and list(columns["words"][2]) == ["b", "c"]
    assert columns["pair"].tolist() == [{"a": 1}, {"a": 2}, None]


def test_numpy_batches_follow_nulls_fill_and_mask(tmp_path):
    """nulls='fill'/'mask' and fill_values apply to numpy batches as to tensors (they were ignored:
    NaN floats, and no '.valid' arrays although dataset.schema listed them); arrow and dict keep
    their nulls, and their schema lists no masks."""
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "id": pa.array(np.arange(6)),
            "n": pa.array([1, None, 3, None, 5, 6]),
            "f": pa.array([0.5, None, 1.5, 2.0, None, 3.0]),
            "b": pa.array([True, None, False, True, True, None]),
            "t": pa.array([1, None, 3, 4, 5, 6], pa.timestamp("ms", tz="UTC")),
            "d": pa.array([1, 2, None, 4, 5, 6], pa.date32()),
            "v": pa.array([[1.0, 2.0], None, [3.0, None], [4.0, 5.0], [6.0, 7.0], [8.0, 9.0]], pa.list_(pa.float32(), 2)),
            "s": pa.array(["a", None, "c", "d", "e", "f"]),
            "l": pa.array([[1, None], None, [2**53 + 1], [], [4], [5, 6]], pa.list_(pa.int64())),
        }
    )
    pq.write_table(table, tmp_path / "a.parquet")
    fills = {"n": -1, "v": -2.0, "l": 9}
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), batch_size=6, num_workers=2, output_format="numpy", nulls="mask", fill_values=fills)
    (batch,) = list(loader)
    assert list(batch) == dataset.schema.names
    assert batch["n"].dtype == np.int64 and batch["n"].tolist() == [1, -1, 3, -1, 5, 6]
    assert batch["n.valid"].tolist() == [True, False, True, False, True, True]
    assert np.isnan(batch["f"][[1, 4]]).all() and batch["b"].tolist() == [True, False, False, True, True, False]
    assert batch["t"].dtype == np.dtype("datetime64[ms]") and batch["t"][1] == np.datetime64(0, "ms")
    assert batch["d"].dtype == np.dtype("datetime64[D]") and batch["d"][2] == np.datetime64(0, "D")
    assert batch["v"].dtype == np.float32 and batch["v"].tolist() == [[1, 2], [-2, -2], [3, -2], [4, 5], [6, 7], [8, 9]]
    assert batch["s"].tolist() == ["a", None, "c", "d", "e", "f"] and "s.valid" not in batch
    # a variable-length list as a tensor batch's Ragged: null elements filled, a null row empty, no float rounding
    assert [row.dtype for row in batch["l"]] == [np.int64] * 6
    assert [row.tolist() for row in batch["l"]] == [[1, 9], [], [2**53 + 1], [], [4], [5, 6]]
    assert batch["l.valid"].tolist() == [True, False, True, True, True, True]
    rows = dataset[[1, 0]]
    assert rows["n"].tolist() == [-1, 1] and rows["n.valid"].tolist() == [False, True]
    filled = StructuredDataset(str(tmp_path), num_workers=0, output_format="numpy", nulls="fill")
    assert filled[[1]]["n"].tolist() == [0] and "n.valid" not in filled.schema.names
    for output_format in ("arrow", "dict"):
        kept = StructuredDataset(str(tmp_path), num_workers=0, output_format=output_format, nulls="mask")
        assert kept.schema.names == table.column_names
        column = kept[[1]]["n"]
        assert (column.to_pylist() if output_format == "arrow" else column) == [None]


def test_a_device_takes_torch_batches_only(data, monkeypatch):
    from torch_dataloader_utils import loaders

    monkeypatch.setattr(loaders, "check_device", lambda device: torch.device("cuda", 0))  # as on a machine with a GPU
    with pytest.raises(ValueError, match="device= feeds torch batches"):
        StructuredDataset.create_dataloader(data, output_format="arrow", num_workers=0, device="cuda")


def test_bad_output_arguments_are_named(data):
    with pytest.raises(ValueError, match="output_format"):
        StructuredDataset(data, output_format="pandas", num_workers=0)
    loader, _ = StructuredDataset.create_dataloader(data, output_format="numpy", num_workers=0, device=torch.device("cpu"))  # host memory
    assert isinstance(next(iter(loader))["id"], np.ndarray)


@pytest.mark.parametrize("output_format", ["numpy", "dict"])
def test_a_string_that_is_not_utf8_names_the_column_in_every_output_format(tmp_path, output_format):
    (tmp_path / "a.jsonl").write_bytes(b'{"id": 1, "s": "ok"}\n{"id": 2, "s": "caf\xe9"}\n')
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), format="jsonl", num_workers=0, batch_size=4, output_format=output_format)
    with pytest.raises(ValueError, match=r"column 's' of rows read from \S*a.jsonl .*not valid UTF-8"):
        list(loader)


def test_a_value_python_cannot_hold_names_its_column_in_dict_output(tmp_path):
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, 2], "far": pa.array([0, 2**40], pa.timestamp("s"))}), tmp_path / "a.parquet")
    with pytest.raises(ValueError, match=r"column 'far' holds a value that Python cannot hold .* in rows read from \S*a\.parquet"):
        list(StructuredDataset(str(tmp_path), num_workers=0, output_format="dict"))
    assert [b["id"].tolist() for b in StructuredDataset(str(tmp_path), num_workers=0, output_format="numpy")] == [[1, 2]]


def test_numpy_batches_check_mask_and_fill_names_as_tensors_do(tmp_path):
    """nulls= applies to numpy batches: a mask named like a column silently replaced it (the
    nulls of 'x' were lost), and a fill value for a column that does not exist was ignored."""
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": pa.array([1, None, 3]), "x.valid": [7, 8, 9]}), tmp_path / "a.parquet")
    with pytest.raises(ValueError, match=r"would name the masks of \['x'\] like existing columns"):
        StructuredDataset(str(tmp_path), num_workers=0, output_format="numpy", nulls="mask")
    with pytest.raises(ValueError, match="X"):
        StructuredDataset(str(tmp_path), num_workers=0, output_format="numpy", nulls="fill", fill_values={"X": -1}, columns=["x"])
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), batch_size=4, num_workers=0, output_format="numpy", nulls="fill",
                                                    fill_values={"x": -1}, columns=["x"])  # fmt: skip
    assert next(iter(loader))["x"].tolist() == [1, -1, 3]
