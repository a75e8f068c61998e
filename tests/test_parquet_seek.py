"""parquet_seek: a row group read from a row through its page index gives exactly the rows a
read from the first row gives from there, for every column kind and page layout; files it
cannot cut are left to the plain read."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datagen import PAGED, offset_index_range, rewrite_page_index, set_location

from torch_dataloader_utils.formats import _parquet_seek as parquet_seek
from torch_dataloader_utils.formats._parquet_seek import decode_batch_rows, footer_struct, iter_from_row, leaf_columns, offset_index_ranges, worth_seeking
from torch_dataloader_utils.formats._thrift_compact import I32, Struct, ThriftError, ThriftList, encode_struct
from torch_dataloader_utils.formats.parquet import _ParquetReader

ROWS = 300


@pytest.fixture(autouse=True)
def _seek_tiny_files(seek_tiny_files):
    """These files are tiny: seek whatever the footer, page index and headers cost."""


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


class _FetchedOnly:
    """A file that serves only the byte ranges announced: the page indexes, then what
    ``iter_from_row`` passes to ``fetch`` (as a remote file holds only what it fetched)."""

    def __init__(self, path, ranges: list[tuple[int, int]]):
        self._file = pa.OSFile(str(path))
        self.ranges = list(ranges)

    def fetch(self, ranges: list[tuple[int, int]]) -> None:
        self.ranges += ranges

    def read_at(self, nbytes: int, offset: int) -> bytes:
        assert any(start <= offset and offset + nbytes <= end for start, end in self.ranges), (offset, nbytes, self.ranges)
        return self._file.read_at(nbytes, offset)


def _rows_from(path, unit: int, row: int, batch_rows: int, fetching: bool = False) -> pa.Table | None:
    footer = pq.ParquetFile(path).metadata
    thrift = footer_struct(footer, unit)
    if fetching:
        source = _FetchedOnly(path, offset_index_ranges(footer, thrift, unit, None))
        batches = iter_from_row(source, footer, thrift, unit, None, row, batch_rows, 0, source.fetch)
    else:
        batches = iter_from_row(pa.OSFile(str(path)), footer, thrift, unit, None, row, batch_rows, 4096)
    return None if batches is None else pa.concat_tables(list(batches))


@pytest.mark.parametrize(
    "version, compression, dictionary, fetching",
    list(itertools.product(["1.0", "2.0"], ["zstd", "none"], [True, False], [False])) + [("1.0", "zstd", True, True), ("2.0", "none", False, True)],
)
def test_reading_from_any_row_gives_the_rows_from_there(tmp_path, version, compression, dictionary, fetching):
    """Every row of every row group; ``fetching``: as from an object store, reading only the
    page indexes and then the bytes announced (the dictionary and kept pages, or whole chunks)."""
    path = tmp_path / "f.parquet"
    options = dict(data_page_version=version, compression=compression, use_dictionary=dictionary)
    pq.write_table(_table(), path, row_group_size=120, write_page_index=True, data_page_size=256, write_batch_size=7, **options)
    source = pq.ParquetFile(path)
    seeks = 0
    for unit in range(source.metadata.num_row_groups):
        whole = source.read_row_group(unit)
        for row in range(1, whole.num_rows):
            batch_rows = 3 if row % 2 else 64
            got = _rows_from(path, unit, row, batch_rows, fetching)
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
    batches = list(iter_from_row(pa.OSFile(str(path)), footer, footer_struct(footer, 0), 0, ["id", "text"], 123, 50, 4096))
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
    assert list(leaf_columns(footer, ["text", "id"]).items()) == [("text", 2), ("id", 0)]  # fixed's one leaf comes between
    assert leaf_columns(footer, ["id", "pair.a"]) is None  # a nested path: left to pyarrow
    got = iter_from_row(pa.OSFile(str(path)), footer, footer_struct(footer, 0), 0, ["text", "id"], 200, 64, 4096)
    assert pa.concat_tables(list(got)).to_pylist() == table.select(["text", "id"]).slice(200).to_pylist()


def test_schema_metadata_is_kept(tmp_path):
    path = tmp_path / "f.parquet"
    pq.write_table(_table().replace_schema_metadata({"k": "v"}), path, row_group_size=ROWS, **PAGED)
    got = _rows_from(path, 0, 200, 64)
    assert got.schema.metadata == pq.ParquetFile(path).read_row_group(0).schema.metadata
    assert got.schema.metadata[b"k"] == b"v"


@pytest.mark.parametrize("store_schema", [True, False])
def test_columns_keep_their_types_and_metadata_after_nested_columns(tmp_path, store_schema):
    """A cut file holds the projected columns' schema alone: columns after a struct, a map and a
    list, types that only the stored Arrow schema gives back (a time zone, a large string, a
    fixed-size list) and field metadata come out as from the whole row group; so do files
    written without an Arrow schema."""
    rng = np.random.default_rng(1)
    table = pa.table(
        {
            "pair": pa.StructArray.from_arrays([pa.array(range(ROWS)), pa.array(range(ROWS))], ["a", "b"]),
            "tags": pa.array([[("k", i)] for i in range(ROWS)], pa.map_(pa.string(), pa.int64())),
            "var": pa.array([list(range(i % 4)) for i in range(ROWS)], pa.list_(pa.int16())),
            "id": pa.array(np.arange(ROWS)),
            "when": pa.array(np.arange(ROWS) * 1000, pa.timestamp("ms", tz="Europe/Paris")),
            "big": pa.array(["x" * (i % 9) for i in range(ROWS)], pa.large_string()),
            "price": pa.array([i / 100 for i in range(ROWS)]).cast(pa.decimal128(10, 2)),
            "fixed": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(ROWS * 2).astype("f4")), 2),
        }
    )
    fields = [field.with_metadata({"unit": "row"}) if field.name == "id" else field for field in table.schema]
    table = table.cast(pa.schema(fields))
    path = tmp_path / "f.parquet"
    pq.write_table(table, path, row_group_size=ROWS, store_schema=store_schema, **PAGED)
    columns = ["fixed", "price", "big", "when", "id", "var"]
    whole = pq.ParquetFile(path).read_row_group(0, columns=columns)
    footer = pq.ParquetFile(path).metadata
    for row in (150, ROWS - 1):  # (row 1 is in every column's first page: not cut)
        got = pa.concat_tables(list(iter_from_row(pa.OSFile(str(path)), footer, footer_struct(footer, 0), 0, columns, row, 64, 4096)))
        assert got.schema.equals(whole.schema, check_metadata=True), (row, got.schema, whole.schema)
        assert got.to_pylist() == whole.slice(row).to_pylist(), row
    assert (whole.schema.field("big").type == pa.large_string()) == store_schema


@pytest.mark.parametrize("lead, batch_rows", [(0, 64), (5, 64), (63, 64), (64, 64), (5869, 4096), (16589, 4096), (10**6, 4096)])
def test_decode_batches_stay_within_batch_rows_and_end_near_the_first_wanted_rows(lead, batch_rows):
    size = decode_batch_rows(lead, batch_rows)
    batches = -(-(lead + batch_rows) // size)  # decoded until the first batch_rows wanted rows are in
    assert size <= batch_rows
    assert batches * size - (lead + batch_rows) < batches  # at most one extra row per batch


def test_page_headers_that_cost_more_than_the_bytes_saved_leave_the_column_whole(tmp_path, monkeypatch):
    path = tmp_path / "f.parquet"
    pq.write_table(_table(), path, row_group_size=ROWS, **PAGED)  # pages of 2 to 5 rows: tiny
    monkeypatch.setattr(parquet_seek, "HEADER_COST", 64 * 1024)
    assert _rows_from(path, 0, 150, 64) is None  # every column whole: nothing to gain
    monkeypatch.setattr(parquet_seek, "HEADER_COST", 0)
    assert _rows_from(path, 0, 150, 64).to_pylist() == _table().slice(150).to_pylist()
    seeked = set()
    for cost in (50, 200, 1000):  # some columns cut, others read whole and trimmed
        monkeypatch.setattr(parquet_seek, "HEADER_COST", cost)
        for row in (100, 200, 299):
            got = _rows_from(path, 0, row, 64)
            assert got is None or got.to_pylist() == _table().slice(row).to_pylist(), (cost, row)
            seeked.add(got is not None)
    assert seeked == {True, False}


def test_worth_seeking_weighs_the_footer_against_the_bytes_before_the_row(tmp_path, monkeypatch):
    plain, paged = tmp_path / "plain.parquet", tmp_path / "paged.parquet"
    pq.write_table(_table(), plain, row_group_size=ROWS)
    pq.write_table(_table(), paged, row_group_size=ROWS, **PAGED)
    footer = pq.ParquetFile(paged).metadata
    monkeypatch.setattr(parquet_seek, "THRIFT_BYTE_COST", 128)
    monkeypatch.setattr(parquet_seek, "THRIFT_SKIP_BYTE_COST", 0)
    assert not worth_seeking(footer, 0, ["id"], 200)  # a footer of ~3 KB against ~2 KB of ids
    monkeypatch.setattr(parquet_seek, "THRIFT_BYTE_COST", 0)
    assert worth_seeking(footer, 0, ["id"], 200)
    assert not worth_seeking(pq.ParquetFile(plain).metadata, 0, ["id"], 200)
    monkeypatch.setattr(parquet_seek, "THRIFT_SKIP_BYTE_COST", 128)  # (every byte is skipped or decoded)
    assert not worth_seeking(footer, 0, ["id"], 200)


def test_the_footer_cost_charges_one_row_group_decoded_and_the_others_skipped(tmp_path, monkeypatch):
    path = tmp_path / "f.parquet"
    pq.write_table(_table(), path, row_group_size=ROWS // 10)
    footer = pq.ParquetFile(path).metadata
    size = footer.serialized_size
    monkeypatch.setattr(parquet_seek, "THRIFT_BYTE_COST", 100)
    monkeypatch.setattr(parquet_seek, "THRIFT_SKIP_BYTE_COST", 10)
    assert parquet_seek.footer_cost(footer) == size * 10 + size // 10 * 100


def _shift_page_30(locations: list[Struct]) -> None:
    """Page 30's first row moved from 150 to 153."""
    assert locations[30].get(3) == 150
    set_location(locations[30], 3, 153)


