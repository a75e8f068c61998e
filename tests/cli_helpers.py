"""Running ``tdu`` in the test's process, and the dataset and states the CLI tests share."""

from __future__ import annotations

import json

import pytest
from datagen import write_dataset

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.cli import main


def run(capsys, *argv) -> tuple[int, str, str]:
    """``tdu ARGV...``: its exit code, standard output and standard error."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err

LAYOUT = [[40, 25, 30], [30], [17, 18, 20], [50, 10]]
ROWS = sum(map(sum, LAYOUT))
SPLIT_BYTES = 3000


@pytest.fixture()
def data(tmp_path):
    """The LAYOUT dataset (Parquet, 4 files)."""
    root = tmp_path / "data"
    write_dataset(root, LAYOUT)
    return str(root)


def saved_state(data, path, batches=3, **config):
    """A dataset's state after ``batches`` batches, also written to ``path`` as JSON."""
    config = dict(batch_size=8, num_workers=2, split_bytes=SPLIT_BYTES, **config)
    loader, dataset = StructuredDataset.create_dataloader(data, **config)
    for index, _ in enumerate(loader):
        if index + 1 == batches:
            break
    state = dataset.state_dict()
    with open(path, "w") as file:
        json.dump(state, file)
    return state, dataset
