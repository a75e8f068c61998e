"""Arrow IPC files (formats/arrow_ipc.py): record batches are units; exactly once and resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
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


HF_DATASETS = Path(__file__).parent / "fixtures" / "hf-datasets"  # save_to_disk of Hugging Face datasets: stream files


def _stream(path, table: pa.Table, max_rows: int, **options) -> None:
    with pa.ipc.new_stream(str(path), table.schema, options=pa.ipc.IpcWriteOptions(**options)) as writer:
        for batch in table.to_batches(max_chunksize=max_rows):
            writer.write_batch(batch)


@pytest.fixture(scope="module")
def streams(tmp_path_factory) -> str:
    """Streams of pyarrow: lz4-compressed batches with nulls, and batches whose dictionary grows by deltas."""
    root = tmp_path_factory.mktemp("streams")
    _stream(root / "a.arrow", pa.table({"id": np.arange(200), "x": pa.array([None if i % 9 == 0 else i * 0.5 for i in range(200)])}), 30, compression="lz4")
    schema = pa.schema([("id", pa.int64()), ("x", pa.float64()), ("d", pa.dictionary(pa.int32(), pa.string()))])
    with pa.ipc.new_stream(str(root / "b.arrow"), schema, options=pa.ipc.IpcWriteOptions(emit_dictionary_deltas=True)) as writer:
        for k in range(5):  # batch k uses the words 0 .. 3k+2: each batch's dictionary adds 3 words to the one before
            words = pa.array([f"w{j}" for j in range(3 * k + 3)])
            ids = np.arange(200 + 20 * k, 220 + 20 * k)
            writer.write_batch(pa.record_batch([ids, ids * 0.5, pa.DictionaryArray.from_arrays(pa.array(ids % (3 * k + 3), pa.int32()), words)], schema=schema))
    return str(root)


def _by_id(table: pa.Table, column: str) -> dict:
    return dict(zip(table["id"].to_pylist(), table[column].to_pylist()))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_streams_read_every_batch_once_and_resume_at_every_point(streams, workers, shuffle):
    def make():
        return StructuredDataset.create_dataloader(
            streams, format="arrow", num_workers=workers, shuffle=shuffle, batch_size=16, chunk_rows=32, split_bytes=1200,
            shuffle_buffer_rows=64, columns=["id", "x"], nulls="fill",
        )

    dataset = make()[1]
    assert [layout.unit_rows for layout in dataset._catalog.layouts] == [(30,) * 6 + (20,), (20,) * 5] and len(dataset.splits) >= 6
    reference = assert_resumes_exactly(make, epochs=1, batch_key=lambda batch: (ids(batch), tuple(np.nan_to_num(batch["x"].numpy(), nan=-1.0).tolist())))
    got = {i: x for batch in reference.batches[0] for i, x in zip(*batch)}
    expected = {i: (-1.0 if x is None else x) for i, x in _by_id(pa.concat_tables([pa.ipc.open_stream(f"{streams}/{n}.arrow").read_all().select(["id", "x"]) for n in "ab"]), "x").items()}
    assert got == expected


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_with_dictionary_deltas_gives_each_batch_its_words(streams, workers):
    expected = _by_id(pa.ipc.open_stream(f"{streams}/b.arrow").read_all(), "d")
    loader, dataset = StructuredDataset.create_dataloader(
        f"{streams}/b.arrow", format="arrow", num_workers=workers, shuffle=True, batch_size=7, output_format="dict", columns=["id", "d"]
    )
    assert _by_id(pa.Table.from_pylist([row for batch in loader for row in pa.Table.from_pydict(batch).to_pylist()]), "d") == expected
    assert {i: dataset[i - 200]["d"] for i in (200, 259, 299)} == {i: expected[i] for i in (200, 259, 299)}, "random access"


def test_remote_streams_on_s3_read_exactly_once(s3, streams):
    s3.upload(streams, "arrow-streams")
    loader, dataset = StructuredDataset.create_dataloader(
        s3.url("arrow-streams"), format="arrow", num_workers=2, batch_size=64, split_bytes=1200, storage_options=s3.options, output_format="dict"
    )
    rows = [row for batch in loader for row in pa.Table.from_pydict(batch).to_pylist()]
    assert sorted(row["id"] for row in rows) == list(range(300))
    assert _by_id(pa.Table.from_pylist(rows), "d") == {i: d for i, d in _by_id(pa.ipc.open_stream(f"{streams}/b.arrow").read_all(), "d").items()} | {
        i: None for i in range(200)
    }


@pytest.mark.parametrize("workers", [0, 2])
def test_a_hugging_face_save_to_disk_split_is_read_exactly_once_and_resumes(workers):
    """The shards `datasets.DatasetDict.save_to_disk` writes are Arrow IPC streams: read in place,
    every value as `datasets` stored it, resumed at every point."""
    columns = ["id", "label", "vec", "score"]

    def make():
        return StructuredDataset.create_dataloader(
            str(HF_DATASETS / "train"), format="arrow", num_workers=workers, shuffle=True, batch_size=50, chunk_rows=64,
            split_bytes=8000, shuffle_buffer_rows=300, columns=columns,
        )

    dataset = make()[1]
    assert [layout.unit_rows for layout in dataset._catalog.layouts] == [(128,) * 5 + (27,), (128,) * 5 + (27,), (128,) * 5 + (26,)]
    reference = assert_resumes_exactly(make, epochs=1, batch_key=lambda batch: tuple(tuple(batch[c].flatten().tolist()) for c in columns))
    delivered = {}
    for batch in reference.batches[0]:
        for i, label, vec, score in zip(batch[0], batch[1], np.reshape(batch[2], (-1, 4)).tolist(), batch[3]):
            delivered[i] = (label, vec, score)
    assert sorted(delivered) == list(range(2000))
    assert all(delivered[i] == (i % 2, [i, i + 0.5, -i, 1.0], i / 7) for i in range(2000))
    assert dataset.schema.field("vec").type == pa.list_(pa.float32(), 4)


def test_a_hugging_face_split_gives_strings_nulls_and_random_access_as_datasets_stored_them():
    stored = pa.concat_tables(pa.ipc.open_stream(str(path)).read_all() for path in sorted((HF_DATASETS / "train").glob("*.arrow")))
    loader, dataset = StructuredDataset.create_dataloader(str(HF_DATASETS / "train"), format="arrow", num_workers=2, batch_size=100, output_format="dict")
    assert _by_id(pa.Table.from_pylist([row for batch in loader for row in pa.Table.from_pydict(batch).to_pylist()]), "text") == _by_id(stored, "text")
    assert [dataset[i]["text"] for i in (0, 1, 1999)] == [None, "row 1", "row 1999"]
    with pytest.raises(ValueError, match=r"several formats \['arrow', 'jsonl'\].*pass format="):
        StructuredDataset(str(HF_DATASETS), format=None, num_workers=0)  # (datasets' JSON files beside the shards)


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


def test_a_stream_without_its_end_mark_is_read_with_a_warning(tmp_path, caplog):
    """A stream cut between two messages reads like a whole one: the missing end mark is the only sign."""
    _stream(tmp_path / "whole.arrow", pa.table({"id": np.arange(100)}), 10)
    whole = (tmp_path / "whole.arrow").read_bytes()
    (tmp_path / "cut.arrow").write_bytes(whole[:-8])
    assert len(StructuredDataset(str(tmp_path / "whole.arrow"), "arrow", num_workers=0)) == 100 and "end mark" not in caplog.text
    assert len(StructuredDataset(str(tmp_path / "cut.arrow"), "arrow", num_workers=0)) == 100
    assert "cut.arrow: the Arrow IPC stream has no end mark" in caplog.text


def test_a_batch_reads_only_the_dictionary_messages_it_needs():
    """Each batch read every dictionary message before it: a stream with a new dictionary per
    batch (pyarrow writes one when chunks carry different dictionaries) took quadratic time."""
    from torch_dataloader_utils.formats._arrow_stream import DictionaryMessage, needed_dictionaries

    messages = (
        DictionaryMessage(0, 1, id=0, delta=False), DictionaryMessage(1, 2, id=1, delta=False), DictionaryMessage(2, 3, id=0, delta=True),
        DictionaryMessage(3, 4, id=1, delta=False), DictionaryMessage(4, 5, id=0, delta=True), DictionaryMessage(5, 6, id=1, delta=True),
    )  # fmt: skip
    assert [m.start for m in needed_dictionaries(messages, 6)] == [0, 2, 3, 4, 5]  # id 0 from its only replacement, id 1 from its last
    assert [m.start for m in needed_dictionaries(messages, 2)] == [0, 1]
    assert needed_dictionaries(messages, 0) == []


@pytest.mark.parametrize("workers", [0, 2])
def test_streams_with_replaced_and_growing_dictionaries_and_the_old_framing(tmp_path, workers, caplog):
    """A replacement dictionary per batch (concatenated pandas categoricals), and a stream in the
    framing before Arrow 0.15 (its end mark is 4 bytes: no warning for it)."""
    words = [pa.array([f"{k}-{j}" for j in range(4)]) for k in range(30)]
    chunks = [pa.DictionaryArray.from_arrays(pa.array(np.arange(10) % 4, pa.int8()), words[k]) for k in range(30)]
    table = pa.table({"id": np.arange(300), "w": pa.chunked_array(chunks)})
    _stream(tmp_path / "replaced.arrow", table, 10)
    _stream(tmp_path / "legacy.arrow", pa.table({"id": np.arange(300, 330)}), 7, use_legacy_format=True)
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), "arrow", num_workers=workers, shuffle=True, batch_size=16, output_format="dict")
    got = {i: w for batch in loader for i, w in zip(batch["id"], batch["w"])}
    assert got == {**_by_id(table, "w"), **{i: None for i in range(300, 330)}}
    assert [dataset[30 + i]["w"] for i in (0, 155, 299)] == ["0-0", "15-1", "29-1"]  # (legacy.arrow's 30 rows come first)
    assert "end mark" not in caplog.text


def test_a_stream_cut_inside_a_message_and_a_parquet_file_named_arrow_are_named(tmp_path):
    _stream(tmp_path / "whole.arrow", pa.table({"id": np.arange(1000)}), 100)
    whole = (tmp_path / "whole.arrow").read_bytes()
    (tmp_path / "cut.arrow").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"cut\.arrow.*the Arrow IPC stream is cut short or damaged at byte \d+, after \d+ record batches"):
        StructuredDataset(str(tmp_path / "cut.arrow"), "arrow", num_workers=0)
    pq.write_table(pa.table({"id": [1]}), tmp_path / "table.arrow")
    with pytest.raises(ValueError, match=r"table\.arrow: it is a Parquet file, not Arrow IPC: read it with format='parquet'"):
        StructuredDataset(str(tmp_path / "table.arrow"), "arrow", num_workers=0)
    (tmp_path / "notes.arrow").write_text("id,name\n1,a\n")
    with pytest.raises(ValueError, match=r"notes\.arrow: it is neither an Arrow IPC file nor a stream"):
        StructuredDataset(str(tmp_path / "notes.arrow"), "arrow", num_workers=0)


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
