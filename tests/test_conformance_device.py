"""Delivery options (issue 28) in every combination a user can pass: pin_memory=True with both
worker modes and every output format gives the batches of the plain loader, on a machine with
or without an accelerator (torch's DataLoader ignores pin_memory with a warning without one)."""

from __future__ import annotations

import warnings

import pytest
from datagen import write_dataset

from torch_dataloader_utils import StructuredDataset


def _plain(batch) -> list:
    if hasattr(batch, "num_rows"):  # a pyarrow RecordBatch
        return batch.column("id").to_pylist()
    ids = batch["id"]
    return ids.tolist() if hasattr(ids, "tolist") else list(ids)


@pytest.mark.parametrize("output_format", ["torch", "numpy", "arrow", "dict"])
def test_pin_memory_in_thread_mode_delivers_the_plain_batches(tmp_path, output_format):
    write_dataset(tmp_path, [[30, 20], [25]])
    config = dict(batch_size=8, num_workers=2, chunk_rows=16, worker_mode="thread", output_format=output_format)
    plain = [_plain(b) for b in StructuredDataset.create_dataloader(str(tmp_path), **config)[0]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no accelerator is found" where there is none
        pinned = [_plain(b) for b in StructuredDataset.create_dataloader(str(tmp_path), pin_memory=True, **config)[0]]
    assert pinned == plain and sorted(i for b in plain for i in b) == list(range(75))
