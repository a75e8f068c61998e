"""worker_mode="thread": the num_workers readers run as threads of the loop's process, with the
same plan, order and state as worker processes."""

from __future__ import annotations

import json
import os

import pytest
from datagen import corrupt_data_pages, write_dataset

from torch_dataloader_utils import DataReadError, StructuredDataset
from torch_dataloader_utils.testing import assert_resumes_exactly

CONFIG = dict(batch_size=7, chunk_rows=14, shuffle=True, shuffle_seed=4)


def ids(loader) -> list[list[int]]:
    return [batch["id"].tolist() for batch in loader]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_threads_deliver_what_processes_deliver(tmp_path, workers):
    write_dataset(tmp_path, [[30, 25], [40], [9], [17]])
    processes = ids(StructuredDataset.create_dataloader(str(tmp_path), num_workers=workers, **CONFIG)[0])
    threads = ids(StructuredDataset.create_dataloader(str(tmp_path), num_workers=workers, worker_mode="thread", **CONFIG)[0])
    assert threads == processes


def test_resume_equivalence_in_threads(tmp_path):
    write_dataset(tmp_path, [[20, 13], [17], [8]])
    assert_resumes_exactly(
        lambda: StructuredDataset.create_dataloader(str(tmp_path), num_workers=2, worker_mode="thread", **CONFIG), epochs=2, stride=1
    )


@pytest.mark.parametrize("saved, resumed", [("process", "thread"), ("thread", "process")])
def test_a_state_saved_in_one_mode_resumes_exactly_in_the_other(tmp_path, saved, resumed):
    write_dataset(tmp_path, [[30, 25], [40]])
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), num_workers=2, worker_mode=saved, **CONFIG)
    full = ids(loader)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(dataset.state_dict()))
    other_loader, other = StructuredDataset.create_dataloader(str(tmp_path), num_workers=2, worker_mode=resumed, **CONFIG)
    other.load_state_dict(state)
    assert ids(other_loader) == full[5:]


def test_a_pass_abandoned_mid_way_then_the_rest(tmp_path):
    write_dataset(tmp_path, [[40], [40]])
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), batch_size=5, chunk_rows=10, num_workers=2, worker_mode="thread")
    seen = []
    for i, batch in enumerate(loader):
        seen += batch["id"].tolist()
        if i == 2:
            break
    seen += [i for batch in loader for i in batch["id"].tolist()]
    assert sorted(seen) == list(range(80))


def test_a_read_error_in_a_thread_reaches_the_loop_naming_the_file(tmp_path):
    write_dataset(tmp_path, [[20], [20]])
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), batch_size=5, chunk_rows=10, num_workers=2, worker_mode="thread")
    damaged = tmp_path / "part-00001.parquet"
    planned = os.stat(damaged)
    corrupt_data_pages(damaged)  # after planning, with the planned size and time: only reading finds it
    os.utime(damaged, ns=(planned.st_atime_ns, planned.st_mtime_ns))
    with pytest.raises(DataReadError, match="part-00001"):
        ids(loader)


def test_an_unknown_mode_is_refused(tmp_path):
    write_dataset(tmp_path, [[5]])
    with pytest.raises(ValueError, match="worker_mode must be one of"):
        StructuredDataset.create_dataloader(str(tmp_path), worker_mode="fibers")


def test_threads_free_each_chunk_once_its_batches_are_dropped(tmp_path):
    """The pass keeps no chunk the loop is done with: the readers' buffers are reused, not one
    per chunk of the epoch (which held the whole epoch in memory until the pass ended)."""
    write_dataset(tmp_path, [[400, 300], [500]])
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), batch_size=10, chunk_rows=40, num_workers=2, worker_mode="thread")
    for _epoch in range(2):
        for batch in loader:
            del batch
    buffers = loader._threads._buffers
    assert buffers.packed >= 2 * 1200 // 40
    assert buffers.made <= 12, (buffers.made, buffers.packed)


@pytest.mark.parametrize("workers", [0, 2])
def test_held_batches_are_never_overwritten_by_later_chunks(tmp_path, workers):
    """Batches kept by the loop keep their values while the pass goes on reusing buffers (threads
    and num_workers=0 read into recycled buffers of this process)."""
    write_dataset(tmp_path, [[400, 300], [500]])
    options = dict(batch_size=10, chunk_rows=40, num_workers=workers, columns=["id", "vec", "text"])
    expected = [(b["id"].clone(), b["vec"].clone(), list(b["text"])) for b in StructuredDataset.create_dataloader(str(tmp_path), **options)[0]]
    if workers:
        options["worker_mode"] = "thread"
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), **options)
    kept = [(index, batch) for index, batch in enumerate(loader) if index % 9 == 4]
    assert len(kept) == len(range(4, len(expected), 9))
    for index, batch in kept:
        want_id, want_vec, want_text = expected[index]
        assert batch["id"].equal(want_id) and batch["vec"].equal(want_vec) and batch["text"] == want_text
