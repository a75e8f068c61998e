"""DeltaDataset against local Delta tables written with deltalake: exactly once, resume equivalence,
the version pinned in the state, time travel, partition columns, row filters and deletion vectors."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

pytest.importorskip("deltalake")

from deltalake import DeltaTable, WriterProperties, write_deltalake  # noqa: E402
from servers import BUCKET, s3, store_registry  # noqa: E402, F401 - fixtures
from table_helpers import batch_key, ids_of, rows, run_epoch  # noqa: E402

from torch_dataloader_utils import CheckpointMismatchError, DeltaDataset  # noqa: E402
from torch_dataloader_utils.testing import assert_resumes_exactly  # noqa: E402

GROUPS_OF_64 = WriterProperties(max_row_group_size=64)
CONFIG = dict(batch_size=32, num_workers=2, split_bytes=1, chunk_rows=64, shuffle=True, shuffle_seed=5, shuffle_buffer_rows=150)


def _part(start: int, stop: int) -> pa.Table:
    return rows(start, stop, part=pa.array([f"p{i % 3}" for i in range(start, stop)]))


@pytest.fixture
def table(tmp_path):
    path = str(tmp_path / "delta")
    write_deltalake(path, _part(0, 500), partition_by=["part"], writer_properties=GROUPS_OF_64)
    write_deltalake(path, _part(500, 800), mode="append", partition_by=["part"], writer_properties=GROUPS_OF_64)
    return path


def _make(path, **kwargs):
    return lambda: DeltaDataset.create_dataloader(path=path, **{**CONFIG, **kwargs})


def test_exactly_once_and_resume_with_two_workers(table):
    """Partition values (not stored in the files) come back as a column; resumes are exact."""
    reference = assert_resumes_exactly(_make(table), epochs=2, points=[(0, 7), (1, -2)], batch_key=batch_key)
    for epoch in reference.batches:
        assert sorted(ids_of(epoch)) == list(range(800))
    loader, _ = DeltaDataset.create_dataloader(table, batch_size=100, num_workers=0)
    for batch in loader:
        assert batch["part"] == [f"p{i % 3}" for i in batch["id"].tolist()]


def test_resume_after_an_append_reads_the_checkpoint_version(table):
    loader, dataset = _make(table)()
    states: list = []
    full = run_epoch(loader, dataset, states)
    assert states[3]["table"]["snapshot"] == 1 and states[3]["table"]["format"] == "delta"
    write_deltalake(table, _part(800, 900), mode="append", partition_by=["part"])
    loader, dataset = _make(table)()
    assert dataset.snapshot == 2
    dataset.load_state_dict(states[3])
    assert dataset.snapshot == 1
    assert run_epoch(loader, dataset) == full[4:]
    dataset.set_epoch(1)
    assert dataset.snapshot == 2 and sorted(ids_of(run_epoch(loader, dataset))) == list(range(900))
    loader, pinned = _make(table, pin_version=True)()
    pinned.load_state_dict(states[3])
    pinned.set_epoch(1)
    assert pinned.snapshot == 1 and len(pinned) == 800


def test_time_travel_by_version(table):
    loader, dataset = _make(table, version=0)()
    states: list = []
    assert sorted(ids_of(run_epoch(loader, dataset, states))) == list(range(500))
    dataset.set_epoch(1)
    assert dataset.snapshot == 0
    later = DeltaDataset(table, version=1, **CONFIG)
    with pytest.raises(CheckpointMismatchError, match="taken on delta table .* version 0, but this dataset reads version=1"):
        later.load_state_dict(states[3])


def test_row_filter_is_exact(table):
    make = _make(table, filters=(pc.field("part") == "p1") & (pc.field("id") < 700))
    reference = assert_resumes_exactly(make, epochs=1, points=[(0, 1), (0, -2)], batch_key=batch_key)
    expected = [i for i in range(700) if i % 3 == 1]
    assert sorted(ids_of(reference.batches[0])) == expected
    assert len(make()[1]) == len(expected)


def test_a_version_that_is_gone_is_a_checkpoint_mismatch(table, tmp_path):
    _, dataset = _make(table, num_workers=0)()
    state = dataset.state_dict()
    state["table"]["snapshot"] = 7  # a version this table does not have (as after log clean-up)
    with pytest.raises(CheckpointMismatchError, match="version 7"):
        dataset.load_state_dict(state)


def _state_at_version_0(path, **write) -> dict:
    write_deltalake(str(path), _part(0, 300), **write)
    loader, dataset = DeltaDataset.create_dataloader(str(path), batch_size=100, num_workers=0)
    next(iter(loader))
    return dataset.state_dict()


def test_a_version_whose_files_were_vacuumed_is_a_checkpoint_mismatch(tmp_path):
    state = _state_at_version_0(tmp_path)
    write_deltalake(str(tmp_path), _part(300, 305), mode="overwrite")
    DeltaTable(str(tmp_path)).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    loader, dataset = DeltaDataset.create_dataloader(str(tmp_path), batch_size=100, num_workers=0)
    with pytest.raises(CheckpointMismatchError, match=r"whose data files are gone: .*version 0"):
        dataset.load_state_dict(state)
    assert sorted(ids_of(run_epoch(loader, dataset))) == list(range(300, 305))  # the refused state changed nothing


def test_a_version_whose_log_was_cleaned_up_is_a_checkpoint_mismatch(tmp_path):
    import time

    state = _state_at_version_0(tmp_path, configuration={"delta.logRetentionDuration": "interval 0 seconds"})
    for i in range(3):
        write_deltalake(str(tmp_path), _part(300 + i, 301 + i), mode="append")
    table = DeltaTable(str(tmp_path))
    table.create_checkpoint()
    time.sleep(1.1)
    table.cleanup_metadata()
    _, dataset = DeltaDataset.create_dataloader(str(tmp_path), batch_size=100, num_workers=0)
    with pytest.raises(CheckpointMismatchError, match=r"version 0 of Delta table .* cannot be loaded any more"):
        dataset.load_state_dict(state)


def test_missing_extra_names_it(monkeypatch, table):
    import sys

    monkeypatch.setitem(sys.modules, "deltalake", None)
    with pytest.raises(ImportError, match=r"torch_dataloader_utils\[delta\]"):
        _make(table)()


def test_deletion_vectors_are_applied(tmp_path):
    """A file with a deletion vector: its deleted rows are left out, counted at planning, and a
    resume inside its row groups is exact."""
    from table_helpers import add_deletion_vector

    table = str(tmp_path / "dv")
    write_deltalake(table, rows(0, 300), configuration={"delta.enableDeletionVectors": "true"}, writer_properties=GROUPS_OF_64)
    write_deltalake(table, rows(300, 400), mode="append")
    actions = pa.table(DeltaTable(table).get_add_actions(flatten=True)).to_pylist()
    first = next(a["path"] for a in actions if a["num_records"] == 300)
    deleted = add_deletion_vector(table, first, [0, 3, 4, 70, 130])
    assert len(pa.RecordBatchReader.from_stream(DeltaTable(table).deletion_vectors()).read_all()) == 1
    reference = assert_resumes_exactly(_make(table), epochs=1, points=[(0, 1), (0, 4)], batch_key=batch_key)
    assert sorted(ids_of(reference.batches[0])) == sorted(set(range(400)) - set(deleted))
    assert len(_make(table)()[1]) == 400 - 5


def test_filters_must_be_an_expression_or_the_dnf_list_form(table):
    with pytest.raises(TypeError, match="pyarrow.compute.Expression .* or a non-empty DNF list"):
        _make(table, filters="id > 3")()


def test_a_removed_data_file_is_named(table):
    import os

    first = pa.table(DeltaTable(table).get_add_actions(flatten=True)).column("path").to_pylist()[0]
    os.remove(os.path.join(table, first))
    with pytest.raises(FileNotFoundError, match="a data file of delta table"):
        _make(table)()


def test_table_on_s3(s3, tmp_path):
    """A Delta table on an S3 server (moto): s3fs's storage_options are passed on to deltalake."""
    endpoint = s3.options["client_kwargs"]["endpoint_url"]
    uri = f"s3://{BUCKET}/delta-{tmp_path.name}"
    writer = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-west-2",
              "AWS_ALLOW_HTTP": "true", "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}  # fmt: skip
    write_deltalake(uri, _part(0, 300), partition_by=["part"], storage_options=writer)
    write_deltalake(uri, _part(300, 400), mode="append", partition_by=["part"], storage_options=writer)
    make = _make(uri, storage_options=s3.options, num_workers=0)
    reference = assert_resumes_exactly(make, epochs=1, points=[(0, 3)], batch_key=batch_key)
    assert sorted(ids_of(reference.batches[0])) == list(range(400))
    assert make()[1].snapshot == 1


