"""Shuffle quality, determinism and exact resume with the shuffle buffer on (real DataLoader workers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from datagen import write_dataset
from resume_helpers import assert_exactly_once, batch_key, make, resume, run_epoch

from torch_dataloader_utils import CheckpointMismatchError
from torch_dataloader_utils.testing import assert_resumes_exactly

# 48 files x 4 row groups of 64 rows: file of row i is i // 256; each of 2 workers owns 24 splits
FILES, GROUPS, GROUP_ROWS = 48, 4, 64
FILE_ROWS = GROUPS * GROUP_ROWS
ROWS = FILES * FILE_ROWS
BATCH = 128
# a window of 2048 rows holds 32 row groups (from ~19 files); a worker's 6144 rows make 3 windows
CONFIG = dict(batch_size=BATCH, num_workers=2, shuffle=True, shuffle_seed=3, shuffle_buffer_rows=2048, chunk_rows=512)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("shuffle")
    write_dataset(root, [[GROUP_ROWS] * GROUPS] * FILES)
    return str(root)


def ids_of(batches: list[tuple]) -> np.ndarray:
    return np.array([i for b in batches for i in b], dtype=np.int64)


def files_per_batch(batches: list[tuple]) -> float:
    """Mean number of distinct source files in a full batch."""
    return float(np.mean([len({i // FILE_ROWS for i in b}) for b in batches if len(b) == BATCH]))


def spearman(ids: np.ndarray) -> float:
    """Rank correlation of output position and original row (ids are 0..N-1, so ranks already)."""
    return float(np.corrcoef(np.arange(len(ids)), ids)[0, 1])


def longest_run(ids: np.ndarray) -> int:
    """Longest stretch of output rows that are consecutive original rows."""
    best = run = 1
    for step in np.diff(ids) == 1:
        run = run + 1 if step else 1
        best = max(best, run)
    return best


_CHILD = """
import json, sys
from torch_dataloader_utils import StructuredDataset
loader, dataset = StructuredDataset.create_dataloader(sys.argv[1], **json.loads(sys.argv[2]))
dataset.set_epoch(int(sys.argv[3]))
print(json.dumps([i for batch in loader for i in batch["id"].tolist()]))
"""


def test_same_order_in_separate_processes(data):
    """Same (seed, epoch, configuration) in two fresh interpreters with different hash seeds."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, data, json.dumps(CONFIG), "1"],
            env={**os.environ, "PYTHONHASHSEED": hash_seed}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for hash_seed in ("1", "2")
    ]
    orders = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        orders.append(json.loads(out))
    loader, dataset = make(data, **CONFIG)
    dataset.set_epoch(1)
    here = ids_of(run_epoch(loader, dataset)).tolist()
    assert orders[0] == orders[1] == here
    assert sorted(here) == list(range(ROWS))


def test_order_changes_across_epochs_and_seeds(data):
    loader, dataset = make(data, **CONFIG)
    orders = {}
    for epoch in range(3):
        dataset.set_epoch(epoch)
        batches = run_epoch(loader, dataset)
        assert_exactly_once(batches, ROWS)
        orders[("seed 3", epoch)] = ids_of(batches)
    other = make(data, **{**CONFIG, "shuffle_seed": 4})
    orders[("seed 4", 0)] = ids_of(run_epoch(*other))
    keys = list(orders)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            # not merely different: most positions hold a different row
            assert np.mean(orders[a] != orders[b]) > 0.9, f"{a} and {b} give nearly the same order"


def test_quality_above_floor_and_grows_with_the_buffer(data):
    batches = run_epoch(*make(data, **CONFIG))
    ids = ids_of(batches)
    # one window mixes ~19 files; split-order-only shuffling gives 1 file per batch
    assert files_per_batch(batches) >= 12
    # 1/sqrt(48 splits) = 0.14; a file-order stream gives 1.0
    assert abs(spearman(ids)) <= 0.15
    # an ideal permutation of 12288 rows has runs of 1-3; whole row groups would give 64
    assert longest_run(ids) <= 4
    # windows of one row group each: rows shuffled only inside a row group, one file per batch
    narrow = run_epoch(*make(data, **{**CONFIG, "shuffle_buffer_rows": GROUP_ROWS}))
    assert_exactly_once(narrow, ROWS)
    assert files_per_batch(narrow) <= 2.5 < files_per_batch(batches)
    # without shuffling every batch is one run of consecutive rows
    plain = run_epoch(*make(data, **{**CONFIG, "shuffle": False}))
    assert longest_run(ids_of(plain)) >= BATCH


def test_resume_inside_and_across_windows(data):
    """Stop after batch k and resume in a fresh loader: the rest equals the uninterrupted run.

    Delivery alternates chunks of 4 batches between the 2 workers and a worker's window
    is 16 batches, so these points fall inside chunks, on chunk ends, inside windows and
    on window ends (k=31: both workers' first windows done), and near the end of the epoch.
    """
    points = [(0, k) for k in (0, 2, 7, 13, 30, 31, 32, 50, -2)]
    full = assert_resumes_exactly(lambda: make(data, **CONFIG), epochs=1, points=points, batch_key=batch_key).batches[0]
    assert_exactly_once(full, ROWS)
    assert len(full) == ROWS // BATCH


def test_interrupted_twice_inside_windows(data):
    loader, dataset = make(data, **CONFIG)
    full = run_epoch(loader, dataset)
    delivered, state = [], None
    for stop in (5, 22):  # both inside a window of each worker
        loader, dataset = make(data, **CONFIG)
        if state is not None:
            dataset.load_state_dict(json.loads(json.dumps(state)))
        for batch in loader:
            delivered.append(batch_key(batch))
            if len(delivered) == stop:
                break
        state = dataset.state_dict()
    delivered += resume(data, state, **CONFIG)
    assert delivered == full
    assert_exactly_once(delivered, ROWS)


def _longest_list(value) -> int:
    if isinstance(value, dict):
        return max([0, *map(_longest_list, value.values())])
    if isinstance(value, list):
        return max([len(value), *map(_longest_list, value)])
    return 0


def test_state_holds_no_buffered_rows(data):
    """Mid-window state: no list longer than the plan's file/split lists, size independent of the buffer."""
    sizes = {}
    for buffer in (GROUP_ROWS, 2048, 1 << 20):  # one row group, the test window, a worker's whole stream
        loader, dataset = make(data, **{**CONFIG, "shuffle_buffer_rows": buffer})
        for k, _ in enumerate(loader):
            if k == 9:  # inside every worker's first window
                break
        state = dataset.state_dict()
        text = json.dumps(state)
        assert _longest_list(state) <= max(FILES, len(dataset.splits))
        sizes[buffer] = len(text)
        # the windows' rows not yet delivered (over 4000 with the larger buffers) would not fit in this
        assert len(text) <= 400 * (FILES + len(dataset.splits)) + 4096
    # only per-split progress entries may differ (more splits in progress with a larger window)
    entries = sum(len(json.dumps(split.to_dict())) + 32 for split in dataset.splits)
    assert max(sizes.values()) - min(sizes.values()) <= entries


def test_resume_with_another_buffer_size_is_refused(data):
    """The buffer size shapes every worker's stream, so a checkpoint cannot carry over to another one."""
    loader, dataset = make(data, **CONFIG)
    for k, _ in enumerate(loader):
        if k == 5:
            break
    state = dataset.state_dict()
    with pytest.raises(CheckpointMismatchError, match="shuffle_buffer_rows"):
        resume(data, state, **{**CONFIG, "shuffle_buffer_rows": 1024})
