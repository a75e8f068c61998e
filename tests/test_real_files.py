"""Files nobody here wrote: a sample of apache/parquet-testing and apache/orc (tests/fixtures/real,
see its README), and one table written by DuckDB, Polars, pandas (pyarrow and fastparquet
engines) and pyarrow with several codecs and options. Each is delivered equal to pyarrow's own
read (nulls="fill": a null compared as its fill), or refused at planning naming the file."""

from __future__ import annotations

import datetime
import decimal
import math
import pathlib

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from pyarrow import orc

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.errors import UnsupportedFileError, WideningError
from torch_dataloader_utils.read.convert import Ragged
from torch_dataloader_utils.read.forms import batch_form
from torch_dataloader_utils.testing import assert_resumes_exactly

pytestmark = pytest.mark.timeout(300)

REAL = pathlib.Path(__file__).parent / "fixtures" / "real"

#: files refused, with a part of the message (every message also names the file)
REFUSED = {
    "encrypt_columns_plaintext_footer.parquet.encrypted": "encrypted Parquet file .*not supported",
    "uniform_encryption.parquet.encrypted": "encrypted Parquet file .*not supported",
    "PARQUET-1481.parquet": "pyarrow cannot read its footer",
    "TestOrcFile.testUnionAndTimestamp.orc": r"column 'union' \(sparse_union",
    "TestOrcFile.testTimestamp.orc": "its root type is not a struct",
    "incorrect_map_schema.parquet": "pyarrow cannot read its footer: Map keys must be annotated as required",
    "clusterfuzz-testcase-5913005913407488.parquet": "its footer gives a row group -25 rows",  # (pyarrow counted -25 rows)
    "clusterfuzz-testcase-parquet-arrow-fuzz-5004902418481152.parquet": "'utf-8' codec can't decode",  # a column name
    # a row group of more column chunks than the schema has columns: pyarrow aborts the process on the odd one
    "clusterfuzz-testcase-minimized-parquet-arrow-fuzz-4914963406389248.parquet": "row group 0 4 column chunks for the 3 columns",
    # a column chunk of another physical type than its column's: pyarrow aborts the process reading its statistics
    "clusterfuzz-testcase-minimized-parquet-arrow-fuzz-5634349073694720.parquet": "chunk of column 'value' in row group 0 the type FIXED_LEN_BYTE_ARRAY, where its schema says BOOLEAN",
    "clusterfuzz-testcase-parquet-arrow-fuzz-5076612654301184.parquet": "chunk of column 'c0' in row group 0 the type INT64, where its schema says INT96",
}
#: files pyarrow reads at planning but not whole: the read error names the file and pyarrow's reason
UNREADABLE = {
    "ARROW-GH-41317.parquet": "expected length 3 but got length 0",
    "large_string_map.brotli.parquet": "Nested data conversions not implemented for chunked array outputs",
}
#: files whose values pyarrow's default read gets wrong: the read raises naming the file and column
WRONG_IN_PYARROW = {"int96_from_spark.parquet": r"column 'a' holds a timestamp that nanoseconds cannot hold"}


def _pyarrow_read(path: pathlib.Path) -> pa.Table:
    return orc.read_table(str(path)) if path.suffix == ".orc" else pq.read_table(str(path))


def _fill(kind: pa.DataType) -> object:
    if pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return math.nan
    return False if pa.types.is_boolean(kind) else 0


def _numbers(array: pa.ChunkedArray) -> list:
    """A number column's values as a batch holds them, from pyarrow's read."""
    kind = array.type
    if pa.types.is_dictionary(kind):
        array, kind = array.cast(kind.value_type), kind.value_type
    if pa.types.is_temporal(kind):
        array = array.cast(pa.int64() if kind.bit_width == 64 else pa.int32())
    values = array.to_pylist()
    if pa.types.is_decimal(kind):
        values = [None if v is None else float(v) for v in values]
    return [_fill(kind) if v is None else v for v in values]