def test_table_on_azure(store_registry, tmp_path):
    """A Delta table on an Azure server (Azurite): adlfs's connection string is passed on to deltalake
    (account, key and endpoint); deltalake's own option names are refused, as fsspec cannot take them."""
    from servers import AZURE_KEY, get_store

    azure = get_store("azure", store_registry)
    uri = f"az://{BUCKET}/delta-{tmp_path.name}"
    writer = {"AZURE_STORAGE_ACCOUNT_NAME": "devstoreaccount1", "AZURE_STORAGE_ACCOUNT_KEY": AZURE_KEY,
              "AZURE_ENDPOINT": azure.server.endpoint, "AZURE_ALLOW_HTTP": "true"}  # fmt: skip
    write_deltalake(uri, _part(0, 300), partition_by=["part"], storage_options=writer)
    make = _make(uri, storage_options=azure.options, num_workers=2)
    reference = assert_resumes_exactly(make, epochs=1, points=[(0, 3)], batch_key=batch_key)
    assert sorted(ids_of(reference.batches[0])) == list(range(300))
    with pytest.raises(ValueError, match=r"names \['AZURE_ALLOW_HTTP', 'AZURE_ENDPOINT', .*deltalake's option names. Pass fsspec's options"):
        DeltaDataset(uri, storage_options=writer, num_workers=0)