def _resize_kept_page(locations: list[Struct]) -> None:
    """The page holding row 200 said to start one byte later (and to be one byte shorter), the
    page before it one byte longer."""
    page = max(i for i, location in enumerate(locations) if location.get(3) <= 200)
    set_location(locations[page - 1], 2, locations[page - 1].get(2) + 1)
    set_location(locations[page], 1, locations[page].get(1) + 1)
    set_location(locations[page], 2, locations[page].get(2) - 1)


def _shift_kept_page(locations: list[Struct]) -> None:
    """The page holding row 200 said to start one row later (still at or before 200), or, if it
    starts at 200, one row earlier."""
    page = max(i for i, location in enumerate(locations) if location.get(3) <= 200)
    first = locations[page].get(3)
    shift = 1 if first < 200 else -1
    assert locations[page - 1].get(3) < first + shift < locations[page + 1].get(3)
    set_location(locations[page], 3, first + shift)


_NOT_AN_OFFSET_INDEX = encode_struct(Struct([[1, 9, ThriftList(I32, [1, 2, 3])]]))  # a list of i32, not of structs
_DAMAGES = {  # name: (leaf column, bytes of the same length, or a change of the page locations)
    "ff": (0, lambda length: b"\xff" * length),
    "00": (0, lambda length: b"\x00" * length),
    "deep lists": (0, lambda length: b"\x19" * length),  # lists of lists, nested past any limit
    "other struct": (0, lambda length: _NOT_AN_OFFSET_INDEX.ljust(length, b"\x00")),
    "shifted row": (0, _shift_page_30),
    "resized page": (0, _resize_kept_page),
    "shifted list row": (3, _shift_kept_page),  # "var": V1 pages of a list column count no rows
    "shifted fixed-list row": (1, _shift_kept_page),  # "fixed": V1 pages count 4 values a row
}


