"""Random access (issue 31) as a user meets it on files other writers made: DuckDB, Polars and
fastparquet files through every key form, indices numpy cannot hold, and ``tdu rows`` on data
with nulls in number columns."""

from __future__ import annotations

import datetime
import decimal
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from cli_helpers import run
from test_real_files import _as_python, _expected, _same

from torch_dataloader_utils import StructuredDataset

ROWS = 300


def _table() -> pa.Table:
    ids = list(range(ROWS))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "x": pa.array([None if i % 11 == 0 else i / 4 for i in ids], pa.float64()),
            "s": pa.array([None if i % 5 == 0 else f"s{i % 17}" for i in ids]),
            "b": pa.array([bytes([i % 256, 1]) for i in ids], pa.binary()),
            "dec": pa.array([decimal.Decimal(i) / 100 for i in ids], pa.decimal128(10, 2)),
            "ts": pa.array([datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(seconds=i) for i in ids], pa.timestamp("us", tz="UTC")),
            "l": pa.array([list(range(i % 4)) for i in ids], pa.list_(pa.int32())),
        }
    )


def _duckdb(table: pa.Table, path: pathlib.Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    connection = duckdb.connect()
    connection.register("source", table)
    connection.execute(f"COPY source TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 100)")


def _polars(table: pa.Table, path: pathlib.Path) -> None:
    pytest.importorskip("polars").from_arrow(table).write_parquet(path, row_group_size=70)


def _fastparquet(table: pa.Table, path: pathlib.Path) -> None:
    pytest.importorskip("fastparquet")
    table.select(["id", "x", "s", "b"]).to_pandas().to_parquet(path, engine="fastparquet", index=False, row_group_offsets=70)


def _pyarrow_v1_no_statistics(table: pa.Table, path: pathlib.Path) -> None:
    pq.write_table(table, path, row_group_size=45, data_page_version="1.0", use_dictionary=False, write_statistics=False)


WRITERS = {"duckdb": _duckdb, "polars": _polars, "fastparquet": _fastparquet, "pyarrow-v1-no-statistics": _pyarrow_v1_no_statistics}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_key_form_equals_pyarrows_read_of_another_writers_file(tmp_path, writer):
    path = tmp_path / f"{writer}.parquet"
    WRITERS[writer](_table(), path)
    dataset = StructuredDataset(str(path), num_workers=0, nulls="fill")
    table = pq.read_table(path)
    assert dataset.num_rows == table.num_rows == ROWS
    rng = np.random.default_rng(7)
    keys = [slice(None, None, -7), [5, 3, 3, -1], np.array([ROWS - 1, 0, 150]), torch.tensor(rng.integers(0, ROWS, 40)), slice(ROWS - 5, ROWS + 50)]
    for name in dataset.schema.names:
        want = _expected(table.column(name))
        for key in keys:
            rows = range(ROWS)[key] if isinstance(key, slice) else [int(i) for i in key]
            assert _same(_as_python(dataset[key][name]), [want[i] for i in rows]), (writer, name, key)
        for i in (0, 149, -1):
            value = dataset[i][name]
            assert _same(value.tolist() if isinstance(value, torch.Tensor) else value, want[i]), (writer, name, i)


def test_an_index_numpy_cannot_hold_is_an_index_error(tmp_path):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": pa.array(range(10), pa.int64())}), path)
    dataset = StructuredDataset(str(path), num_workers=0)
    for key in (2**70, -(2**70), 2**63, [0, 2**64 - 1], [2**63], [2**80]):
        with pytest.raises(IndexError, match=r"row index -?\d+ is out of range for a dataset of 10 rows"):
            dataset[key]
    assert dataset[[np.uint64(3), -1]]["id"].tolist() == [3, 9]  # numpy would make that list float64


def test_tdu_rows_prints_nulls_of_number_columns_as_none(tmp_path, capsys):
    path = tmp_path / "duckdb.parquet"
    _duckdb(_table(), path)
    code, out, err = run(capsys, "rows", path, "0,1", "--columns", "id,x,s")
    assert code == 0, err
    assert out.splitlines()[1:4] == ["  id: 0", "  x: None", "  s: None"]
    assert "x.valid" not in out and "  x: 0.25" in out
    code, out, err = run(capsys, "rows", path, "0", "--json")
    assert code == 0 and '"x": null' in out and ".valid" not in out
    clash = tmp_path / "clash.parquet"  # a column already named like a mask: printed as stored
    pq.write_table(pa.table({"x": [1, 2], "x.valid": [True, False]}), clash)
    code, out, err = run(capsys, "rows", clash, "1")
    assert code == 0 and out.splitlines()[1:] == ["  x: 2", "  x.valid: False"], err


def test_tdu_rows_refuses_a_range_that_selects_no_row(tmp_path, capsys):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": pa.array(range(1000), pa.int64())}), path)
    code, out, err = run(capsys, "rows", path, "1000:1010")
    assert code == 2 and out == ""
    assert "1000:1010 selects no row of the dataset's 1,000 rows" in err
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"id": pa.array([], pa.int64())}), empty)
    code, out, err = run(capsys, "rows", empty, "0:5")
    assert code == 2 and "0:5 selects no row: the dataset has no rows" in err and "-0" not in err
