"""state/shape.py: a saved state's keys and value types, checked without the data."""

import json

import pytest
from datagen import write_dataset

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.state.shape import StateShapeError, check_state_shape


@pytest.fixture(scope="module")
def rank_state(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    write_dataset(root, [[40, 25, 30], [30], [17, 18, 20]])
    loader, dataset = StructuredDataset.create_dataloader(str(root), batch_size=8, num_workers=2, split_bytes=3000)
    for index, _ in enumerate(loader):
        if index == 2:
            break
    return json.loads(json.dumps(dataset.state_dict()))  # as saved: plain JSON data


@pytest.fixture()
def worker_state(rank_state):
    """What a StatefulDataLoader worker saves: the configuration keys and its own row count."""
    return {**{k: v for k, v in rank_state.items() if k.startswith("_")}, "format_version": 1, "scope": "worker",
            "epoch": 0, "worker": 0, "rows_delivered": 8, "files_digest": "d"}


def test_intact_states_pass(rank_state, worker_state):
    check_state_shape(rank_state)
    check_state_shape(worker_state)
    optional = ("next_worker", "rows_total", "batches_delivered", "files", "completed_shards", "in_progress", "skipped_splits")
    check_state_shape({k: v for k, v in rank_state.items() if k not in optional})  # older states lack these
    check_state_shape({**rank_state, "skipped_splits": [{"path": "a", "row_offset": 0, "row_length": 5, "error": "x"}]})


RANK_DAMAGE = [
    ("rows_delivered", ["x"], "expected a list of row counts"),
    ("rows_delivered", -1, "found -1"),
    ("next_worker", "1", "the index of a worker"),
    ("next_worker", 99, "there are 2 workers, found 99"),
    ("rows_total", "many", "expected a list of row counts"),
    ("rows_total", [10**6], "one total per worker"),
    ("rows_delivered", [10**9, 0], "at most each worker's rows_total"),
    ("files", None, "a list of [path, size, tag] entries, found None"),
    ("files", [], "counts rows but lists no file"),
    ("completed_shards", None, "found None"),
    ("in_progress", None, "found None"),
    ("batches_delivered", True, "a batch count"),
    ("files", {"a": 1}, "a list of [path, size, tag] entries"),
    ("completed_shards", [{"splits": "all"}], "'splits'"),
    ("in_progress", [{"splits": [7]}], "'splits'"),
    ("in_progress", [{"splits": [{"row_offset": 3}]}], "'splits'"),
    ("skipped_splits", [{"rows_done": -2}], "a list of splits"),
    ("epoch", "zz", "an epoch number"),
    ("_world_size", 1.5, "an integer >= 0"),
    ("_shuffle_seed", -1, "an integer >= 0"),
    ("_shuffle", "yes", "true or false"),
    ("_drop_last", 2, "true or false"),
]


@pytest.mark.parametrize("key, value, expected", RANK_DAMAGE)
def test_each_damaged_key_of_a_rank_state_is_named(rank_state, key, value, expected):
    with pytest.raises(StateShapeError) as error:
        check_state_shape({**rank_state, key: value})
    assert error.value.key == key and expected in error.value.detail
    assert str(error.value).startswith(f"state key {key!r} is damaged: ")
    assert isinstance(error.value, ValueError)


@pytest.mark.parametrize("key, value, expected", [("rows_delivered", None, "a row count"), ("epoch", "zz", "an epoch number"),
                                                  ("_num_workers", -3, "an integer >= 0"), ("_shuffle", "no", "true or false")])
def test_each_damaged_key_of_a_worker_state_is_named(worker_state, key, value, expected):
    with pytest.raises(StateShapeError) as error:
        check_state_shape({**worker_state, key: value})
    assert error.value.key == key and expected in error.value.detail


@pytest.mark.parametrize("key", ["rows_delivered", "epoch"])
def test_a_missing_required_key_is_named(rank_state, key):
    with pytest.raises(StateShapeError, match="it is missing") as error:
        check_state_shape({k: v for k, v in rank_state.items() if k != key})
    assert error.value.key == key


def test_a_long_value_is_cut_in_the_detail(rank_state):
    with pytest.raises(StateShapeError) as error:
        check_state_shape({**rank_state, "epoch": "z" * 1000})
    assert len(error.value.detail) < 200
