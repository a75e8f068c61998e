"""Arrow IPC files (formats/arrow_ipc.py): record batches are units; exactly once and resume."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pyarrow import feather
from servers import s3, store_registry  # noqa: F401 - fixtures

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.errors import DataReadError
from torch_dataloader_utils.testing import assert_resumes_exactly

ROWS = 500


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("arrow")
    table = pa.table({"id": np.arange(300), "x": np.arange(300) * 0.5, "s": [f"s{i}" for i in range(300)]})
    with pa.ipc.new_file(str(root / "a.arrow"), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=45):
            writer.write_batch(batch)
    feather.write_feather(pa.table({"id": np.arange(300, 420), "x": np.arange(120) * 1.0}), str(root / "b.feather"), chunksize=50, compression="lz4")
    with pa.ipc.new_file(str(root / "c.ipc"), pa.schema([("id", pa.int32())])) as writer:
        writer.write_batch(pa.record_batch({"id": pa.array(np.arange(420, 500), pa.int32())}))
    return str(root)


def ids(batch: dict) -> tuple[int, ...]:
    return tuple(batch["id"].tolist())


def test_batches_are_units_and_formats_inferred(root):
    dataset = StructuredDataset(root, format=None, num_workers=0, columns=["id"])
    assert [layout.unit_rows for layout in dataset._catalog.layouts] == [(45,) * 6 + (30,), (50, 50, 20), (80,)]
    assert dataset._catalog.schema.field("id").type == pa.int64()  # int64 and int32: the schema rule


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_exactly_once_and_resume_at_every_point(root, workers, shuffle):
    def make():
        return StructuredDataset.create_dataloader(
            root, format="arrow", num_workers=workers, shuffle=shuffle, batch_size=32, chunk_rows=64, split_bytes=1500, shuffle_buffer_rows=100, columns=["id"]
        )

    assert len(make()[1].splits) >= 6
    reference = assert_resumes_exactly(make, epochs=1, batch_key=ids)
    assert sorted(i for batch in reference.batches[0] for i in batch) == list(range(ROWS))


@pytest.mark.filterwarnings("ignore")
def test_a_feather_v1_file_is_named(tmp_path):
    feather.write_feather(pa.table({"id": [1, 2]}), str(tmp_path / "old.feather"), version=1)
    with pytest.raises(ValueError, match="old.feather"):
        StructuredDataset(str(tmp_path), format="arrow", num_workers=0)


def test_remote_arrow_files_on_s3_read_exactly_once(s3, root):
    s3.upload(root, "arrow-ipc")
    loader, dataset = StructuredDataset.create_dataloader(
        s3.url("arrow-ipc"), format=None, num_workers=2, batch_size=64, split_bytes=1500, storage_options=s3.options, columns=["id"]
    )
    assert sorted(i for batch in loader for i in ids(batch)) == list(range(ROWS))


def _ipc(path, table: pa.Table) -> None:
    with pa.ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)


@pytest.mark.parametrize("workers", [0, 2])
def test_polars_categorical_and_enum_columns_are_strings(tmp_path, workers):
    """Polars writes Categorical and Enum as dictionary<string_view>: read as strings, alone, next to
    a plain Polars string column and a pandas categorical; dictionary<binary_view> likewise as bytes."""
    pl = pytest.importorskip("polars")
    alone, mixed, parquet = tmp_path / "alone", tmp_path / "mixed", tmp_path / "parquet"
    for directory in (alone, mixed, parquet):
        directory.mkdir()
    pl.DataFrame({"id": [0, 1, 2], "cat": pl.Series(["a", "b", "a"], dtype=pl.Categorical)}).write_ipc(alone / "categorical.arrow")
    pl.DataFrame({"id": [0, 1, 2], "cat": pl.Series(["a", "b", "a"], dtype=pl.Enum(["a", "b"]))}).write_ipc(mixed / "enum.arrow")
    pl.DataFrame({"id": [3, 4], "cat": pl.Series(["c", "b"], dtype=pl.String)}).write_ipc(mixed / "string.arrow")
    feather.write_feather(pa.table({"id": [5], "cat": pa.array(["z"]).dictionary_encode().cast(pa.dictionary(pa.int8(), pa.string()))}), str(mixed / "c.arrow"))
    pl.DataFrame({"id": [0, 1, 2], "cat": pl.Series(["a", "b", "a"], dtype=pl.Categorical)}).write_parquet(parquet / "categorical.parquet")
    assert pa.ipc.open_file(str(alone / "categorical.arrow")).schema.field("cat").type.value_type == pa.string_view()
    for directory, expected in ((alone, ["a", "b", "a"]), (mixed, ["a", "b", "a", "c", "b", "z"]), (parquet, ["a", "b", "a"])):
        for output_format in ("torch", "dict"):
            loader, _ = StructuredDataset.create_dataloader(str(directory), format=None, num_workers=workers, batch_size=2, output_format=output_format)
            by_id = {i: c for batch in loader for i, c in zip(batch["id"], batch["cat"])}
            assert [by_id[i] for i in sorted(by_id)] == expected, (directory.name, output_format)
    views = tmp_path / "views"
    views.mkdir()
    _ipc(views / "dictionary.arrow", pa.table({"id": [0, 1, 2], "b": pa.array([b"x", b"y", b"x"], pa.binary_view()).dictionary_encode()}))
    _ipc(views / "view.arrow", pa.table({"id": [3], "b": pa.array([b"q"], pa.binary_view())}))
    loader, dataset = StructuredDataset.create_dataloader(str(views), format="arrow", num_workers=workers, batch_size=2)
    assert dataset.schema.field("b").type == pa.large_binary()
    assert sorted(b for batch in loader for b in batch["b"]) == [b"q", b"x", b"x", b"y"]


def test_nulls_are_found_at_planning_from_batch_metadata(tmp_path):
    """A nullable number column (as pandas' to_feather and polars' write_ipc make it) is refused
    before the first batch under nulls="raise", naming the column, its null count and the file;
    "fill" reads every row."""
    table = pa.table({"id": np.arange(1000), "x": pa.array([None if i == 990 else float(i) for i in range(1000)])})
    feather.write_feather(table.slice(0, 500), str(tmp_path / "a.feather"), chunksize=100)
    feather.write_feather(table.slice(500), str(tmp_path / "b.feather"), chunksize=100)
    with pytest.raises(ValueError, match=r"(?s)column 'x' has 1 null value\(s\) in .*b\.feather.*nulls='fill'"):
        StructuredDataset.create_dataloader(str(tmp_path), format=None, num_workers=0, batch_size=64)
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), format=None, num_workers=0, batch_size=64, columns=["id"])
    assert sum(len(batch["id"]) for batch in loader) == 1000  # a column without nulls is not refused
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), format=None, num_workers=2, batch_size=64, nulls="fill")
    values = {i: x for batch in loader for i, x in zip(batch["id"].tolist(), batch["x"].tolist())}
    assert len(values) == 1000 and np.isnan(values[990]) and values[991] == 991.0


def _write_batch_with_offsets_out_of_bounds(path) -> None:
    """An IPC file whose second batch's string offsets point past its data (as damage leaves them)."""
    n = 100
    offsets = np.arange(0, 4 * n + 1, 4, dtype=np.int32)
    offsets[50] = 1_000_000
    damaged = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(b"v%03d" % i for i in range(n)))])
    with pa.ipc.new_file(str(path), pa.schema([("id", pa.int64()), ("s", pa.string())])) as writer:
        writer.write_batch(pa.record_batch({"id": pa.array(np.arange(n, 2 * n)), "s": pa.array([f"w{i}" for i in range(n)])}))
        writer.write_batch(pa.record_batch({"id": pa.array(np.arange(n)), "s": damaged}))


