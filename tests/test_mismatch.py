"""Every reason a checkpoint cannot be resumed exactly raises CheckpointMismatchError with a diagnosis."""

import json
import os
import shutil

import pytest
from datagen import write_dataset

from torch_dataloader_utils import CheckpointMismatchError, StructuredDataset

LAYOUT = [[30, 30], [25], [40, 20]]
BASE = dict(batch_size=10, num_workers=2, shuffle=True, shuffle_seed=3, split_bytes=2000)


@pytest.fixture()
def data(tmp_path):
    write_dataset(tmp_path / "d", LAYOUT)
    return str(tmp_path / "d")


def _mid_epoch_state(path, **overrides):
    loader, dataset = StructuredDataset.create_dataloader(path, **{**BASE, **overrides})
    it = iter(loader)
    for _ in range(4):
        next(it)
    return json.loads(json.dumps(dataset.state_dict()))


@pytest.mark.parametrize(
    "change, cause",
    [
        (dict(num_workers=3), "num_workers changed: checkpoint=2, current=3"),
        (dict(shuffle_seed=4), "shuffle_seed changed: checkpoint=3, current=4"),
        (dict(shuffle=False), "shuffle changed: checkpoint=True, current=False"),
        (dict(split_bytes=3000), "split_bytes changed: checkpoint=2000, current=3000"),
        (dict(world_size=2, rank=0), "world_size changed: checkpoint=1, current=2"),
        (dict(drop_last=True), "drop_last changed: checkpoint=False, current=True"),
        (dict(batch_size=15), "batch_size changed: checkpoint=10, current=15"),
        (dict(equalize="none"), "equalize changed: checkpoint=pad, current=none"),
    ],
)
def test_configuration_changes(data, change, cause):
    state = _mid_epoch_state(data)
    dataset = StructuredDataset(data, **{**BASE, **change})
    with pytest.raises(CheckpointMismatchError) as error:
        dataset.load_state_dict(state)
    message = str(error.value)
    assert "Checkpoint shard does not match any current split." in message
    assert f"Likely cause: {cause}" in message
    assert "Checkpoint shard:" in message and ".parquet" in message
    if "world_size" in change or "num_workers" in change:  # the topology changed: an elastic resume can continue
        assert "merge every rank's state (torch_dataloader_utils.distributed.merge_states) and load that with elastic=True" in message
    else:
        assert "Reconstruct the dataset with matching parameters or discard this checkpoint." in message


def test_rank_change(data):
    state = _mid_epoch_state(data, world_size=2, rank=0)
    with pytest.raises(CheckpointMismatchError, match="rank changed: checkpoint=0, current=1"):
        StructuredDataset(data, **{**BASE, "world_size": 2, "rank": 1}).load_state_dict(state)


def test_file_added(data, tmp_path):
    state = _mid_epoch_state(data)
    write_dataset(tmp_path / "extra", [[5]], first_id=1000)
    shutil.copy(tmp_path / "extra" / "part-00000.parquet", os.path.join(data, "part-00009.parquet"))
    with pytest.raises(CheckpointMismatchError, match=r"files added since the checkpoint \(1\): .*part-00009.parquet"):
        StructuredDataset(data, **BASE).load_state_dict(state)


def test_file_removed(data):
    state = _mid_epoch_state(data)
    os.remove(os.path.join(data, "part-00001.parquet"))
    with pytest.raises(CheckpointMismatchError, match=r"files removed since the checkpoint \(1\): .*part-00001.parquet"):
        StructuredDataset(data, **BASE).load_state_dict(state)


def test_file_rewritten_with_another_size(data, tmp_path):
    state = _mid_epoch_state(data)
    write_dataset(tmp_path / "other", [[50, 50]])
    shutil.copy(tmp_path / "other" / "part-00000.parquet", os.path.join(data, "part-00002.parquet"))
    with pytest.raises(CheckpointMismatchError, match=r"file rewritten since the checkpoint: .*part-00002.parquet \(size checkpoint="):
        StructuredDataset(data, **BASE).load_state_dict(state)


def test_progress_that_contradicts_the_plan(data):
    state = _mid_epoch_state(data)
    state["completed_shards"][0]["splits"].append({"path": "/elsewhere/x.parquet", "row_offset": None, "row_length": None})
    with pytest.raises(CheckpointMismatchError, match="worker 0's completed or in-progress splits do not match the plan"):
        StructuredDataset(data, **BASE).load_state_dict(state)


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda s: s.pop("epoch"), "missing key 'epoch'"),
        (lambda s: s.pop("format_version"), "written by the upstream torch_dataloader_utils"),
        (lambda s: [s.pop("format_version"), s.pop("completed_shards")], "missing key 'format_version'"),
        (lambda s: s.update(format_version=99), "format_version 99, newer than this library reads"),
        (lambda s: s.update(epoch="3"), "key 'epoch' has the wrong type"),
        (lambda s: s.update(epoch=-1), "'epoch' is negative"),
        (lambda s: s.update(epoch=2**32), "'epoch' is out of range"),
        (lambda s: s["rows_delivered"].__setitem__(0, -5), r"rows_delivered\[0\]' is out of range"),
        (lambda s: s["rows_delivered"].__setitem__(1, 10**9), r"rows_delivered\[1\]' is out of range"),
        (lambda s: s["rows_delivered"].pop(), "one entry per worker"),
        (lambda s: s.update(next_worker=7), "'next_worker' is out of range"),
        (lambda s: s.update(files="nope"), "'files' entry is damaged"),
        (lambda s: s.update(chunk_rows="many"), "'chunk_rows' is damaged"),
        (lambda s: s.update(chunk_rows=0), "'chunk_rows' is damaged"),
    ],
)
def test_damaged_states(data, damage, match):
    state = _mid_epoch_state(data)
    damage(state)
    with pytest.raises(CheckpointMismatchError, match=match):
        StructuredDataset(data, **BASE).load_state_dict(state)


