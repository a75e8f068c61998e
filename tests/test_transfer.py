"""Chunks crossing from worker processes through recycled shared buffers (transfer.py):
buffers are reused once the main process has dropped a chunk's batches, and never while
it still holds them."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import torch
from datagen import write_dataset

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.read import chunks as dataset_module
from torch_dataloader_utils.read.convert import table_to_joined
from torch_dataloader_utils.runtime import transfer
from torch_dataloader_utils.runtime.transfer import Release, ReleaseBoard, WorkerPool
from torch_dataloader_utils.testing import assert_resumes_exactly, fingerprint

pytestmark = pytest.mark.skipif(not transfer.SUPPORTED, reason="needs os.memfd_create")

COLUMNS = ["id", "vec", "text"]


def _expected(root) -> list[dict]:
    """The epoch's batches, each copied as it arrives (so buffer reuse cannot change them)."""
    loader, _ = StructuredDataset.create_dataloader(str(root), batch_size=50, columns=COLUMNS, num_workers=2, chunk_rows=200)
    return [{"id": b["id"].clone(), "vec": b["vec"].clone(), "text": list(b["text"])} for b in loader]


def _same(batch: dict, expected: dict) -> bool:
    return torch.equal(batch["id"], expected["id"]) and torch.equal(batch["vec"], expected["vec"]) and batch["text"] == expected["text"]


@pytest.fixture
def data(tmp_path):
    write_dataset(tmp_path, [[500, 700], [900], [300, 300, 300]])
    return tmp_path


def test_buffers_are_recycled_when_batches_are_dropped(data):
    expected = _expected(data)
    loader, _ = StructuredDataset.create_dataloader(str(data), batch_size=50, columns=COLUMNS, num_workers=2, chunk_rows=200)
    for _epoch in range(2):
        for batch, want in zip(loader, expected, strict=True):
            assert _same(batch, want)
            del batch
    board = loader._board
    assert board.received >= 2 * 3000 // 200  # chunks of at most 200 rows
    assert board.recycled >= board.received // 2, (board.received, board.recycled)


@pytest.mark.parametrize("persistent", [True, False])
def test_held_batches_are_never_overwritten(data, persistent):
    """Every batch of two epochs is kept (so no buffer is released) and compared at the end;
    in a third epoch one batch in twelve is kept (chunks are 4 batches) and the rest dropped.
    (Workers that are not persistent start anew each epoch, in files of their own.)"""
    expected = _expected(data)
    loader, _ = StructuredDataset.create_dataloader(
        str(data), batch_size=50, columns=COLUMNS, num_workers=2, chunk_rows=200, persistent_workers=persistent
    )
    held = [list(loader), list(loader)]
    kept = []
    for index, batch in enumerate(loader):
        if index % 12 == 5:
            kept.append((index, batch))
        del batch
        gc.collect()
    for epoch in held:
        assert len(epoch) == len(expected)
        assert all(_same(batch, want) for batch, want in zip(epoch, expected))
    assert all(_same(batch, expected[index]) for index, batch in kept)
    assert loader._board.recycled > 0


def _joined(rows: int) -> dict:
    return table_to_joined(pa.table({"x": np.arange(rows)}), lambda: "test")