@pytest.mark.parametrize("read", ["loader", "random access"])
def test_a_batch_with_damaged_offsets_is_an_error_naming_the_file(tmp_path, read):
    """The loop's process died with SIGSEGV, following the offsets out of the buffers."""
    import subprocess
    import sys

    _write_batch_with_offsets_out_of_bounds(tmp_path / "damaged.arrow")
    script = f"""
from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.errors import DataReadError
from torch_dataloader_utils.errors import DataReadError
loader, dataset = StructuredDataset.create_dataloader({str(tmp_path / "damaged.arrow")!r}, "arrow", num_workers=0, batch_size=30, output_format="dict")
try:
    {"list(loader)" if read == "loader" else "dataset[0:200]"}
except DataReadError as error:
    print(error)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "damaged.arrow" in done.stdout and "unit 1" in done.stdout and "Offset invariant failure" in done.stdout


def test_rows_of_a_batch_stay_those_read_when_the_file_is_rewritten_in_place(tmp_path):
    """A memory-mapped batch changed under the loop: the rest of it came from the new content."""
    path = tmp_path / "a.arrow"
    table = pa.table({"id": np.arange(2000)})
    with pa.ipc.new_file(str(path), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=1000):
            writer.write_batch(batch)
    loader, _ = StructuredDataset.create_dataloader(str(path), "arrow", num_workers=0, batch_size=100, chunk_rows=100)
    delivered = []
    with pytest.raises(DataReadError, match=r"a\.arrow .*unit 1.*the file changed after planning"):
        for number, batch in enumerate(loader):
            delivered += batch["id"].tolist()
            if number == 0:
                with pa.ipc.new_file(str(path), table.schema) as writer:  # the same size, other values
                    for rewritten in pa.table({"id": np.arange(2000) + 10**6}).to_batches(max_chunksize=1000):
                        writer.write_batch(rewritten)
    assert delivered == list(range(1000)), "unit 0 as it was read"


def test_values_that_only_break_their_types_rule_are_read_as_pyarrow_reads_them(tmp_path):
    """Full validation refuses a decimal wider than its precision and a date64 that is no whole
    day (Arrow's integration files hold both); pyarrow reads them, and so does the loader, while a
    damaged offsets buffer next to them is still refused."""
    values = np.array([12810, 5, -99999], dtype=np.int64)
    words = np.zeros(6, dtype=np.int64)
    words[0::2], words[1::2] = values, np.where(values < 0, -1, 0)
    wide = pa.Array.from_buffers(pa.decimal128(3, 2), 3, [None, pa.py_buffer(words.tobytes())])
    partial_day = pa.array(np.array([86_400_000 * 3 + 5, 0, 86_400_000], dtype=np.int64)).view(pa.date64())
    table = pa.table({"id": [0, 1, 2], "dec": wide, "d64": partial_day})
    _ipc(tmp_path / "rules.arrow", table)
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path / "rules.arrow"), "arrow", num_workers=0, batch_size=10, output_format="arrow")
    assert pa.Table.from_batches(list(loader)).equals(table)
    _write_batch_with_offsets_out_of_bounds(tmp_path / "rules.arrow")
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path / "rules.arrow"), "arrow", num_workers=0, batch_size=10, output_format="arrow")
    with pytest.raises(DataReadError, match=r"column 's': .*Offset invariant failure"):
        list(loader)
