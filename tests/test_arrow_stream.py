"""Arrow IPC streams (formats/_arrow_stream.py): planning's message scan, batches read with the
dictionaries they need, exactly once and resume, Hugging Face save_to_disk shards, object stores."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from servers import s3, store_registry  # noqa: F401 - fixtures

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.formats import io as formats_io
from torch_dataloader_utils.formats._arrow_stream import _dictionary_key
from torch_dataloader_utils.testing import assert_resumes_exactly


def ids(batch: dict) -> tuple[int, ...]:
    return tuple(batch["id"].tolist())


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
    with pytest.raises(ValueError, match=r"table\.arrow: it is a Parquet file, not Arrow IPC .*: read it with format='parquet'"):
        StructuredDataset(str(tmp_path / "table.arrow"), "arrow", num_workers=0)
    (tmp_path / "notes.arrow").write_text("id,name\n1,a\n")
    with pytest.raises(ValueError, match=r"notes\.arrow: it is neither an Arrow IPC file nor a stream"):
        StructuredDataset(str(tmp_path / "notes.arrow"), "arrow", num_workers=0)

def test_a_dictionary_messages_id_and_delta_flag_are_read_from_its_flatbuffer(tmp_path):
    """pyarrow writes no field that has its default (id 0, not a delta): both forms are read."""
    schema = pa.schema([("a", pa.dictionary(pa.int32(), pa.string())), ("b", pa.dictionary(pa.int8(), pa.string()))])
    with pa.ipc.new_stream(str(tmp_path / "d.arrow"), schema, options=pa.ipc.IpcWriteOptions(emit_dictionary_deltas=True)) as writer:
        for k in range(2):
            growing = pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int32()), pa.array([f"a{j}" for j in range(k + 2)]))
            replaced = pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int8()), pa.array([f"x{k}", "y"]))
            writer.write_batch(pa.record_batch([growing, replaced], schema=schema))
    messages = pa.ipc.MessageReader.open_stream(pa.memory_map(str(tmp_path / "d.arrow")))
    keys = [_dictionary_key(message.metadata) for message in messages if message.type == "dictionary"]
    assert keys == [(0, False), (1, False), (0, True), (1, False)]


def test_a_remote_stream_is_planned_in_a_few_requests_and_read_holding_one_batch(s3, tmp_path, monkeypatch):
    """Planning fetched each message's pieces on its own (8,006 requests for 2,000 batches), and a
    reader kept every batch it had fetched (a whole file in memory)."""
    from torch_dataloader_utils.formats.arrow_ipc import ARROW

    _stream(tmp_path / "many.arrow", pa.table({"id": np.arange(20_000), "x": np.arange(20_000) * 0.5}), 10)
    s3.upload(str(tmp_path), "many-batches")
    opened = []
    original = formats_io.RangeFile

    class Counted(original):
        def __init__(self, *args):
            opened.append(self)
            super().__init__(*args)

    monkeypatch.setattr(formats_io, "RangeFile", Counted)
    dataset = StructuredDataset(s3.url("many-batches"), format="arrow", num_workers=0, storage_options=s3.options)
    assert len(dataset) == 20_000 and len(dataset._catalog.layouts[0].unit_rows) == 2000
    assert sum(handle.on_demand for handle in opened) <= 3
    catalog = dataset._catalog
    reader = ARROW.open(catalog.fs, catalog.files[0].fs_path, catalog.footers[0], False)
    got = [reader.read_unit(unit, ["id"])["id"].to_pylist() for unit in range(0, 2000, 100)]
    assert got == [list(range(unit * 10, unit * 10 + 10)) for unit in range(0, 2000, 100)]
    assert not reader._reader._source._parts
