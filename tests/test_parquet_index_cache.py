"""_parquet_index_cache: one reader-level cache of decoded page indexes serves filter pruning
(column_pages) and random access's page reads (read_range), each index decoded once; stored
dictionary pages are made on a later use (STORED_FROM_USE) and bounded in bytes."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from datagen import PAGED
from test_parquet_seek import ROWS, _table

from torch_dataloader_utils.formats import _parquet_index_cache
from torch_dataloader_utils.formats._parquet_footer import footer_struct
from torch_dataloader_utils.formats._parquet_index_cache import PageIndexes
from torch_dataloader_utils.formats._parquet_page_index import column_pages
from torch_dataloader_utils.formats._parquet_range import read_range


def test_pruning_and_page_reads_decode_each_index_once(tmp_path, monkeypatch):
    path = tmp_path / "f.parquet"
    pq.write_table(_table(), path, row_group_size=ROWS, **PAGED)
    footer = pq.ParquetFile(path).metadata
    thrift = footer_struct(footer, 0)
    decoded = []
    original = _parquet_index_cache.page_locations
    monkeypatch.setattr(_parquet_index_cache, "page_locations", lambda *args: decoded.append(args[1]) or original(*args))
    indexes = PageIndexes()

    source = pa.OSFile(str(path))
    first = column_pages(source, footer, thrift, 0, ["id"], indexes)["id"][1]
    got = read_range(source, footer, footer.schema.to_arrow_schema(), thrift, 0, ["id", "text"], 100, 110, indexes)
    again = column_pages(source, footer, thrift, 0, ["id", "text"], indexes)
    assert got is not None and got.table.slice(100 - got.first, 10).to_pylist() == _table().select(["id", "text"]).slice(100, 10).to_pylist()
    assert again["id"][1] is first  # the bounds kept
    assert len(decoded) == len(set(decoded)) == 2  # id's offset index once, text's once


def test_dictionaries_are_stored_from_a_later_use_within_a_byte_bound(monkeypatch):
    monkeypatch.setattr(_parquet_index_cache, "KEPT_DICTIONARY_BYTES", 10)
    monkeypatch.setattr(_parquet_index_cache, "STORED_FROM_USE", 2)
    indexes, made = PageIndexes(), []
    make = lambda size: lambda: made.append(size) or b"x" * size  # noqa: E731
    assert indexes.dictionary((0, 0), make(6)) is None and made == []
    assert indexes.dictionary((0, 0), make(6)) == b"x" * 6 and made == [6]
    assert indexes.dictionary((0, 0), make(6)) == b"x" * 6 and made == [6]
    indexes.dictionary((0, 1), make(6))
    assert indexes.dictionary((0, 1), make(6)) == b"x" * 6  # 12 bytes: (0, 0) goes
    assert indexes.dictionary((0, 0), make(6)) is None and made == [6, 6]