def test_workers_decoding_in_batches_smaller_than_a_chunk_deliver_the_same_batches(data, monkeypatch):
    """Workers decode Parquet in WORKER_DECODE_ROWS batches and join them into each chunk's
    shared buffer: batches equal those decoded one batch per chunk, and a resume after any
    batch continues with exactly the rest."""
    config = dict(batch_size=50, columns=COLUMNS, chunk_rows=200)
    assert dataset_module.WORKER_DECODE_ROWS >= 200  # so _expected decodes one batch per chunk
    expected = _expected(data)
    monkeypatch.setattr(dataset_module, "WORKER_DECODE_ROWS", 7)  # forked workers inherit it
    points = [(0, at) for at in (0, 1, 5, len(expected) // 2 + 1, -2)]  # mid-chunk and chunk ends
    # the default batch key compares every column (id, vec, text) by dtype, shape and value
    reference = assert_resumes_exactly(lambda: StructuredDataset.create_dataloader(str(data), num_workers=2, **config), epochs=1, points=points)
    assert reference.batches[0] == [fingerprint(want) for want in expected]


def test_a_release_frees_a_buffer_only_for_the_same_use():
    pool = WorkerPool()
    columns = _joined(1000)
    first = pool.pack(columns, board=-1)
    pool.release((Release(pool.name, first.release.buffer, first.release.use + 1),))  # a future use: ignored
    pool.release((Release("another pool", first.release.buffer, first.release.use),))  # another worker's: ignored
    second = pool.pack(columns, board=-1)
    assert second.release.buffer != first.release.buffer
    pool.release((first.release,))
    third = pool.pack(columns, board=-1)
    assert (third.release.buffer, third.release.use) == (first.release.buffer, 2)
    pool.release((first.release,))  # stale: the buffer is in its second use now
    fourth = pool.pack(columns, board=-1)
    assert fourth.release.buffer not in (first.release.buffer, second.release.buffer)


def test_a_buffer_made_for_part_of_a_chunk_is_reused_by_whole_chunks():
    """A quick first piece (a quarter of a chunk) gets a buffer sized for whole chunks."""
    pool = WorkerPool()
    piece = pool.pack(_joined(1000), board=-1, scale=4.0)
    pool.release((piece.release,))
    whole = pool.pack(_joined(4000), board=-1)
    assert (whole.release.buffer, whole.release.use) == (piece.release.buffer, 2)
    pool.release((whole.release,))
    unscaled = WorkerPool()
    piece = unscaled.pack(_joined(1000), board=-1)
    unscaled.release((piece.release,))
    assert unscaled.pack(_joined(4000), board=-1).release.buffer != piece.release.buffer


def test_the_pool_stays_bounded_when_nothing_is_released():
    pool = WorkerPool()
    packed = [pool.pack(_joined(100 * i + 1), board=-1) for i in range(3 * transfer.MAX_POOLED_BUFFERS)]
    assert len(pool._buffers) == transfer.MAX_POOLED_BUFFERS
    assert len({p.release.buffer for p in packed}) == len(packed)


def test_each_release_rides_on_a_bounded_number_of_tasks():
    board = ReleaseBoard(spread=3)
    release = Release("pool", 0, 1)
    board.post(release)
    assert [board.take() for _ in range(4)] == [(release,)] * 3 + [()]


def test_spawned_workers_recycle_buffers_too(data):
    """Workers started with "spawn" (the dataset pickled to a fresh interpreter) send through
    their own pools, each buffer's descriptor with its first chunk (nothing is inherited); two
    epochs deliver every row exactly once."""
    loader, _ = StructuredDataset.create_dataloader(
        str(data), batch_size=50, columns=["id"], num_workers=2, chunk_rows=200, multiprocessing_context="spawn"
    )
    for _ in range(2):
        assert sorted(int(i) for batch in loader for i in batch["id"]) == list(range(3000))
    assert loader._board.recycled > 0
    assert loader._board.mapped["inherited"] == 0 and loader._board.mapped["sent"] > 0


@pytest.mark.parametrize("persistent", [False, True])
def test_forked_workers_build_buffers_in_files_the_main_process_made(data, persistent):
    """With forked workers no descriptor crosses: every buffer is in a file the main process
    created before the fork. Persistent workers keep one set of files for all passes; other
    workers get new files each pass."""
    expected = _expected(data)
    loader, _ = StructuredDataset.create_dataloader(
        str(data), batch_size=50, columns=COLUMNS, num_workers=2, chunk_rows=200, persistent_workers=persistent
    )
    files = []
    for _ in range(3):
        for batch, want in zip(loader, expected, strict=True):
            assert _same(batch, want)
        files.append(loader._loader.dataset.files)
    assert loader._board.mapped["sent"] == 0
    assert loader._board.mapped["inherited"] >= (2 if persistent else 6)  # a buffer or more per worker and pass
    if persistent:
        assert files[0] is files[2] is not None
    else:
        assert files == [None] * 3  # each pass's own files are held by that pass only


def test_buffers_past_the_inherited_files_send_their_descriptors(data, monkeypatch):
    monkeypatch.setattr(transfer, "INHERITED_BUFFERS", 1)  # one file per worker (read at the fork)
    monkeypatch.setattr(transfer.InheritedFiles.__init__, "__defaults__", (1,))
    expected = _expected(data)
    loader, _ = StructuredDataset.create_dataloader(str(data), batch_size=50, columns=COLUMNS, num_workers=2, chunk_rows=200)
    held = []
    for index, batch in enumerate(loader):  # held batches keep buffers busy: workers need more than one
        assert _same(batch, expected[index])
        held.append(batch)
    assert all(_same(batch, want) for batch, want in zip(held, expected))
    assert loader._board.mapped["inherited"] == 2 and loader._board.mapped["sent"] > 0


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_the_main_process_closes_the_files_it_made_for_workers(data):
    """Files the workers did not use are closed when their pass ends, finished or abandoned:
    the descriptors open in the main process do not grow with the passes. (The mappings of
    the last pass's buffers, each holding a descriptor, are kept until the next pass.)"""
    loader, _ = StructuredDataset.create_dataloader(str(data), batch_size=50, columns=["id"], num_workers=2, chunk_rows=200)

    def cycle() -> None:
        iterator = iter(loader)
        next(iterator)
        del iterator  # abandoned after one batch
        gc.collect()
        assert sum(len(batch["id"]) for batch in loader) == 3000 - 50  # the rest of the epoch
        gc.collect()

    cycle()
    before = _open_descriptors()
    for _ in range(5):
        cycle()
    assert _open_descriptors() <= before + 3  # files left open would add about 8 per cycle


def test_inherited_files_do_not_travel_by_pickle():
    import pickle

    files = transfer.InheritedFiles(workers=2, per_worker=1)
    assert pickle.loads(pickle.dumps(files)) is None
    with pytest.raises(RuntimeError, match="internal error"):
        files.adopt(0)  # only a forked worker adopts its share


def test_without_a_new_buffer_chunks_go_the_plain_way(monkeypatch, caplog):
    """memfd_create failing (out of descriptors or memory) is not an error: the chunk is built
    in the worker's own memory and crosses through torch's queue, with one warning."""

    def refuse(*args, **kwargs):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(transfer.os, "memfd_create", refuse)
    pool = WorkerPool()
    columns = pool.pack(_joined(10), board=-1)
    assert torch.equal(columns["x"], torch.arange(10))
    pool.pack(_joined(20), board=-1)
    assert sum("no shared buffer" in r.message for r in caplog.records) == 1


def test_a_buffer_descriptor_crosses_once_and_retired_buffers_are_announced():
    """The main process maps a buffer when its descriptor first comes and keeps the mapping:
    later chunks in the same buffer carry none, and read the new data through the kept mapping.
    A buffer the pool closes is named in the next chunk, so the main process unmaps it."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    board = ReleaseBoard(spread=1)
    pool = WorkerPool()
    first = pool.pack(_joined(1000), board=board.id)
    assert first.handle is not None and not isinstance(first.handle, transfer.Inherited) and first.retired == ()  # a sent descriptor
    received = pickle.loads(ForkingPickler.dumps(first))
    assert torch.equal(received["x"], torch.arange(1000))
    del received
    gc.collect()
    pool.release(board.take())
    second = pool.pack(table_to_joined(pa.table({"x": np.arange(1000) * 3}), lambda: "test"), board=board.id)
    assert (second.release.buffer, second.release.use, second.handle) == (first.release.buffer, 2, None)
    assert torch.equal(pickle.loads(ForkingPickler.dumps(second))["x"], torch.arange(1000) * 3)
    held = [pool.pack(_joined(5000 + i), board=board.id) for i in range(transfer.MAX_POOLED_BUFFERS)]
    assert first.release.buffer in held[-1].retired  # the pool was full of held buffers: the oldest closed


def test_a_chunk_in_files_of_a_pass_that_has_ended_is_not_mapped():
    """After its pass ended (files closed), torch's pin-memory thread of an iterator that a kept
    traceback holds may still unpickle a chunk: it becomes empty columns, not an error in that thread."""
    board = ReleaseBoard(spread=1)
    gone = transfer.InheritedFiles(workers=1, per_worker=1)
    handle = transfer.Inherited(gone.id, 0, 0)
    del gone
    gc.collect()
    assert transfer._receive({"x": None}, handle, 4096, 64, Release("pool", 0, 1), board.id, ()) == {}
    assert board.received == 0


def test_a_descriptor_that_cannot_be_shared_sends_the_chunk_the_plain_way(monkeypatch, caplog):
    def refuse(fd):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(transfer, "DupFd", refuse)
    pool = WorkerPool()
    columns = pool.pack(_joined(10), board=-1)
    assert torch.equal(columns["x"], torch.arange(10))
    assert sum("no shared buffer" in r.message for r in caplog.records) == 1


_FEW_DESCRIPTORS = r"""
import resource, sys
from torch_dataloader_utils import StructuredDataset
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
loader, _ = StructuredDataset.create_dataloader(sys.argv[1], batch_size=50, columns=["id"], num_workers=int(sys.argv[3]), chunk_rows=100)
for _ in range(2):
    print(sum(len(batch["id"]) for batch in loader))
"""


@pytest.mark.timeout(120)
def test_files_made_in_advance_leave_descriptors_for_torch(data):
    """Many workers under a tight descriptor limit: torch's pipes for 40 workers fit in 300
    descriptors, 4 files per worker on top would not; the files made in advance shrink to fit."""
    out = subprocess.run([sys.executable, "-c", _FEW_DESCRIPTORS, str(data), "300", "40"], capture_output=True, text=True, timeout=110)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["3000", "3000"]
