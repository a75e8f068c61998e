"""IcebergDataset against an embedded pyiceberg SqlCatalog (SQLite) with a local warehouse, and once
with the warehouse on S3 (moto): exactly once, resume equivalence, the snapshot pinned in the state,
position deletes, row filters, schema evolution and expired snapshots."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pytest

pytest.importorskip("pyiceberg")

from servers import BUCKET, s3, store_registry  # noqa: E402, F401 - fixtures
from table_helpers import add_equality_deletes, add_position_deletes, batch_key, data_files, iceberg_config, iceberg_table, ids_of, rows, run_epoch  # noqa: E402

from torch_dataloader_utils import CheckpointMismatchError, IcebergDataset  # noqa: E402
from torch_dataloader_utils.testing import assert_resumes_exactly  # noqa: E402

CONFIG = dict(batch_size=32, num_workers=2, split_bytes=1, chunk_rows=64, shuffle=True, shuffle_seed=5, shuffle_buffer_rows=150)
DELETED = [3, 50, 51, 99, 100, *range(150, 160)]  # positions in the second data file (rows 400..699)


@pytest.fixture
def table(tmp_path):
    config = iceberg_config(str(tmp_path))
    table = iceberg_table(config)
    for start, stop in ((0, 400), (400, 700), (700, 1000)):
        table.append(rows(start, stop))
    return config, table


def _make(config, **kwargs):
    return lambda: IcebergDataset.create_dataloader(table="db.t", catalog_config=config, **{**CONFIG, **kwargs})


def test_deletes_exactly_once_and_resume_inside_units_with_deletes(table):
    """Two workers, shuffled: every kept row once, deleted rows never, and resuming at points inside
    row groups that have deletes gives the uninterrupted run's batches."""
    config, ice = table
    second = data_files(ice)[1]
    add_position_deletes(ice, second, DELETED)
    reference = assert_resumes_exactly(_make(config), epochs=2, points=[(0, 1), (0, -2), (1, 3)], batch_key=batch_key)
    expected = sorted(set(range(1000)) - {400 + p for p in DELETED})
    for epoch in reference.batches:
        assert sorted(ids_of(epoch)) == expected


def test_resume_inside_a_split_with_deletes_unshuffled_streams(tmp_path):
    """Unshuffled, a row group is decoded in batches from the resume row: the kept row maps to the
    right file row past the deletes (one file of ten row groups, resumed inside the ones with deletes)."""
    config = iceberg_config(str(tmp_path))
    ice = iceberg_table(config)
    ice.append(rows(0, 1000))
    add_position_deletes(ice, data_files(ice)[0], DELETED)
    make = _make(config, shuffle=False, split_bytes=1 << 30, batch_size=10, chunk_rows=20, num_workers=0)
    reference = assert_resumes_exactly(make, epochs=1, points=[(0, 0), (0, 4), (0, 9), (0, 13), (0, 15)], batch_key=batch_key)
    assert ids_of(reference.batches[0]) == sorted(set(range(1000)) - set(DELETED))


def test_resume_after_an_append_reads_the_checkpoint_snapshot(table):
    """A state taken before the table received an append resumes on the old snapshot; the next epoch
    reads the new one, or the old one with pin_snapshot=True."""
    config, ice = table
    loader, dataset = _make(config)()
    states: list = []
    full = run_epoch(loader, dataset, states)
    old = dataset.snapshot
    assert states[5]["table"] == {"format": "iceberg", "name": "db.t", "snapshot": old, "uuid": str(ice.metadata.table_uuid), "schema_id": 0}
    ice.append(rows(1000, 1200))
    loader, dataset = _make(config)()
    assert dataset.snapshot != old and len(dataset) == 1200
    dataset.load_state_dict(states[5])
    assert dataset.snapshot == old
    assert run_epoch(loader, dataset) == full[6:]
    dataset.set_epoch(1)
    assert dataset.snapshot != old
    assert sorted(ids_of(run_epoch(loader, dataset))) == list(range(1200))
    loader, pinned = _make(config, pin_snapshot=True)()
    pinned.load_state_dict(states[5])
    run_epoch(loader, pinned)
    pinned.set_epoch(1)
    assert pinned.snapshot == old and sorted(ids_of(run_epoch(loader, pinned))) == list(range(1000))


