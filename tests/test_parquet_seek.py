"""parquet_seek: a row group read from a row through its page index gives exactly the rows a
read from the first row gives from there, for every column kind and page layout; files it
cannot cut are left to the plain read."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils.formats import parquet_seek
from torch_dataloader_utils.formats.parquet import _ParquetReader
from torch_dataloader_utils.formats.parquet_seek import footer_struct, iter_from_row, leaf_columns, worth_seeking

from datagen import PAGED

ROWS = 300


def _table(rows: int = ROWS) -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table(
        {
            "id": pa.array(np.arange(rows)),
            "fixed": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(rows * 4).astype("f4")), 4),
            "text": pa.array([None if i % 11 == 0 else "w" * (i % 37) + str(i) for i in range(rows)]),
            "var": pa.array([None if i % 13 == 0 else list(range(i % 5)) for i in range(rows)], pa.list_(pa.int32())),
            "category": pa.array([f"c{i % 3}" for i in range(rows)]).dictionary_encode(),
            "sparse": pa.array([None if i % 3 else float(i) for i in range(rows)]),
        }
    )


def _rows_from(path, unit: int, row: int, batch_rows: int) -> pa.Table | None:
    footer = pq.ParquetFile(path).metadata
    batches = iter_from_row(pa.OSFile(str(path)), footer, footer_struct(footer), unit, None, row, batch_rows, 4096)
    return None if batches is None else pa.concat_tables(list(batches))


@pytest.mark.parametrize(
    "version, compression, dictionary", list(itertools.product(["1.0", "2.0"], ["zstd", "none"], [True, False]))
)
def test_reading_from_any_row_gives_the_rows_from_there(tmp_path, version, compression, dictionary):
    path = tmp_path / "f.parquet"
    options = dict(data_page_version=version, compression=compression, use_dictionary=dictionary)
    pq.write_table(_table(), path, row_group_size=120, write_page_index=True, data_page_size=256, write_batch_size=7, **options)
    source = pq.ParquetFile(path)
    seeks = 0
    for unit in range(source.metadata.num_row_groups):
        whole = source.read_row_group(unit)
        for row in range(1, whole.num_rows):
            batch_rows = 3 if row % 2 else 64
            got = _rows_from(path, unit, row, batch_rows)
            if got is None:
                continue
            seeks += 1
            assert got.schema == whole.schema
            assert got.to_pylist() == whole.slice(row).to_pylist(), (unit, row, batch_rows)
    assert seeks > 200  # past the first pages, every read seeks


def test_batches_have_the_asked_size_and_start_at_the_row(tmp_path):
    path = tmp_path / "f.parquet"
    pq.write_table(_table(), path, row_group_size=ROWS, **PAGED)
    footer = pq.ParquetFile(path).metadata
    batches = list(iter_from_row(pa.OSFile(str(path)), footer, footer_struct(footer), 0, ["id", "text"], 123, 50, 4096))
    assert [b.num_rows for b in batches] == [50, 50, 50, 27]
    assert batches[0].column("id").to_pylist()[:2] == [123, 124]
    assert batches[0].column_names == ["id", "text"]


def test_files_without_a_page_index_or_rows_in_the_first_pages_are_not_cut(tmp_path):
    plain, paged = tmp_path / "plain.parquet", tmp_path / "paged.parquet"
    pq.write_table(_table(), plain, row_group_size=ROWS)
    pq.write_table(_table(), paged, row_group_size=ROWS, **PAGED)
    assert _rows_from(plain, 0, 200, 10) is None
    assert _rows_from(paged, 0, 0, 10) is None
    assert _rows_from(paged, 0, 1, 10) is None  # row 1 is in every column's first page
    assert _rows_from(paged, 0, 200, 10) is not None


def test_struct_columns_are_not_cut_but_the_others_are(tmp_path):
    path = tmp_path / "f.parquet"
    table = _table().append_column("pair", pa.StructArray.from_arrays([pa.array(range(ROWS)), pa.array(range(ROWS))], ["a", "b"]))
    pq.write_table(table, path, row_group_size=ROWS, **PAGED)
    footer = pq.ParquetFile(path).metadata
    assert leaf_columns(footer, None) is None
    assert leaf_columns(footer, ["id", "pair"]) is None
    assert leaf_columns(footer, ["text", "id"]) == {"id": 0, "text": 2}  # fixed's one leaf comes between
    got = iter_from_row(pa.OSFile(str(path)), footer, footer_struct(footer), 0, ["id", "text"], 200, 64, 4096)
    assert pa.concat_tables(list(got)).to_pylist() == table.select(["id", "text"]).slice(200).to_pylist()


def test_worth_seeking_weighs_the_footer_against_the_rows_skipped(tmp_path, monkeypatch):
    plain, paged = tmp_path / "plain.parquet", tmp_path / "paged.parquet"
    pq.write_table(_table(), plain, row_group_size=ROWS)
    pq.write_table(_table(), paged, row_group_size=ROWS, **PAGED)
    footer = pq.ParquetFile(paged).metadata
    assert not worth_seeking(footer, 0, ["id"], 200)  # a footer of ~3 KB for 200 rows
    monkeypatch.setattr(parquet_seek, "FOOTER_BYTES_PER_ROW", 100)
    assert worth_seeking(footer, 0, ["id"], 200)
    assert not worth_seeking(pq.ParquetFile(plain).metadata, 0, ["id"], 200)


def _offset_index_range(path, leaf: int) -> tuple[int, int]:
    chunk = footer_struct(pq.ParquetFile(path).metadata).get(4).values[0].get(1).values[leaf]
    return chunk.get(4), chunk.get(5)


@pytest.mark.parametrize("damage", [b"\xff", b"\x00"])
def test_a_damaged_page_index_falls_back_to_the_plain_read(tmp_path, monkeypatch, damage):
    path = tmp_path / "f.parquet"
    pq.write_table(_table(), path, row_group_size=ROWS, **PAGED)
    offset, length = _offset_index_range(path, 0)
    data = bytearray(path.read_bytes())
    data[offset : offset + length] = damage * length
    path.write_bytes(bytes(data))
    monkeypatch.setattr(parquet_seek, "FOOTER_BYTES_PER_ROW", 100)
    footer = pq.ParquetFile(path).metadata
    reader = _ParquetReader(pa.OSFile(str(path)), footer, False)
    got = pa.concat_tables(list(reader.iter_unit(0, ["id", "var"], 64, 200)))
    assert got.to_pylist() == _table().select(["id", "var"]).slice(200).to_pylist()


@pytest.mark.parametrize("paged", [False, True])
def test_the_local_reader_reads_from_any_row(tmp_path, monkeypatch, paged):
    path = tmp_path / "f.parquet"
    pq.write_table(_table(), path, row_group_size=ROWS, **(PAGED if paged else {}))
    monkeypatch.setattr(parquet_seek, "FOOTER_BYTES_PER_ROW", 100)
    footer = pq.ParquetFile(path).metadata
    reader = _ParquetReader(pa.OSFile(str(path)), footer, False)
    for row in range(ROWS):
        batches = list(reader.iter_unit(0, None, 64, row))
        assert all(b.num_rows <= 64 for b in batches)
        assert pa.concat_tables(batches).to_pylist() == _table().slice(row).to_pylist(), row
