"""The state's content (completed_shards, in_progress) checked against the rows actually delivered.

state.py builds these entries and validates them with the same function, so here they are
compared with the ids the loop received, read from the files independently.
"""

import collections

import pyarrow.parquet as pq
import pytest
from datagen import write_dataset

from torch_dataloader_utils import StructuredDataset

LAYOUT = [[23, 31, 17], [40, 9], [11, 29, 33, 14]]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("state")
    write_dataset(root, LAYOUT)
    return str(root)


def _split_ids(entry: dict) -> set[int]:
    """The ids of a state entry's split, read from its file."""
    ids = pq.read_table(entry["path"], columns=["id"]).column("id").to_pylist()
    if entry["row_offset"] is None:
        return set(ids)
    return set(ids[entry["row_offset"] : entry["row_offset"] + entry["row_length"]])


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_completed_and_in_progress_splits_match_the_delivered_rows(data, workers, shuffle):
    loader, dataset = StructuredDataset.create_dataloader(
        data, batch_size=13, num_workers=workers, split_bytes=2500, chunk_rows=26, shuffle=shuffle, shuffle_seed=3, shuffle_buffer_rows=50
    )
    assert len(dataset.splits) > 3
    delivered: set[int] = set()
    checked = collections.Counter()
    for batch in loader:
        delivered.update(batch["id"].tolist())
        state = dataset.state_dict()
        listed = set()
        for worker in state["completed_shards"]:
            for entry in worker["splits"]:
                rows = _split_ids(entry)
                assert rows <= delivered, f"{entry} is listed as completed, but rows {sorted(rows - delivered)[:5]} were not delivered"
                listed |= rows
                checked["completed"] += 1
        for worker in state["in_progress"]:
            for entry in worker["splits"]:
                rows = _split_ids(entry)
                assert entry["rows_done"] == len(rows & delivered), f"{entry}: {len(rows & delivered)} of its rows were delivered"
                assert 0 < entry["rows_done"] < len(rows)
                listed |= rows
                checked["in progress"] += 1
        assert delivered <= listed, f"rows {sorted(delivered - listed)[:5]} were delivered from splits the state does not list"
    assert checked["completed"] and checked["in progress"]
