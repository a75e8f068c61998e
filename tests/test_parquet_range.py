"""parquet_range: rows [start, stop) of a row group decoded from the pages that hold them give
exactly pyarrow's own read, for every column kind and page layout, locally and from an object
store's fetched ranges; a page index that does not match its pages never gives wrong rows."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datagen import PAGED
from test_parquet_seek import _DAMAGES, ROWS, _table, write_damaged

from torch_dataloader_utils.formats import _parquet_dictionary, _parquet_index_cache
from torch_dataloader_utils.formats._parquet_footer import footer_struct
from torch_dataloader_utils.formats._parquet_index_cache import PageIndexes
from torch_dataloader_utils.formats._parquet_range import read_range
from torch_dataloader_utils.formats.parquet import _ParquetReader


class _Fetched:
    """A file that serves only the byte ranges announced by ``fetch`` (as a remote file holds
    only what it fetched)."""

    def __init__(self, path):
        self._file = pa.OSFile(str(path))
        self.ranges: list[tuple[int, int]] = []

    def fetch(self, ranges: list[tuple[int, int]]) -> None:
        self.ranges += ranges

    def read_at(self, nbytes: int, offset: int) -> bytes:
        assert any(start <= offset and offset + nbytes <= end for start, end in self.ranges), (offset, nbytes)
        return self._file.read_at(nbytes, offset)


def _read(path, unit, columns, start, stop, fetching=False, indexes=None):
    footer = pq.ParquetFile(path).metadata
    source = _Fetched(path) if fetching else pa.OSFile(str(path))
    fetch = source.fetch if fetching else None
    return read_range(source, footer, footer.schema.to_arrow_schema(), footer_struct(footer, unit), unit, columns, start, stop, indexes or PageIndexes(), fetch)


@pytest.mark.parametrize(
    "version, dictionary, fetching, compression", [("1.0", True, False, "zstd"), ("2.0", False, False, "snappy"), ("1.0", False, True, "snappy"), ("2.0", True, True, "zstd")]
)
def test_any_rows_match_pyarrows_read(tmp_path, monkeypatch, version, dictionary, fetching, compression):
    """(zstd: every dictionary page goes in with its values stored from its second use on (STORED_FROM_USE set to 2).)"""
    monkeypatch.setattr(_parquet_dictionary, "MIN_VALUE_BYTES", 0)
    monkeypatch.setattr(_parquet_index_cache, "STORED_FROM_USE", 2)
    path = tmp_path / "f.parquet"
    pq.write_table(_table(), path, row_group_size=120, data_page_version=version, use_dictionary=dictionary, compression=compression, **PAGED)
    whole = pq.ParquetFile(path)
    indexes = PageIndexes()  # kept across reads, as a reader keeps them
    for unit in range(whole.metadata.num_row_groups):
        expected = whole.read_row_group(unit)
        for start in range(0, expected.num_rows, 7):
            for stop in (start + 1, min(expected.num_rows, start + 23)):
                got = _read(path, unit, None, start, stop, fetching, indexes)
                assert got is not None and got.unit_rows == expected.num_rows
                assert got.first <= start and got.first + got.table.num_rows >= stop
                assert got.table.schema == expected.schema
                assert got.table.to_pylist() == expected.slice(got.first, got.table.num_rows).to_pylist(), (unit, start, stop)


def test_only_the_pages_holding_the_rows_are_decoded(tmp_path):
    path = tmp_path / "f.parquet"
    pq.write_table(_table(), path, row_group_size=ROWS, **PAGED)
    got = _read(path, 0, ["id", "text"], 200, 210)
    assert got.first > 150 and got.first + got.table.num_rows < 230
    assert got.table.column_names == ["id", "text"]
    assert got.table.column("id").to_pylist() == list(range(got.first, got.first + got.table.num_rows))


def test_files_it_cannot_read_so_return_none(tmp_path):
    plain = tmp_path / "plain.parquet"
    pq.write_table(_table(), plain, row_group_size=ROWS)
    assert _read(plain, 0, None, 200, 210) is None  # no page index
    nested = tmp_path / "nested.parquet"
    table = _table().append_column("pair", pa.StructArray.from_arrays([pa.array(range(ROWS)), pa.array(range(ROWS))], ["a", "b"]))
    pq.write_table(table, nested, row_group_size=ROWS, **PAGED)
    assert _read(nested, 0, ["id", "pair"], 200, 210) is None  # a struct has several leaves
    assert _read(nested, 0, ["id"], 200, 210) is not None
    assert _read(nested, 0, ["id"], 200, ROWS + 1) is None  # past the row group: the file changed


@pytest.mark.parametrize("damage", list(_DAMAGES))
def test_a_damaged_page_index_never_gives_wrong_rows(tmp_path, damage):
    path = write_damaged(tmp_path / "f.parquet", damage)
    columns = ["id", "fixed", "var"]
    expected = _table().select(columns)
    reader = _ParquetReader(pa.OSFile(str(path)), pq.ParquetFile(path).metadata, False)
    got = reader.read_rows(0, columns, 200, 230)  # None: the caller reads another way
    if got is not None:
        assert got.table.to_pylist() == expected.slice(got.first, got.table.num_rows).to_pylist()


def test_a_forked_child_decodes_on_threads_of_its_own(tmp_path, seek_tiny_files):
    """The main process's reader, inherited by a forked DataLoader worker, decodes there too."""
    import multiprocessing

    from torch_dataloader_utils.formats import _parquet_range as parquet_range

    path = tmp_path / "f.parquet"
    pq.write_table(_table(), path, row_group_size=ROWS, write_page_index=True, data_page_size=200, write_batch_size=5)
    reader = _ParquetReader(pa.OSFile(str(path)), pq.ParquetFile(path).metadata, True)
    columns = ["id", "text", "fixed"]
    firsts = {name: reader.read_rows(0, [name], 203, 204).first for name in columns}
    assert len(set(firsts.values())) > 1  # the columns' pages start at different rows: decoded on threads
    assert reader.read_rows(0, columns, 203, 230) is not None and parquet_range._POOL is not None
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_read_in_child, args=(reader, columns, results))  # (forked: nothing pickled)
    child.start()
    first, rows = results.get(timeout=60)
    child.join(timeout=60)
    assert rows == _table().select(columns).slice(first, len(rows)).to_pylist()


def _read_in_child(reader, columns, results):
    decoded = reader.read_rows(0, columns, 103, 130)
    results.put((decoded.first, decoded.table.to_pylist()))