@pytest.mark.parametrize("root, value", [("my table #1", "a b"), ("t", "日本/x=1%")])
def test_percent_encoded_paths_are_read_with_their_deletion_vectors(tmp_path, root, value):
    """Delta writes a table root and partition values with spaces, '/', '%' or non-ASCII
    percent-encoded in its log: every file is found, and a deletion vector on such a file applied."""
    from table_helpers import add_deletion_vector

    table = str(tmp_path / root)
    data = rows(0, 200, region=pa.array([value if i < 100 else "plain" for i in range(200)]))
    write_deltalake(table, data, partition_by=["region"], configuration={"delta.enableDeletionVectors": "true"})
    actions = pa.table(DeltaTable(table).get_add_actions(flatten=True)).to_pylist()
    encoded = next(a["path"] for a in actions if a["partition.region"] == value)
    deleted = add_deletion_vector(table, encoded, [0, 5, 99])
    reference = assert_resumes_exactly(_make(table, num_workers=0), epochs=1, points=[(0, 2)], batch_key=batch_key)
    assert sorted(ids_of(reference.batches[0])) == sorted(set(range(200)) - set(deleted))


def test_a_checkpoint_resumes_after_every_row_was_deleted(table):
    """A version without data files is a table with no rows (not an error), so the job can still
    be created and resume the version its checkpoint read."""
    loader, dataset = _make(table)()
    states: list = []
    full = run_epoch(loader, dataset, states)
    DeltaTable(table).delete()
    loader, dataset = _make(table)()
    assert len(dataset) == 0 and run_epoch(loader, dataset) == []
    dataset.load_state_dict(states[3])
    assert run_epoch(loader, dataset) == full[4:]


def test_random_access_numbers_the_rows_the_filters_leave_out(table):
    """filters= choose what the loader delivers, not the numbering (as for plain files)."""
    DeltaTable(table).delete("id >= 700")
    _, filtered = _make(table, filters=pc.field("id") < 10, num_workers=0)()
    _, whole = _make(table, num_workers=0)()
    assert len(filtered) == 10 and filtered.num_rows == whole.num_rows == 700
    picks = [0, 20, 350, -1]
    assert filtered[picks]["id"].tolist() == whole[picks]["id"].tolist()
    assert filtered.locate(-1) == whole.locate(-1)


def test_a_null_partition_value_is_found_at_planning(tmp_path):
    """nulls="raise" (the default) names the file of the null partition, before any row is read."""
    table = str(tmp_path / "t")
    write_deltalake(table, rows(0, 30, day=pa.array([1, 2, None] * 10, pa.int64())), partition_by=["day"])
    with pytest.raises(ValueError, match=r"statistics show nulls.*\n  column 'day' has 10 null value\(s\) in \S*day=__HIVE_DEFAULT_PARTITION__\S*\n"):
        DeltaDataset(table, num_workers=0)
    assert len(DeltaDataset(table, num_workers=0, nulls="fill")) == 30


def test_filters_read_a_file_delta_rs_rewrote_with_string_views(tmp_path):
    """DeltaTable.delete() rewrites a file storing strings as string_view; dropping rows from it
    failed (pyarrow has no filter kernel for views): every batch raised 'cannot read ...'."""
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array(range(100), pa.int64()), "s": [f"s{i}" for i in range(100)]}))
    DeltaTable(path).delete("id >= 50")
    loader, dataset = DeltaDataset.create_dataloader(path, num_workers=0, batch_size=16, filters=[("id", "<", 10)])
    batches = list(loader)
    assert len(dataset) == 10 and [s for b in batches for s in b["s"]] == [f"s{i}" for i in range(10)]