def test_time_travel_by_snapshot_id(table):
    config, ice = table
    first = ice.snapshots()[0].snapshot_id
    loader, dataset = _make(config, snapshot_id=first)()
    assert sorted(ids_of(run_epoch(loader, dataset))) == list(range(400))
    ice.append(rows(1000, 1100))
    dataset.set_epoch(1)  # a given snapshot is pinned
    assert dataset.snapshot == first and len(dataset) == 400
    states: list = []
    run_epoch(loader, dataset, states)
    second = ice.snapshots()[1].snapshot_id
    other = IcebergDataset("db.t", config, snapshot_id=second, num_workers=0)
    with pytest.raises(CheckpointMismatchError, match=rf"(?s)taken on iceberg table 'db.t' snapshot {first}, but this dataset reads snapshot_id={second}.*Resume with snapshot_id={first}"):
        other.load_state_dict(states[2])  # it would read the state's snapshot in every epoch
    assert other.snapshot == second
    same = IcebergDataset("db.t", config, snapshot_id=first, **CONFIG)
    same.load_state_dict(states[2])
    assert same.snapshot == first


def test_a_branch_is_read_through_its_snapshot_id(table):
    """A branch's commits are not the table's current snapshot; its head is read by snapshot id,
    and a branch name given as snapshot_id says how."""
    config, ice = table
    ice.manage_snapshots().create_branch(ice.current_snapshot().snapshot_id, "dev").commit()
    ice.append(rows(1000, 1050), branch="dev")
    with pytest.raises(TypeError, match=r"snapshot_id=table.refs\(\)\['dev'\].snapshot_id"):
        IcebergDataset("db.t", config, snapshot_id="dev")
    assert len(IcebergDataset("db.t", config, num_workers=0)) == 1000  # main
    loader, dataset = _make(config, snapshot_id=ice.refs()["dev"].snapshot_id)()
    assert sorted(ids_of(run_epoch(loader, dataset))) == list(range(1050))


def test_schema_evolution_follows_field_ids(table):
    """A column renamed and one added after the first files: old files' values come under the new
    name, the added column is null there; an old snapshot reads its own schema."""
    import pyarrow as pa
    from pyiceberg.types import StringType

    config, ice = table
    before = ice.current_snapshot().snapshot_id
    with ice.update_schema() as update:
        update.rename_column("x", "half")
        update.add_column("extra", StringType())
    new = rows(1000, 1100).rename_columns(["id", "half"])
    new = new.append_column("extra", pa.array([f"e{i}" for i in range(1000, 1100)]))
    ice.append(new)
    loader, dataset = IcebergDataset.create_dataloader("db.t", config, batch_size=100, num_workers=0, columns=["id", "half", "extra"])
    seen = {}
    for batch in loader:
        assert batch["half"].tolist() == [i * 0.5 for i in batch["id"].tolist()]
        for i, extra in zip(batch["id"].tolist(), batch["extra"]):
            seen[i] = extra
    assert sorted(seen) == list(range(1100))
    assert all(seen[i] == f"e{i}" for i in range(1000, 1100)) and all(seen[i] is None for i in range(1000))
    loader, old = IcebergDataset.create_dataloader("db.t", config, batch_size=100, num_workers=0, snapshot_id=before)
    batch = next(iter(loader))
    assert set(batch) == {"id", "x"}