def _expected(array: pa.ChunkedArray) -> list:
    kind = array.type
    form = batch_form(kind)
    if form == "tensor" and pa.types.is_fixed_size_list(kind):
        size, inner = kind.list_size, kind.value_type
        flat = _numbers(pc.list_flatten(array.fill_null(pa.scalar([None] * size, kind)) if array.null_count else array))
        rows = [flat[i * size : (i + 1) * size] for i in range(len(array))]
        return [[_fill(inner)] * size if r is None else r for r in rows] if not pa.types.is_fixed_size_list(inner) else rows
    if form == "tensor":
        return _numbers(array)
    if form == "ragged":
        lengths = pc.fill_null(pc.list_value_length(array), 0).to_pylist()
        flat = _expected(pa.chunked_array([c.flatten() for c in array.chunks], kind.value_type))
        rows, at = [], 0
        for length in lengths:
            rows.append(flat[at : at + length])
            at += length
        return rows
    if pa.types.is_dictionary(kind):
        array = array.cast(kind.value_type)
    return array.to_pylist()


def _leaf(table: pa.Table, name: str) -> pa.ChunkedArray:
    """Batch column ``name`` (``st.a``, ``m.keys``) taken from pyarrow's table by names."""
    if name in table.column_names:
        return table.column(name)
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        top = ".".join(parts[:cut])
        if top in table.column_names:
            array, rest = table.column(top), parts[cut:]
            break
    for step in rest:
        if pa.types.is_map(array.type):
            chunks = [pa.ListArray.from_arrays(pa.array(c.offsets.to_numpy()), c.keys if step == "keys" else c.items, mask=c.is_null()) for c in array.chunks]
            array = pa.chunked_array(chunks)
        else:
            array = pc.struct_field(array, [array.type.get_field_index(step)])
    return array


def _as_python(value: object) -> object:
    if isinstance(value, Ragged):
        return [value.values[value.offsets[i] : value.offsets[i + 1]].tolist() for i in range(len(value.offsets) - 1)]
    return value.tolist() if isinstance(value, torch.Tensor) else value


def _same(a: object, b: object) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, (float, int, decimal.Decimal)) and not isinstance(b, bool):
        return (math.isnan(a) and math.isnan(float(b))) or math.isclose(a, float(b), rel_tol=1e-15)
    return a == b


def assert_equal_to_pyarrow(path: pathlib.Path, **kwargs) -> None:
    loader, dataset = StructuredDataset.create_dataloader(str(path), format=path.suffix.lstrip(".") if path.suffix == ".orc" else "parquet", batch_size=100_000, num_workers=0, nulls="fill", **kwargs)
    batches = list(loader)
    table = _pyarrow_read(path)
    assert sum(len(_as_python(next(iter(b.values())))) for b in batches) == table.num_rows, path.name
    for name in dataset.schema.names:
        got = [row for b in batches for row in _as_python(b[name])]
        want = _expected(_leaf(table, name))
        assert _same(got, want), (path.name, name, got[:5], want[:5])


READABLE = sorted(
    p.name for p in REAL.iterdir() if p.name not in {**REFUSED, **UNREADABLE, **WRONG_IN_PYARROW} and p.suffix not in (".md", ".arrow_file")
)


@pytest.mark.parametrize("name", READABLE)
def test_public_sample_equals_pyarrows_read(name):
    assert_equal_to_pyarrow(REAL / name)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_public_sample_refused_at_planning_naming_the_file(name):
    fmt = "orc" if name.endswith(".orc") else "parquet"
    with pytest.raises((TypeError, ValueError), match=REFUSED[name]) as error:
        StructuredDataset(str(REAL / name), format=fmt, num_workers=0, nulls="fill")
    assert name in str(error.value)


def test_encrypted_file_is_refused_without_aborting_and_not_as_truncated():
    with pytest.raises(UnsupportedFileError) as error:
        StructuredDataset(str(REAL / "encrypt_columns_plaintext_footer.parquet.encrypted"), num_workers=0)
    assert "complete" not in str(error.value)