def test_value_lists_that_pyarrow_prints_alike_are_different_table_filters(table):
    """Two is_in filters that differ only in the middle of a long value list (pyarrow prints the
    first and last 10 values alike) deliver their own rows, and a state of one is refused by the other."""
    import json

    ends = list(range(10)) + list(range(790, 800))
    few = pc.field("id").isin(ends[:10] + list(range(100, 180)) + ends[10:])
    many = pc.field("id").isin(ends[:10] + list(range(100, 600)) + ends[10:])
    loader, first = _make(table, filters=few, num_workers=0)()
    assert sorted(i for batch in loader for i in batch["id"].tolist()) == sorted(set(ends) | set(range(100, 180)))
    _, second = _make(table, filters=many, num_workers=0)()
    assert len(second) == 520
    with pytest.raises(CheckpointMismatchError, match="filters changed"):
        second.load_state_dict(json.loads(json.dumps(first.state_dict())))


def test_gcs_storage_options_reach_deltalake_under_its_names():
    """gcsfs's endpoint and anonymous access, as emulators and public buckets take them, are passed
    on (the files themselves are read through gcsfs with the options as given)."""
    from torch_dataloader_utils.tables.delta import delta_storage_options

    options = delta_storage_options({"endpoint_url": "http://127.0.0.1:9023", "token": "anon"}, "gs://bucket/table")
    assert options == {"GOOGLE_SKIP_SIGNATURE": "true", "GOOGLE_BASE_URL": "http://127.0.0.1:9023", "ALLOW_HTTP": "true"}
    assert delta_storage_options({"token": "/keys/sa.json"}, "gs://bucket/table") == {"GOOGLE_SERVICE_ACCOUNT": "/keys/sa.json"}


@pytest.mark.parametrize(
    "feature, message",
    [
        ("variantShredding-preview", r"requires the reader feature\(s\) \['variantShredding-preview'\]"),  # deltalake opens it, reads it otherwise
        ("catalogOwned", r"deltalake cannot open Delta table '.*t'.*catalogOwned"),
    ],
)
def test_a_reader_feature_the_loader_does_not_implement_is_refused_naming_the_table(tmp_path, feature, message):
    import json

    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": [1, 2, 3]}))
    log = path / "_delta_log" / "00000000000000000000.json"
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    for action in actions:
        if "protocol" in action:
            action["protocol"] = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": [feature], "writerFeatures": [feature]}
    log.write_text("\n".join(json.dumps(action) for action in actions) + "\n")
    with pytest.raises(ValueError, match=message):
        DeltaDataset(str(path), num_workers=0)


def test_timestamps_are_read_as_the_tables_type_whichever_writer_stored_them(tmp_path):
    """Spark stores a Delta timestamp as INT96 (nanoseconds to pyarrow), delta-rs as microseconds
    with UTC: a Spark table that delta-rs appends to is read with the table's type, as deltalake reads it."""
    import pathlib
    import shutil

    path = tmp_path / "t"
    shutil.copytree(pathlib.Path(__file__).parent / "fixtures" / "delta-rs" / "delta-stats-optional", path)
    write_deltalake(str(path), DeltaTable(str(path)).to_pyarrow_table(), mode="append")
    expected = pa.table(DeltaTable(str(path)).to_pyarrow_dataset().to_table(columns=["timestamp"])).column("timestamp")
    loader, dataset = DeltaDataset.create_dataloader(str(path), batch_size=10, num_workers=0, columns=["timestamp"], output_format="arrow")
    assert dataset.schema.field("timestamp").type == pa.timestamp("us", tz="UTC") == expected.type
    (batch,) = list(loader)
    assert sorted(batch.column("timestamp").to_pylist()) == sorted(expected.to_pylist())
    for workers in (0, 2):  # the cast files resume exactly, in worker processes too
        make = lambda workers=workers: DeltaDataset.create_dataloader(str(path), batch_size=1, num_workers=workers, split_bytes=1, shuffle=True, columns=["timestamp"])  # noqa: E731
        assert_resumes_exactly(make, epochs=1, points=[(0, 1), (0, 2)])


def test_int96_timestamps_beyond_nanoseconds_read_exactly_as_the_tables_microseconds():
    """A plain read of these files is refused (nanoseconds cannot hold year 9999); read as the
    table's type they are exact."""
    import datetime
    import pathlib

    path = pathlib.Path(__file__).parent / "fixtures" / "delta-rs" / "table_with_edge_timestamps"
    loader, _ = DeltaDataset.create_dataloader(str(path), batch_size=10, num_workers=0, columns=["BIG_DATE"], output_format="dict")
    values = sorted(value for batch in loader for value in batch["BIG_DATE"])
    utc = datetime.timezone.utc
    assert values == [datetime.datetime(9999, 12, 30, tzinfo=utc), datetime.datetime(9999, 12, 31, tzinfo=utc)]