def test_a_schema_change_without_a_new_snapshot_is_read_and_checkpoints_keep_theirs(table):
    """A rename, a drop and an add committed after the last data commit: read with the table's
    current schema (as pyiceberg scans it), the added column as nulls; a state saved before the
    change resumes with the schema it was read with, and the next epoch reads the new one."""
    from pyiceberg.types import LongType, StringType

    config, ice = table
    loader, dataset = _make(config)()
    states: list = []
    full = run_epoch(loader, dataset, states)
    with ice.update_schema() as update:
        update.rename_column("x", "half")
        update.add_column("note", StringType())
    expected = ice.scan().to_arrow()
    assert expected.column_names == ["id", "half", "note"]
    loader, dataset = IcebergDataset.create_dataloader("db.t", config, batch_size=1000, num_workers=0, shuffle=False)
    batch = next(iter(loader))
    assert list(batch) == ["id", "half", "note"] and dataset.table["schema_id"] == 1
    assert batch["half"].tolist() == [i * 0.5 for i in batch["id"].tolist()] and batch["note"] == [None] * 1000
    loader, dataset = _make(config, filters=pc.field("half") < 10, columns=["id", "half"])()
    assert sorted(ids_of(run_epoch(loader, dataset))) == list(range(20))
    loader, dataset = _make(config)()
    dataset.load_state_dict(states[5])  # read with schema 0: "x", not "half"
    assert run_epoch(loader, dataset) == full[6:]
    dataset.set_epoch(1)
    assert set(next(iter(loader))) == {"id", "half", "note"}
    old_form = {**states[5], "table": {k: v for k, v in states[5]["table"].items() if k != "schema_id"}}  # saved by earlier versions
    loader, dataset = _make(config)()
    dataset.load_state_dict(old_form)  # the snapshot's schema, which those versions read with
    assert run_epoch(loader, dataset) == full[6:]
    with ice.update_schema() as update:
        update.delete_column("half")
        update.add_column("count", LongType())
    with pytest.raises(ValueError, match="column 'count'"):  # in no data file: nulls a tensor cannot hold
        IcebergDataset("db.t", config, num_workers=0)
    loader, dataset = IcebergDataset.create_dataloader("db.t", config, batch_size=1000, num_workers=0, nulls="fill")
    batch = next(iter(loader))
    assert list(batch) == ["id", "note", "count"] and batch["count"].tolist() == [0] * 1000


def test_position_deletes_shape_the_plan(table):
    config, ice = table
    add_position_deletes(ice, data_files(ice)[1], DELETED)
    _, dataset = _make(config, shuffle=False)()
    second = [s for s in dataset.splits if s.path.endswith(data_files(ice)[1].rsplit("/", 1)[1])]
    assert [s.row_length for s in second] == [100 - 4, 100 - 1 - 10, 100]  # row groups of 100 rows, counted after the deletes
    assert len(dataset) == 1000 - len(DELETED)


def test_a_missing_position_delete_file_names_the_table(table):
    import glob
    import os

    config, ice = table
    add_position_deletes(ice, data_files(ice)[1], DELETED)
    delete_file = next(task.delete_files for task in ice.scan().plan_files() if task.delete_files).pop().file_path
    os.remove(delete_file.removeprefix("file://"))
    assert not glob.glob(delete_file.removeprefix("file://"))
    with pytest.raises(FileNotFoundError, match=r"a position delete file of Iceberg table 'db.t' snapshot \d+ does not exist"):
        _make(config)()


def test_expired_snapshot_is_a_checkpoint_mismatch(table):
    config, ice = table
    loader, dataset = _make(config, num_workers=0)()
    state = None
    for _ in zip(range(3), loader):
        state = dataset.state_dict()
    old = dataset.snapshot
    ice.append(rows(1000, 1010))
    ice.maintenance.expire_snapshots().by_id(old).commit()
    _, resumed = _make(config, num_workers=0)()
    with pytest.raises(CheckpointMismatchError, match=str(old)):
        resumed.load_state_dict(state)


def test_another_table_is_a_checkpoint_mismatch(table, tmp_path):
    config, ice = table
    other = iceberg_table(config, "db.other")
    other.append(rows(0, 100))
    _, dataset = _make(config, num_workers=0)()
    state = dataset.state_dict()
    _, reader = IcebergDataset.create_dataloader("db.other", config, **{**CONFIG, "num_workers": 0})
    with pytest.raises(CheckpointMismatchError, match="another table"):
        reader.load_state_dict(state)


