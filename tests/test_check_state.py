"""StructuredDataset.check_state_dict: load_state_dict's verdict without loading."""

from __future__ import annotations

import json

import pytest
from datagen import write_dataset

from torch_dataloader_utils import CheckpointMismatchError, StructuredDataset


def ids(loader) -> list[list[int]]:
    return [batch["id"].tolist() for batch in loader]


def test_a_fitting_state_passes_and_changes_nothing(tmp_path):
    write_dataset(tmp_path, [[20, 20], [15]])
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), batch_size=5, num_workers=0, shuffle=True, shuffle_seed=3)
    full = ids(loader)
    it = iter(loader)
    next(it), next(it)
    state = json.loads(json.dumps(dataset.state_dict()))
    other_loader, other = StructuredDataset.create_dataloader(str(tmp_path), batch_size=5, num_workers=0, shuffle=True, shuffle_seed=3)
    other.check_state_dict(state)
    assert ids(other_loader) == full, "checking a state must not move the progress"
    other.load_state_dict(state)
    assert ids(other_loader) == full[2:]


def test_a_state_of_another_plan_is_refused_with_the_diagnosis(tmp_path):
    write_dataset(tmp_path, [[20, 20], [15]])
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), batch_size=5, num_workers=0, shuffle=True, shuffle_seed=3)
    next(iter(loader))
    state = dataset.state_dict()
    _, other = StructuredDataset.create_dataloader(str(tmp_path), batch_size=5, num_workers=0, shuffle=True, shuffle_seed=4)
    with pytest.raises(CheckpointMismatchError, match="shuffle_seed changed: checkpoint=3, current=4"):
        other.check_state_dict(state)
    assert other.epoch == 0 and other.state_dict()["rows_delivered"] == [0]


def test_a_worker_state_is_checked_against_its_workers_share(tmp_path):
    write_dataset(tmp_path, [[20, 20], [15]])
    _, dataset = StructuredDataset.create_dataloader(str(tmp_path), batch_size=5, num_workers=2)
    state = {**dataset.state_dict(), "scope": "worker", "worker": 1, "rows_delivered": 10}
    state = {k: v for k, v in state.items() if k in ("format_version", "scope", "epoch", "worker", "rows_delivered") or k.startswith("_")}
    state.update(files_digest=dataset._catalog.files_digest, deal=None)
    dataset.check_state_dict(state)
    with pytest.raises(CheckpointMismatchError, match="out of range"):
        dataset.check_state_dict({**state, "rows_delivered": 10_000})
