"""StructuredDataset: argument checks, and what the DataLoader's pin_memory=True does with a Chunk."""

from __future__ import annotations

import re

import pytest
import torch
from datagen import write_dataset

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.read.chunks import Chunk
from torch_dataloader_utils.read.convert import Ragged, replace_leaves


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
        ("batch_size", 2**31),  # row counts go to Arrow and torch as C integers
        ("chunk_rows", 10**20),
        ("shuffle_buffer_rows", 2**31),
        ("split_bytes", 2**62 + 1),
        ("shuffle", "yes"),  # saved in the state: a resume compares it
        ("drop_last", 2),
        ("download_retry", 1.5),  # (it failed at the first remote read)
        ("download_retry", True),
        ("download_timeout", "5"),
        ("download_timeout", float("nan")),
        ("columns", [1]),
        ("columns", ["id", None]),
        ("format", 5),
        ("fill_values", [1]),
        ("cache_dir", 5),
        ("cache_dir", ""),  # (it wrote a plan cache into the working directory)
    ],
)
def test_an_argument_out_of_range_is_refused_before_any_file_is_looked_at(tmp_path, argument, value):
    """The path does not exist: a check that ran after discovery would raise FileNotFoundError."""
    with pytest.raises(ValueError, match=rf"^{argument} must be .*got {re.escape(repr(value))}"):
        StructuredDataset(str(tmp_path / "missing"), **{argument: value})


@pytest.mark.parametrize("path", [None, 5, [b"a", 5]])
def test_a_path_that_is_no_path_is_named(path):
    with pytest.raises(TypeError, match=r"^path must be a file, directory or glob .*got " + re.escape(repr(path))):
        StructuredDataset(path, num_workers=0)


def test_a_multiprocessing_context_that_is_no_context_is_named(tmp_path):
    write_dataset(tmp_path / "d", [[5]])
    with pytest.raises(ValueError, match=r"^multiprocessing_context must be a start method name .*got 5"):
        StructuredDataset.create_dataloader(str(tmp_path / "d"), num_workers=2, multiprocessing_context=5)
    with pytest.raises(ValueError, match=r"^multiprocessing_context must be a start method name of this platform .*got 'spwan'"):
        StructuredDataset.create_dataloader(str(tmp_path / "no such dir"), num_workers=2, multiprocessing_context="spwan")  # before planning


def test_storage_options_that_are_not_a_dict_are_named(tmp_path):
    write_dataset(tmp_path / "d", [[5]])
    with pytest.raises(TypeError, match=r"storage_options must be a dict of fsspec options .*got str 'anon=true'"):
        StructuredDataset(str(tmp_path / "d"), num_workers=0, storage_options="anon=true")


def test_shuffle_and_drop_last_take_0_and_1_as_older_code_passed_them(tmp_path):
    write_dataset(tmp_path / "d", [[12]])
    dataset = StructuredDataset(str(tmp_path / "d"), num_workers=0, shuffle=1, drop_last=0)
    assert dataset.shuffle is True and dataset.drop_last is False
    assert dataset.state_dict()["_shuffle"] is True


def test_pin_memory_pins_every_tensor_of_a_chunk(tmp_path, monkeypatch):
    """This machine has no accelerator, so Tensor.pin_memory is replaced by a copy that is
    recorded; every tensor of the chunk (list values and offsets, string buffers too) must go
    through it, and the batches must be unchanged."""
    write_dataset(tmp_path, [[30, 20]])
    _, dataset = StructuredDataset.create_dataloader(str(tmp_path), batch_size=10, num_workers=0)
    task = dataset.delivery.begin_pass(keep_slots=False)[0]
    chunk: Chunk = dataset.delivery.reader.read(task)
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


def _ids(loader) -> list[list[int]]:
    return [batch["id"].tolist() for batch in loader]


def test_set_epoch_after_a_resume_warns_only_when_it_drops_the_restored_epoch(tmp_path, caplog):
    write_dataset(tmp_path / "d", [[30], [25]])
    make = lambda: StructuredDataset.create_dataloader(str(tmp_path / "d"), batch_size=5, num_workers=0)  # noqa: E731
    loader, dataset = make()
    dataset.set_epoch(1)
    it = iter(loader)
    next(it), next(it)
    state = dataset.state_dict()
    rest = list(it)

    loader, dataset = make()
    dataset.load_state_dict(state)
    dataset.set_epoch(dataset.epoch)  # the loop of the README, started at dataset.epoch
    assert not [r for r in caplog.records if "set_epoch" in r.message]
    assert _ids(loader) == [b["id"].tolist() for b in rest]

    loader, dataset = make()
    dataset.load_state_dict(state)
    dataset.set_epoch(0)  # a loop started at 0: epoch 1's remaining rows would never come
    (warning,) = [r for r in caplog.records if "set_epoch" in r.message]
    assert "set_epoch(0) drops the progress load_state_dict restored for epoch 1" in warning.message
    assert "range(dataset.epoch, num_epochs)" in warning.message