def test_row_filters_are_exact(table):
    """scan_filter (Iceberg's, file pruning and rows) and filters (pyarrow) drop rows inside files,
    counted at planning: the epoch's length is exact and resumes stay exact."""
    config, ice = table
    make = _make(config, scan_filter="id >= 250", filters=pc.bit_wise_and(pc.field("id"), 1) == 1)
    reference = assert_resumes_exactly(make, epochs=1, points=[(0, 2), (0, -2)], batch_key=batch_key)
    assert sorted(ids_of(reference.batches[0])) == [i for i in range(250, 1000) if i % 2]
    _, dataset = make()
    assert len(dataset) == len([i for i in range(250, 1000) if i % 2])
    assert len(dataset.files) == 3 and len(make()[1].files) == 3
    _, pruned = _make(config, scan_filter="id >= 700")()
    assert len(pruned.files) == 1  # files pruned by their column statistics


def test_equality_deletes_name_the_table_and_say_compact(table):
    config, ice = table
    add_equality_deletes(ice, [1, 2])
    with pytest.raises(ValueError, match=r"(?s)'db.t'.*equality delete.*[Cc]ompact"):
        _make(config)()


def test_missing_extra_names_it(monkeypatch, table):
    import sys

    config, _ = table
    monkeypatch.setitem(sys.modules, "pyiceberg.catalog", None)
    with pytest.raises(ImportError, match=r"torch_dataloader_utils\[iceberg\]"):
        _make(config)()


@pytest.mark.parametrize("prefix", ["s3", "client"])
def test_warehouse_on_s3(s3, tmp_path, prefix):
    """The warehouse on an S3 server (moto): data and delete files read through s3fs with the
    catalog's S3 properties, or the credentials pyiceberg's clients share (``client.*``); the
    resume is exact (workers reading from S3: test_object_stores.py)."""
    endpoint = s3.options["client_kwargs"]["endpoint_url"]
    config = iceberg_config(
        f"s3://{BUCKET}/warehouse-{tmp_path.name}", db_dir=str(tmp_path), **{
            "py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO", "s3.endpoint": endpoint, f"{prefix}.access-key-id": "testing",
            f"{prefix}.secret-access-key": "testing", f"{prefix}.region": "us-west-2",
        },
    )  # fmt: skip
    ice = iceberg_table(config)
    ice.append(rows(0, 300))
    ice.append(rows(300, 500))
    add_position_deletes(ice, data_files(ice)[0], [0, 7, 120], fs=s3.fs)
    reference = assert_resumes_exactly(_make(config, num_workers=0), epochs=1, points=[(0, 4)], batch_key=batch_key)
    ids = ids_of(reference.batches[0])
    assert len(ids) == len(set(ids)) == 497 and set(ids) <= set(range(500))


def test_a_data_file_the_store_does_not_answer_for_is_named(s3, tmp_path):
    """storage_options pointing nowhere for a warehouse on S3: the error names the data file, the
    table and what to check (it was a bare TimeoutError)."""
    from servers import free_port, s3_options

    endpoint = s3.options["client_kwargs"]["endpoint_url"]
    config = iceberg_config(
        f"s3://{BUCKET}/warehouse-{tmp_path.name}", db_dir=str(tmp_path), **{
            "py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO", "s3.endpoint": endpoint, "s3.access-key-id": "testing",
            "s3.secret-access-key": "testing", "s3.region": "us-west-2",
        },
    )  # fmt: skip
    iceberg_table(config).append(rows(0, 10))
    nowhere = s3_options(f"http://127.0.0.1:{free_port()}", client_retries=False)
    with pytest.raises(OSError, match=rf"asking the store for s3://{BUCKET}/warehouse-.*\.parquet, a data file of iceberg table 'db.t' snapshot \d+, failed .*check the endpoint"):
        IcebergDataset("db.t", config, storage_options=nowhere, num_workers=0, download_timeout=2, download_retry=0)


@pytest.mark.parametrize("options", [dict(persistent_workers=True), dict(worker_mode="thread")])
def test_a_live_loader_follows_a_new_snapshot(table, options):
    """Persistent workers and reader threads hold a copy of the plan: after set_epoch took a new
    snapshot, the same loader reads the new one."""
    config, ice = table
    loader, dataset = _make(config, **options)()
    assert len(ids_of(run_epoch(loader, dataset))) == 1000
    ice.append(rows(1000, 1100))
    dataset.set_epoch(1)
    assert sorted(ids_of(run_epoch(loader, dataset))) == list(range(1100))


