"""tables/files.py and tables/deletes.py without a catalog: a data file read as a table sees it
(dropped rows, columns by field id, constant partition columns), unit by unit and from any row."""

from __future__ import annotations

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils.formats import get_format
from torch_dataloader_utils.tables.deletes import merge_dropped, unmatched_rows
from torch_dataloader_utils.tables.files import TableFile, TableFileFormat, physical_row

SCHEMA = pa.schema([("id", pa.int64()), ("half", pa.float64()), ("region", pa.string())])


@pytest.fixture
def data_file(tmp_path):
    """300 rows in row groups of 100; columns "id" (field id 1) and "x" (field id 2, "half" in the table)."""
    path = str(tmp_path / "f.parquet")
    schema = pa.schema(
        [pa.field("id", pa.int64(), metadata={"PARQUET:field_id": "1"}), pa.field("x", pa.float64(), metadata={"PARQUET:field_id": "2"})]
    )
    ids = np.arange(300, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "x": ids * 0.5}, schema=schema), path, row_group_size=100)
    return path


def _open(path, dropped, constants=None):
    file = TableFile(path, merge_dropped(np.array(dropped, dtype=np.int64)), {1: "id", 2: "half"}, constants or {})
    fmt = TableFileFormat(get_format("parquet"), {path: file}, SCHEMA)
    fs = fsspec.filesystem("file")
    layout, footer = fmt.read_footer(fs, path, 0, path)
    return layout, fmt.schema(fs, path, footer), fmt.open(fs, path, footer, use_threads=False)


def test_units_count_kept_rows_and_read_them(data_file):
    dropped = [0, 5, 99, 100, 101, *range(200, 300)]
    layout, schema, reader = _open(data_file, dropped, {"region": pa.scalar("eu")})
    assert layout.unit_rows == (97, 98, 0)
    assert schema.names == ["id", "half", "region"]
    kept = [i for i in range(300) if i not in set(dropped)]
    read = [reader.read_unit(u, None) for u in range(3)]
    assert sum((t.column("id").to_pylist() for t in read), []) == kept
    assert read[0].column("half").to_pylist() == [i * 0.5 for i in kept[:97]]
    assert set(read[1].column("region").to_pylist()) == {"eu"}
    assert reader.read_unit(1, ["region"]).column_names == ["region"] and reader.read_unit(1, ["region"]).num_rows == 98


@pytest.mark.parametrize("first", [0, 1, 4, 5, 50, 91])
def test_iter_unit_from_any_kept_row(data_file, first):
    """Decoding from kept row ``first`` in small batches gives the read_unit rows from there."""
    _, _, reader = _open(data_file, [0, 1, 5, 6, 7, 40, 98, 99])
    whole = reader.read_unit(0, ["id", "half"])
    batches = list(reader.iter_unit(0, ["id", "half"], batch_rows=7, first_row=first))
    assert pa.concat_tables(batches).equals(whole.slice(first))


def test_physical_row_skips_deleted_rows():
    gone = np.array([0, 1, 5, 6, 7])
    kept = [r for r in range(12) if r not in set(gone)]
    assert [physical_row(gone, k) for k in range(len(kept))] == kept


def test_a_delete_past_the_file_end_is_an_error(data_file):
    with pytest.raises(ValueError, match="deletes row 300 but the file has 300 rows"):
        _open(data_file, [300])


def test_unmatched_rows_reads_columns_by_table_name(data_file):
    file = TableFile(data_file, np.zeros(0, dtype=np.int64), {1: "id", 2: "half"}, {"region": pa.scalar("eu")})
    fs = fsspec.filesystem("file")
    gone = unmatched_rows(fs, file, (pc.field("half") >= 100) & (pc.field("region") == "eu"), SCHEMA)
    assert gone.tolist() == list(range(200))


def test_merge_dropped():
    assert merge_dropped(np.array([5, 1, 3]), np.array([3, 9])).tolist() == [1, 3, 5, 9]
    assert merge_dropped().tolist() == [] and merge_dropped(np.array([2, 2])).tolist() == [2]