def test_a_finished_epoch_restored_then_the_next_one_selected_does_not_warn(tmp_path, caplog):
    write_dataset(tmp_path / "d", [[12]])
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path / "d"), batch_size=5, num_workers=0)
    list(loader)
    state = dataset.state_dict()
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path / "d"), batch_size=5, num_workers=0)
    dataset.load_state_dict(state)
    dataset.set_epoch(1)
    assert not caplog.records
    assert sum(len(b) for b in _ids(loader)) == 12


@pytest.mark.parametrize("workers", [0, 2])
def test_a_finished_epoch_restored_and_iterated_without_set_epoch_warns_that_nothing_comes(tmp_path, caplog, workers):
    """The upstream package's resume loop (save "epoch": e + 1 after epoch e, do not call set_epoch
    for the resumed epoch) would otherwise skip epoch e + 1 without a word."""
    write_dataset(tmp_path / "d", [[12]])
    make = lambda: StructuredDataset.create_dataloader(str(tmp_path / "d"), batch_size=5, num_workers=workers)  # noqa: E731
    loader, dataset = make()
    list(loader)
    state = dataset.state_dict()
    loader, dataset = make()
    dataset.load_state_dict(state)
    assert _ids(loader) == []  # the upstream loop's "resumed epoch" 1
    (warning,) = [r for r in caplog.records if "delivers nothing" in r.message]
    assert "restored epoch 0 after its last batch" in warning.message and "call dataset.set_epoch(1) first" in warning.message
    caplog.clear()
    loader, dataset = make()
    dataset.load_state_dict(state)
    for epoch in range(dataset.epoch, 2):  # the README's loop: epoch 0 delivers nothing, then epoch 1
        dataset.set_epoch(epoch)
        assert sum(len(b) for b in _ids(loader)) == (0 if epoch == 0 else 12)
    assert not caplog.records


def test_a_shuffled_epoch_run_again_without_set_epoch_warns_once(tmp_path, caplog):
    write_dataset(tmp_path / "d", [[20], [20]])
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path / "d"), batch_size=5, num_workers=0, shuffle=True)
    first = _ids(loader)
    assert not caplog.records
    assert _ids(loader) == first and _ids(loader) == first  # the same order: the reason for the warning
    (warning,) = caplog.records
    assert "epoch 0 is read again, and with shuffle=True in the previous pass's order exactly" in warning.message
    assert "dataset.set_epoch(epoch) with each new epoch number" in warning.message
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path / "d"), batch_size=5, num_workers=0)
    _ids(loader), _ids(loader)
    assert len(caplog.records) == 1  # unshuffled, a repeat is just a repeat


@pytest.mark.parametrize("equalize", ["none", "drop"])
def test_a_rank_with_nothing_to_deliver_does_not_warn_of_a_repeated_epoch(tmp_path, caplog, equalize):
    write_dataset(tmp_path / "d", [[30]])  # one split for two ranks: rank 1 has no rows
    loader, dataset = StructuredDataset.create_dataloader(
        str(tmp_path / "d"), rank=1, world_size=2, num_workers=0, batch_size=10, shuffle=True, equalize=equalize
    )
    for epoch in range(3):
        dataset.set_epoch(epoch)
        assert _ids(loader) == []
    assert not caplog.records


def test_a_launcher_without_a_process_group_warns_that_every_process_reads_everything(tmp_path, monkeypatch, caplog):
    write_dataset(tmp_path / "d", [[10]])
    monkeypatch.setenv("WORLD_SIZE", "2")
    dataset = StructuredDataset(str(tmp_path / "d"), num_workers=0)
    assert (dataset.rank, dataset.world_size) == (0, 1)
    (warning,) = caplog.records
    assert "WORLD_SIZE=2 is set but torch.distributed is not initialized" in warning.message
    assert "init_process_group" in warning.message
    StructuredDataset(str(tmp_path / "d"), num_workers=0, rank=1, world_size=2)  # explicit: no warning
    monkeypatch.setenv("WORLD_SIZE", "1")
    StructuredDataset(str(tmp_path / "d"), num_workers=0)
    assert len(caplog.records) == 1


@pytest.mark.parametrize("option", ["collate_fn", "sampler", "worker_init_fn", "generator"])
def test_create_dataloader_names_a_dataloader_option_it_sets_itself(tmp_path, option):
    with pytest.raises(TypeError, match=rf"does not take the DataLoader option\(s\) \['{option}'\].*pin_memory"):
        StructuredDataset.create_dataloader(str(tmp_path / "missing"), **{option: None})


@pytest.mark.parametrize(
    "option, value, message",
    [("prefetch_factor", 0, "prefetch_factor must be >= 1"), ("pin_memory", "yes", "pin_memory must be True or False"),
     ("persistent_workers", None, "persistent_workers must be True or False"), ("timeout", -1, "timeout must be a number of seconds >= 0"),
     ("timeout", "30", "timeout must be a number")],
)  # fmt: skip
def test_create_dataloader_checks_the_dataloader_options_before_planning(tmp_path, option, value, message):
    """(torch refuses prefetch_factor=0 only at the first batch, and takes "yes" as pin_memory)"""
    with pytest.raises(ValueError, match=message):
        StructuredDataset.create_dataloader(str(tmp_path / "missing"), num_workers=2, **{option: value})
