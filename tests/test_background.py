"""The loader's background threads are stopped and joined at exit even when the loader that
started them is gone (a reader thread still decoding while the interpreter shuts down can abort
the process)."""

from __future__ import annotations

import threading
import time

from datagen import write_dataset

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.runtime import background


def _slow(batch):
    time.sleep(0.3)
    return batch


def _ours() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("tdu-")]


def test_threads_of_a_dropped_loader_are_joined_at_exit(tmp_path):
    write_dataset(tmp_path, [[400], [400]])
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), batch_size=10, chunk_rows=20, num_workers=2, worker_mode="thread", transform=_slow)
    batches = iter(loader)
    next(batches)
    del loader, dataset, batches  # readers are mid-chunk (in the transform)
    assert _ours()
    background.stop_all(timeout=5.0)
    assert _ours() == []


def test_a_thread_stops_when_asked_at_exit():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="tdu-test", daemon=True)
    background.start(thread, stop)
    background.stop_all(timeout=5.0)
    assert not thread.is_alive()