def write_damaged(path, damage: str):
    """``_table()`` written with a page index, then damaged as ``_DAMAGES[damage]`` says."""
    pq.write_table(_table(), path, row_group_size=ROWS, **PAGED)
    leaf, change = _DAMAGES[damage]
    if damage in ("ff", "00", "deep lists", "other struct"):
        offset, length = offset_index_range(path, leaf)
        data = bytearray(path.read_bytes())
        data[offset : offset + length] = change(length)
        path.write_bytes(bytes(data))
    else:
        rewrite_page_index(path, leaf, change)
    return path


@pytest.mark.parametrize("fetching", [False, True])
@pytest.mark.parametrize("damage", list(_DAMAGES))
def test_a_damaged_page_index_falls_back_to_the_plain_read(tmp_path, damage, fetching):
    """The read is right or falls back (ThriftError) whatever the damage; ``fetching``: as from
    an object store, reading only the bytes announced."""
    path = write_damaged(tmp_path / "f.parquet", damage)
    footer = pq.ParquetFile(path).metadata
    columns = ["id", "fixed", "var"]
    expected = _table().select(columns).slice(200).to_pylist()
    if fetching:
        thrift = footer_struct(footer, 0)
        source = _FetchedOnly(path, offset_index_ranges(footer, thrift, 0, columns))
        try:
            batches = iter_from_row(source, footer, thrift, 0, columns, 200, 64, 0, source.fetch)
        except ThriftError:
            batches = None
        if batches is not None:
            assert pa.concat_tables(list(batches)).to_pylist() == expected
        return
    reader = _ParquetReader(pa.OSFile(str(path)), footer, False)
    assert pa.concat_tables(list(reader.iter_unit(0, columns, 64, 200))).to_pylist() == expected


