"""Recycled buffers for chunks read in the loop's own process (local_buffers.py): a buffer is
reused once every view of its chunk is gone, and never while one is held."""

from __future__ import annotations

import gc
import os

import numpy as np
import pyarrow as pa
import pytest
import torch

from torch_dataloader_utils.read.convert import table_to_joined
from torch_dataloader_utils.runtime.local_buffers import LocalBuffers


def _joined(rows: int, start: int = 0) -> dict:
    return table_to_joined(pa.table({"x": np.arange(start, start + rows), "y": np.ones(rows, dtype=np.float32)}), lambda: "test")


def test_a_buffer_is_reused_once_its_chunks_views_are_gone():
    buffers = LocalBuffers()
    for start in range(0, 5000, 1000):
        columns = buffers.pack(_joined(1000, start))
        assert columns["x"].tolist() == list(range(start, start + 1000))
        assert columns["y"].dtype == torch.float32 and float(columns["y"].sum()) == 1000
        del columns
    assert (buffers.made, buffers.packed) == (1, 5)


def test_a_held_view_is_never_overwritten():
    buffers = LocalBuffers()
    first = buffers.pack(_joined(1000, 0))["x"][10:20]  # a batch's view outlives its chunk's other tensors
    gc.collect()
    second = buffers.pack(_joined(1000, 5000))
    assert first.tolist() == list(range(10, 20))
    assert second["x"][0] == 5000
    assert buffers.made == 2
    del first
    gc.collect()
    buffers.pack(_joined(1000, 9000))
    assert buffers.made == 2  # the first buffer came back when its last view went


def test_delivered_tensors_are_writable_and_their_own():
    buffers = LocalBuffers()
    columns = buffers.pack(_joined(100))
    columns["x"][:] = -1  # a loop may change its batch in place
    assert columns["x"].sum() == -100
    other = buffers.pack(_joined(100))
    assert other["x"].tolist() == list(range(100))


def test_a_buffer_made_for_part_of_a_chunk_is_reused_by_whole_chunks():
    buffers = LocalBuffers()
    buffers.pack(_joined(1000), scale=4.0)
    gc.collect()
    buffers.pack(_joined(4000))
    assert buffers.made == 1
    unscaled = LocalBuffers()
    unscaled.pack(_joined(1000))
    gc.collect()
    unscaled.pack(_joined(4000))
    assert unscaled.made == 2


def test_the_free_buffers_kept_are_bounded_and_the_largest():
    buffers = LocalBuffers(keep=2)
    held = [buffers.pack(_joined(rows)) for rows in (100, 5000, 300, 2000)]
    del held
    gc.collect()
    assert len(buffers._free) == 2
    assert min(len(memory) for memory in buffers._free) >= 2000 * 12


def test_columns_without_tensor_data_are_built_directly():
    buffers = LocalBuffers()
    assert buffers.pack({}) == {}
    assert buffers.made == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_process_gets_its_own_copy_of_a_batch():
    """A process forked from the loop's (a user's own DataLoader workers) changes only its own copy
    of a batch it inherited, and keeps its copy when the parent reuses the buffer."""
    buffers = LocalBuffers()
    kept = buffers.pack(_joined(1000))["x"]
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        kept += 1_000_000
        os.read(read, 1)  # the parent has reused the buffer by now
        os._exit(0 if kept[:3].tolist() == [1_000_000, 1_000_001, 1_000_002] else 1)
    del kept
    gc.collect()
    reused = buffers.pack(_joined(1000, 5000))["x"]
    assert buffers.made == 1 and reused[:3].tolist() == [5000, 5001, 5002]
    os.write(write, b"x")
    assert os.waitpid(child, 0)[1] == 0
