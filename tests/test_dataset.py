"""StructuredDataset: argument checks, and what the DataLoader's pin_memory=True does with a Chunk."""

from __future__ import annotations

import re

import pytest
import torch

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.convert import Ragged, replace_leaves
from torch_dataloader_utils.dataset import Chunk

from datagen import write_dataset


@pytest.mark.parametrize(
    "argument, value",
    [
        ("batch_size", 0),
        ("num_workers", -1),
        ("shuffle_seed", -1),
        ("shuffle_buffer_rows", 0),
        ("chunk_rows", 0),
        ("split_bytes", 0),
        ("equalize", "even"),
        ("on_error", "ignore"),
        ("world_size", 1.5),
        ("batch_size", 2.5),
        ("batch_size", "64"),
        ("batch_size", True),
        ("num_workers", 1.5),
        ("chunk_rows", 1e4),
        ("columns", "id"),
        ("columns", []),
    ],
)
def test_an_argument_out_of_range_is_refused_before_any_file_is_looked_at(tmp_path, argument, value):
    """The path does not exist: a check that ran after discovery would raise FileNotFoundError."""
    with pytest.raises(ValueError, match=rf"^{argument} must be .*got {re.escape(repr(value))}"):
        StructuredDataset(str(tmp_path / "missing"), **{argument: value})


def test_pin_memory_pins_every_tensor_of_a_chunk(tmp_path, monkeypatch):
    """This machine has no accelerator, so Tensor.pin_memory is replaced by a copy that is
    recorded; every tensor of the chunk (list values and offsets, string buffers too) must go
    through it, and the batches must be unchanged."""
    write_dataset(tmp_path, [[30, 20]])
    _, dataset = StructuredDataset.create_dataloader(str(tmp_path), batch_size=10, num_workers=0)
    task = dataset.begin_pass(keep_slots=False)[0]
    chunk: Chunk = dataset.read_chunk(task)
    pinned: list[int] = []

    def fake_pin(tensor: torch.Tensor) -> torch.Tensor:
        copy = tensor.clone()
        pinned.append(copy.data_ptr())
        return copy

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    result = chunk.pin_memory()
    leaves: list[torch.Tensor] = []
    for value in result.columns.values():
        replace_leaves(value, torch.Tensor, leaves.append)
    assert len(leaves) == 6  # id, label, x, vec, and the offsets and bytes of text
    assert all(tensor.data_ptr() in pinned for tensor in leaves)
    for (before, _), (after, _) in zip(chunk.batches(10), result.batches(10)):
        for name in before:
            a, b = before[name], after[name]
            same = torch.equal(a, b) if isinstance(a, torch.Tensor) else (all(torch.equal(x, y) for x, y in zip(a, b)) if isinstance(a, Ragged) else a == b)
            assert same, name


@pytest.mark.parametrize("epoch", [-1, 1.5, 2**32, 2**63])
def test_set_epoch_refuses_what_is_not_an_epoch(tmp_path, epoch):
    write_dataset(tmp_path, [[5]], "parquet")
    dataset = StructuredDataset(str(tmp_path), num_workers=0)
    dataset.set_epoch(3)
    with pytest.raises(ValueError, match=r"^epoch must be"):
        dataset.set_epoch(epoch)
    assert dataset.epoch == 3


def test_a_shuffle_seed_beyond_32_bits_is_refused_only_when_shuffling(tmp_path):
    """SeedSequence cuts larger seeds into 32-bit words: (2**32 + 5, epoch 0) would order like (5, epoch 1)."""
    write_dataset(tmp_path, [[5]], "parquet")
    with pytest.raises(ValueError, match=r"^shuffle_seed must be <= 4294967295 \(32 bits\) with shuffle=True, got 4294967296"):
        StructuredDataset(str(tmp_path), num_workers=0, shuffle=True, shuffle_seed=2**32)
    unshuffled = StructuredDataset(str(tmp_path), num_workers=0, shuffle_seed=2**40)  # the seed is never used
    assert [len(batch["id"]) for batch in unshuffled] == [5]