def test_v1_pages_tell_rows_for_flat_columns_and_fixed_size_lists_without_nulls(tmp_path):
    """What lets a V1 page header's value count be checked against the rows of a cut."""
    table = _table().append_column("holey", pa.array([None if i % 7 == 0 else [1.0, 2.0] for i in range(ROWS)], pa.list_(pa.float64(), 2)))
    pq.write_table(table, tmp_path / "f.parquet", **PAGED)
    footer = pq.ParquetFile(tmp_path / "f.parquet").metadata
    schema, leaves = footer.schema.to_arrow_schema(), leaf_columns(footer, None)
    per_row = {name: parquet_seek._values_per_row(footer, 0, leaf, schema.field(name).type) for name, leaf in leaves.items()}
    assert per_row == {"id": 1, "fixed": 4, "text": 1, "var": None, "category": 1, "sparse": 1, "holey": None}


@pytest.mark.parametrize("paged", [False, True])
def test_the_local_reader_reads_from_any_row(tmp_path, monkeypatch, paged):
    path = tmp_path / "f.parquet"
    pq.write_table(_table(), path, row_group_size=ROWS, **(PAGED if paged else {}))
    footer = pq.ParquetFile(path).metadata
    reader = _ParquetReader(pa.OSFile(str(path)), footer, False)
    for row in range(ROWS):
        batches = list(reader.iter_unit(0, None, 64, row))
        assert all(b.num_rows <= 64 for b in batches)
        assert pa.concat_tables(batches).to_pylist() == _table().slice(row).to_pylist(), row