def test_interval_columns_of_an_arrow_file_are_refused_by_name_and_the_others_read():
    """month_interval / day_time_interval have no Python array in pyarrow: planning counted nulls
    per column through one and refused the whole file as an incomplete footer."""
    path = str(REAL / "generated_interval.arrow_file")
    with pytest.raises(TypeError, match=r"(?s)column 'f5' \(month_interval\).*column 'f6' \(day_time_interval\)"):
        StructuredDataset(path, format="arrow", num_workers=0)
    dataset = StructuredDataset(path, format="arrow", num_workers=0, columns=["f1"], nulls="fill")
    assert len(dataset) == pa.ipc.open_file(path).read_all().num_rows
    # as pyarrow batches (no tensors), every column comes, intervals too: the batch check of each
    # column skips the types pyarrow has no Python array for (it failed with a bare '21')
    loader, _ = StructuredDataset.create_dataloader(path, format="arrow", num_workers=0, output_format="arrow", batch_size=4)
    assert pa.Table.from_batches(list(loader)).equals(pa.ipc.open_file(path).read_all())


@pytest.mark.parametrize("name", sorted(UNREADABLE))
def test_a_short_column_gets_its_real_reason(name):
    loader, _ = StructuredDataset.create_dataloader(str(REAL / name), num_workers=0, nulls="fill")
    with pytest.raises(OSError, match=UNREADABLE[name]) as error:
        list(loader)
    assert name in str(error.value) and "changed after planning" not in str(error.value)


# --------------------------------------------------------------- the writers' corpus
ROWS = 600


def _table() -> pa.Table:
    ids = list(range(ROWS))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "n": pa.array([None if i % 7 == 0 else i for i in ids], pa.int64()),
            "x": pa.array([None if i % 11 == 0 else i / 4 for i in ids], pa.float64()),
            "flag": pa.array([None if i % 13 == 0 else i % 2 == 0 for i in ids]),
            "s": pa.array([None if i % 5 == 0 else f"s{i % 17}" for i in ids]),
            "dec": pa.array([None if i % 9 == 0 else decimal.Decimal(i) / 100 for i in ids], pa.decimal128(10, 2)),
            "ts": pa.array([datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=i) for i in ids], pa.timestamp("us")),
            "day": pa.array([datetime.date(2024, 1, 1) + datetime.timedelta(days=i) for i in ids], pa.date32()),
        }
    )


def _nested(table: pa.Table) -> pa.Table:
    ids = table.column("id").to_pylist()
    lists = pa.array([None if i % 6 == 0 else list(range(i % 4)) for i in ids], pa.list_(pa.int32()))
    structs = pa.array([None if i % 8 == 0 else {"a": i, "b": f"b{i}"} for i in ids], pa.struct([("a", pa.int64()), ("b", pa.string())]))
    return table.append_column("l", lists).append_column("st", structs)