def test_dataset_pickles_for_stateful_dataloader(table):
    import pickle

    config, _ = table
    _, dataset = _make(config, scan_filter="id > 5", filters=pc.field("id") < 900)()
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy.snapshot == dataset.snapshot and len(copy) == len(dataset) == 894 - 0


def test_stateful_dataloader_resumes_the_checkpoint_snapshot(table):
    """torchdata's StatefulDataLoader hands each worker its state: the worker plans the state's
    snapshot again, so the resume is exact after an append."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    config, ice = table

    def fresh():
        return StatefulDataLoader(IcebergDataset("db.t", config, **CONFIG), batch_size=None, num_workers=2)

    loader = fresh()
    batches, states = [], []
    for batch in loader:
        batches.append(batch_key(batch))
        states.append(json.loads(json.dumps(loader.state_dict())))
    ice.append(rows(1000, 1100))
    resumed = fresh()
    resumed.load_state_dict(states[4])
    assert [batch_key(batch) for batch in resumed] == batches[5:]


def test_global_state_of_two_ranks_resumes_the_snapshot(table):
    """merge_states keeps every rank's table entry; each rank re-plans the snapshot from the global state."""
    from torch_dataloader_utils.distributed import merge_states

    config, ice = table
    ranks = [_make(config, num_workers=0, rank=r, world_size=2)() for r in range(2)]
    full, states = [], []
    for loader, dataset in ranks:
        batches, saved = [], []
        batches = run_epoch(loader, dataset, saved)
        full.append(batches)
        states.append(saved[2])
    merged = merge_states(states)
    ice.append(rows(1000, 1100))
    for rank in range(2):
        loader, dataset = _make(config, num_workers=0, rank=rank, world_size=2)()
        dataset.load_state_dict(merged)
        assert run_epoch(loader, dataset) == full[rank][3:]
    damaged = json.loads(json.dumps(merged))
    damaged["ranks"][1]["table"]["snapshot"] = 1
    with pytest.raises(CheckpointMismatchError, match="different table snapshots"):
        _make(config, num_workers=0, rank=0, world_size=2)()[1].load_state_dict(damaged)


@pytest.mark.parametrize("scan_filter", ["nope >= 3", 42])
def test_a_bad_scan_filter_names_the_argument(table, scan_filter):
    config, _ = table
    with pytest.raises(ValueError, match=r"scan_filter .* is not a pyiceberg expression over the snapshot's columns \['id', 'x'\]"):
        _make(config, scan_filter=scan_filter)()


def test_random_access_numbers_the_rows_the_filters_leave_out(table):
    """scan_filter and filters choose what the loader delivers, not the numbering (as for plain files)."""
    config, _ = table
    _, filtered = _make(config, scan_filter="id >= 700", filters=pc.field("id") < 710, num_workers=0)()
    _, whole = _make(config, num_workers=0)()
    assert len(filtered) == 10 and filtered.num_rows == whole.num_rows == 1000
    picks = [0, 20, 699, -1]
    assert filtered[picks]["id"].tolist() == whole[picks]["id"].tolist()
    assert sorted(filtered[0:1000]["id"].tolist()) == list(range(1000))


def test_locate_numbers_rows_as_the_file_stores_them_deleted_ones_included(table):
    """locate(i) names the row of the data file that dataset[i] reads, counting the rows the
    table deleted, so opening the file at that row shows the same row."""
    import pyarrow.parquet as pq

    config, ice = table
    add_position_deletes(ice, data_files(ice)[1], DELETED)
    for options in ({}, {"scan_filter": "id >= 450"}):
        _, dataset = _make(config, num_workers=0, **options)()
        ids = dataset[0 : dataset.num_rows]["id"].tolist()
        for i in range(dataset.num_rows):
            url, row = dataset.locate(i)
            assert pq.read_table(url.removeprefix("file://"), columns=["id"])["id"][row].as_py() == ids[i], (i, url, row)