def test_a_damaged_skipped_splits_report_is_ignored(data):
    """skipped_splits is informational: a damaged entry never refuses the state or breaks the load."""
    good = _mid_epoch_state(data)
    state = dict(good, skipped_splits=[{"path": ["x"], "row_offset": 0, "row_length": 1}, "junk", {"path": "/p", "row_offset": "0"}])
    dataset = StructuredDataset(data, **BASE)
    dataset.load_state_dict(state)
    assert dataset.state_dict()["rows_delivered"] == good["rows_delivered"]
    assert dataset.skipped_splits == []


def test_an_upstream_state_is_refused_as_such(data):
    """The state format of the upstream project's "Checkpoint and Resume" page."""
    upstream = {
        "epoch": 3,
        "_num_workers": 8,
        "_shuffle_seed": 42,
        "completed_shards": [{"splits": [{"path": "s3://bucket/part-0001.parquet", "row_offset": 0, "row_length": 250000}]}],
    }
    with pytest.raises(CheckpointMismatchError, match=r"written by the upstream torch_dataloader_utils(.|\n)*Start epoch 3 from its beginning"):
        StructuredDataset(data, **BASE).load_state_dict(upstream)


def test_not_a_dict(data):
    with pytest.raises(CheckpointMismatchError, match="not a dict"):
        StructuredDataset(data, **BASE).load_state_dict([1, 2])


def test_a_failed_load_leaves_progress_untouched(data):
    good = _mid_epoch_state(data)
    dataset = StructuredDataset(data, **BASE)
    dataset.load_state_dict(good)
    bad = dict(good, rows_delivered=[10**9, 0])
    with pytest.raises(CheckpointMismatchError):
        dataset.load_state_dict(bad)
    assert dataset.state_dict()["rows_delivered"] == good["rows_delivered"]


def _ids(batches):
    return [int(i) for batch in batches for i in batch["id"]]


@pytest.mark.parametrize("saved_without_it", [False, True])
def test_another_chunk_rows_warns_and_still_delivers_every_row_once(data, caplog, saved_without_it):
    """chunk_rows sets how the workers' rows interleave, so it is recorded but not checked: another value
    resumes with a warning (saying which value keeps the order), every row still exactly once. A state
    from before it was recorded resumes without a warning."""
    loader, dataset = StructuredDataset.create_dataloader(data, **BASE, chunk_rows=20)
    everything = _ids(loader)
    it = iter(loader)
    before = _ids(next(it) for _ in range(5))
    state = json.loads(json.dumps(dataset.state_dict()))
    assert state["chunk_rows"] == 20
    if saved_without_it:
        del state["chunk_rows"]
    resumed_loader, resumed = StructuredDataset.create_dataloader(data, **BASE, chunk_rows=30)
    with caplog.at_level("WARNING", logger="torch_dataloader_utils.dataset"):
        resumed.load_state_dict(state)
    warnings = [r.getMessage() for r in caplog.records if "chunk_rows" in r.getMessage()]
    assert warnings == ([] if saved_without_it else [warnings[0]])
    if warnings:
        assert "saved with chunk_rows=20" in warnings[0] and "Pass chunk_rows=20 to keep that order" in warnings[0]
    after = _ids(resumed_loader)
    assert sorted(before + after) == sorted(everything), "every row exactly once"
    assert before + after != everything, "another interleaving (else this test shows nothing)"


def test_the_same_chunk_rows_or_one_worker_resumes_without_a_warning(data, caplog):
    for workers, resumed_chunk_rows in ((2, 20), (0, 30)):
        loader, dataset = StructuredDataset.create_dataloader(data, **{**BASE, "num_workers": workers}, chunk_rows=20)
        it = iter(loader)
        before = _ids(next(it) for _ in range(5))
        state = json.loads(json.dumps(dataset.state_dict()))
        resumed_loader, resumed = StructuredDataset.create_dataloader(data, **{**BASE, "num_workers": workers}, chunk_rows=resumed_chunk_rows)
        with caplog.at_level("WARNING", logger="torch_dataloader_utils.dataset"):
            resumed.load_state_dict(state)
        assert not [r for r in caplog.records if "chunk_rows" in r.getMessage()]
        full_loader, _ = StructuredDataset.create_dataloader(data, **{**BASE, "num_workers": workers}, chunk_rows=20)
        assert before + _ids(resumed_loader) == _ids(full_loader), "the uninterrupted run's order"