def test_footer_bytes_are_the_serialised_footer_or_none(tmp_path):
    path, other = tmp_path / "f.parquet", tmp_path / "other.parquet"
    pq.write_table(_table(), path, row_group_size=100, **PAGED)
    pq.write_table(_table(ROWS // 2), other, **PAGED)
    footer = pq.ParquetFile(path).metadata
    sink = pa.BufferOutputStream()
    footer.write_metadata_file(sink)
    assert parquet_seek.footer_bytes(pa.OSFile(str(path)), footer) == sink.getvalue().to_pybytes()[4:-8]
    assert parquet_seek.footer_bytes(pa.OSFile(str(other)), footer) is None  # another footer's size
    for unit in range(3):
        assert encode_struct(
            parquet_seek.row_group(footer_struct(footer, unit, parquet_seek.footer_bytes(pa.OSFile(str(path)), footer)), unit)
        ) == encode_struct(parquet_seek.row_group(footer_struct(footer, unit), unit))


def test_leaf_elements_with_zero_children_are_leaves(tmp_path):
    """Some writers set num_children = 0 on leaf schema elements (parquet-cpp reads an element
    with a type and no children as a leaf): the cut file's schema must still be each column's."""
    source, path = tmp_path / "plain.parquet", tmp_path / "zero.parquet"
    table = pa.table({"a": np.arange(ROWS), "b": np.arange(ROWS) * 2, "s": [f"v{i}" for i in range(ROWS)]})
    pq.write_table(table, source, row_group_size=ROWS, **PAGED)
    data = source.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    footer = parquet_seek.decode_struct(data[-8 - length : -8])[0]
    for element in footer.structs(2)[1:]:
        element.set(5, I32, 0)
    encoded = encode_struct(footer)
    path.write_bytes(data[: -8 - length] + encoded + len(encoded).to_bytes(4, "little") + b"PAR1")
    metadata = pq.ParquetFile(path).metadata
    for columns in (["a"], ["b"], ["s", "a"]):
        got = iter_from_row(pa.OSFile(str(path)), metadata, footer_struct(metadata, 0), 0, columns, 150, 64, 4096)
        assert pa.concat_tables(list(got)).to_pylist() == table.select(columns).slice(150).to_pylist(), columns


class _Tagged(pa.ExtensionType):
    def __init__(self, storage: pa.DataType):
        super().__init__(storage, "tests.tagged")

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage: pa.DataType, serialized: bytes) -> "_Tagged":
        return cls(storage)


def test_columns_after_extension_structs_and_list_views_are_found(tmp_path):
    """Arrow types whose Parquet leaves are not obvious: an extension type stored as a struct
    (two leaves) and a list view of structs (two leaves) come before the projected columns."""
    pair = pa.struct([("a", pa.int64()), ("b", pa.int64())])
    pa.register_extension_type(_Tagged(pair))
    try:
        storage = pa.StructArray.from_arrays([pa.array(np.arange(ROWS)), pa.array(np.arange(ROWS))], ["a", "b"])
        table = pa.table(
            {
                "tagged": pa.ExtensionArray.from_storage(_Tagged(pair), storage),
                "views": pa.array([[{"a": i, "b": i}] for i in range(ROWS)], pa.list_view(pair)),
                "id": np.arange(ROWS),
                "s": [str(i) for i in range(ROWS)],
            }
        )
        path = tmp_path / "f.parquet"
        pq.write_table(table, path, row_group_size=ROWS, **PAGED)
        footer = pq.ParquetFile(path).metadata
        assert leaf_columns(footer, ["s", "id"]) == {"s": 5, "id": 4}
        got = iter_from_row(pa.OSFile(str(path)), footer, footer_struct(footer, 0), 0, ["s", "id"], 150, 64, 4096)
        assert pa.concat_tables(list(got)).to_pylist() == table.select(["s", "id"]).slice(150).to_pylist()
    finally:
        pa.unregister_extension_type("tests.tagged")


def test_arrow_types_that_do_not_account_for_the_leaves_leave_the_file_uncut(tmp_path, monkeypatch):
    path = tmp_path / "f.parquet"
    table = _table().append_column("pair", pa.StructArray.from_arrays([pa.array(range(ROWS)), pa.array(range(ROWS))], ["a", "b"]))
    pq.write_table(table, path, row_group_size=ROWS, **PAGED)
    footer = pq.ParquetFile(path).metadata
    assert leaf_columns(footer, ["id"]) == {"id": 0}
    monkeypatch.setattr(parquet_seek, "leaf_count", lambda kind: 1)  # (a type whose leaves it does not know)
    assert leaf_columns(footer, ["id"]) is None
    assert _rows_from(path, 0, 200, 64) is None
