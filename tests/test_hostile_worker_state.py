"""Hostile and damaged worker-scope states (what a StatefulDataLoader worker saves): each damage
is refused by the worker that loads it, naming it, and the main process refuses such a state."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from datagen import write_dataset
from resume_helpers import stop_failed_workers
from torchdata.stateful_dataloader import StatefulDataLoader  # installed by .[dev]

from torch_dataloader_utils import CheckpointMismatchError, StructuredDataset

LAYOUT = [[30, 30], [25], [40, 20], [17]]
TWO = dict(batch_size=5, num_workers=2, shuffle=True, shuffle_seed=3, split_bytes=2000, shuffle_buffer_rows=25, chunk_rows=10)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("hostile-worker")
    write_dataset(root, LAYOUT)
    return str(root)


def _worker_states(value: Any, found: list) -> list:
    if isinstance(value, dict):
        if value.get("scope") == "worker":
            found.append(value)
        for item in value.values():
            _worker_states(item, found)
    elif isinstance(value, list):
        for item in value:
            _worker_states(item, found)
    return found


@pytest.fixture(scope="module")
def loader_state(data) -> dict:
    """A genuine StatefulDataLoader state after a few batches: worker states inside."""
    loader = StatefulDataLoader(StructuredDataset(data, **TWO), batch_size=None, num_workers=2)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    del it, loader
    return state


WORKER_DAMAGE = {
    "missing rows_delivered": lambda s: s.pop("rows_delivered"),
    "missing worker": lambda s: s.pop("worker"),
    "rows_delivered str": lambda s: s.update(rows_delivered="15"),
    "rows_delivered negative": lambda s: s.update(rows_delivered=-1),
    "rows_delivered past the end": lambda s: s.update(rows_delivered=10**6),
    "worker out of range": lambda s: s.update(worker=2),
    "another worker's state": lambda s: s.update(worker=0),
    "worker negative": lambda s: s.update(worker=-1),
    "epoch negative": lambda s: s.update(epoch=-1),
    "other files": lambda s: s.update(files_digest="0" * 16),
    "newer format": lambda s: s.update(format_version=99),
    "other seed": lambda s: s.update(_shuffle_seed=4),
}


@pytest.mark.parametrize(
    "damage",
    [*WORKER_DAMAGE.values(), lambda s: s.update(epoch=1, rows_delivered=10**6)],
    ids=[*WORKER_DAMAGE, "past the end in another epoch"],
)
def test_damaged_worker_state_is_refused_by_its_worker(data, loader_state, damage):
    state = copy.deepcopy(loader_state)
    worker_states = _worker_states(state, [])
    assert len(worker_states) == 2
    damage(worker_states[1])
    loader = StatefulDataLoader(StructuredDataset(data, **TWO), batch_size=None, num_workers=2)
    loader.load_state_dict(state)
    with pytest.raises(ValueError) as error:
        for _ in loader:
            pass
    stop_failed_workers(error.value)
    assert "in DataLoader worker process 1" in str(error.value)


def test_worker_state_is_refused_in_the_main_process_and_progress_kept(data, loader_state):
    """Only a worker can load its state: in the main process it would restore one worker's rows and
    deliver the other workers' rows again."""
    loader, dataset = StructuredDataset.create_dataloader(data, **TWO)
    it = iter(loader)
    for _ in range(3):
        next(it)
    before = dataset.state_dict()
    for state in _worker_states(copy.deepcopy(loader_state), []):
        with pytest.raises(CheckpointMismatchError, match="one DataLoader worker's state") as error:
            dataset.load_state_dict(state)
        assert "loader.load_state_dict" in str(error.value)
        assert dataset.state_dict() == before, "a refused worker state changed the progress"
    assert next(it) is not None  # the open pass goes on
    del it  # its workers stop now, not in a later test's garbage collection (5 s per worker)