def _write_pyarrow(table: pa.Table, path: pathlib.Path, **options) -> None:
    pq.write_table(_nested(table), path, row_group_size=ROWS // 3, **options)


def _write_duckdb(table: pa.Table, path: pathlib.Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    connection = duckdb.connect()
    connection.register("source", _nested(table))
    connection.execute(f"COPY source TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE {ROWS // 3})")


def _write_polars(table: pa.Table, path: pathlib.Path) -> None:
    polars = pytest.importorskip("polars")
    polars.from_arrow(_nested(table)).write_parquet(path, row_group_size=ROWS // 3)


def _write_pandas(engine: str):
    def write(table: pa.Table, path: pathlib.Path) -> None:
        pytest.importorskip(engine)
        frame = table.drop_columns(["dec", "day"] if engine == "fastparquet" else []).to_pandas()  # (fastparquet writes neither from pandas)
        frame.to_parquet(path, engine=engine, index=False, row_group_offsets=ROWS // 3) if engine == "fastparquet" else frame.to_parquet(path, engine=engine, index=False)

    return write


WRITERS = {
    "duckdb": _write_duckdb,
    "polars": _write_polars,
    "pandas-pyarrow": _write_pandas("pyarrow"),
    "pandas-fastparquet": _write_pandas("fastparquet"),
    "pyarrow-zstd": lambda t, p: _write_pyarrow(t, p, compression="zstd"),
    "pyarrow-gzip": lambda t, p: _write_pyarrow(t, p, compression="gzip"),
    "pyarrow-lz4": lambda t, p: _write_pyarrow(t, p, compression="lz4"),
    "pyarrow-brotli": lambda t, p: _write_pyarrow(t, p, compression="brotli"),
    "pyarrow-v2-pages": lambda t, p: _write_pyarrow(t, p, data_page_version="2.0"),
    "pyarrow-no-dictionary": lambda t, p: _write_pyarrow(t, p, use_dictionary=False),
    "pyarrow-page-index": lambda t, p: _write_pyarrow(t, p, write_page_index=True, data_page_size=512),
    "pyarrow-int96": lambda t, p: _write_pyarrow(t, p, use_deprecated_int96_timestamps=True),
    "orc": lambda t, p: orc.write_table(_nested(t).drop_columns(["dec"]), str(p), stripe_size=4096),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, pathlib.Path]:
    """The table as each writer writes it (a writer whose package is missing is left out)."""
    root = tmp_path_factory.mktemp("writers")
    table = _table()
    files = {}
    for name, write in WRITERS.items():
        path = root / f"{name}.{'orc' if name == 'orc' else 'parquet'}"
        try:
            write(table, path)
        except pytest.skip.Exception:
            continue
        files[name] = path
    return files


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_writers_file_equals_pyarrows_read(written, writer):
    if writer not in written:
        pytest.skip(f"{writer} is not installed")
    assert_equal_to_pyarrow(written[writer])


@pytest.mark.parametrize("writer", ["duckdb", "polars", "pyarrow-page-index", "orc"])
def test_writers_nulls_are_found_at_planning(written, writer):
    if writer not in written:
        pytest.skip(f"{writer} is not installed")
    with pytest.raises(ValueError, match=r"statistics show nulls[\s\S]*column 'n' has 86 null value\(s\)") as error:
        StructuredDataset(str(written[writer]), format=None, num_workers=0)
    assert written[writer].name in str(error.value)


@pytest.mark.parametrize("writer, num_workers", [("duckdb", 2), ("polars", 0), ("pyarrow-page-index", 2)])
def test_resumes_exactly_on_writers_files(written, writer, num_workers):
    if writer not in written:
        pytest.skip(f"{writer} is not installed")

    def make():
        return StructuredDataset.create_dataloader(str(written[writer]), batch_size=64, chunk_rows=128, num_workers=num_workers, nulls="mask", shuffle=True)

    assert_resumes_exactly(make, epochs=1, points=[(0, 1), (0, 4), (0, -2)])


def test_int96_timestamps_outside_nanoseconds_raise_instead_of_wrapping_around():
    """Spark's 9999-12-31 in INT96: pyarrow's default read wraps it into 1816-03-29."""
    name = "int96_from_spark.parquet"
    assert pq.read_table(str(REAL / name)).column("a")[2].as_py().year == 1816  # 9999-12-31, wrapped around
    loader, _ = StructuredDataset.create_dataloader(str(REAL / name), num_workers=0, nulls="fill")
    with pytest.raises(WideningError, match=WRONG_IN_PYARROW[name]) as error:
        list(loader)
    assert name in str(error.value) and "INT96" in str(error.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_int96_timestamps_in_range_are_exact_in_nanoseconds(tmp_path, workers):
    import datetime

    stamps = [datetime.datetime(1700, 1, 1), datetime.datetime(2024, 5, 6, 7, 8, 9, 123456), datetime.datetime(2262, 4, 11)]
    pq.write_table(pa.table({"ts": pa.array(stamps * 40, pa.timestamp("us"))}), tmp_path / "int96.parquet", use_deprecated_int96_timestamps=True)
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), batch_size=7, num_workers=workers, split_rows=30)
    assert dataset.schema.field("ts").type == pa.timestamp("ns")
    got = [value for batch in loader for value in batch["ts"].tolist()]
    assert got == pq.read_table(tmp_path / "int96.parquet").column("ts").cast(pa.int64()).to_pylist()
